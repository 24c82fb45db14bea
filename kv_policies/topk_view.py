"""Top-K's restricted blocks on the fixed-shape forward: the oracle choice made inside the forward.

Top-K chooses each layer's entries from that layer's own exact attention, so, like Quest
(`kv_policies.quest_view`), its choice cannot be read before the forward. `TopKView` is an
`InForwardView` (the regular forward is unchanged, the choice is also made inside it): on the fixed-shape path
(`core.decode_graph`) a `TopKSelector` scores every slot of the allocation against the restricted
rows' queries with fixed shapes (slots from the selectable length on score -inf; pad rows weigh 0)
and keeps the `budget` best per KV head: the entries `TopK.select` keeps. A self-drafting decoder's
fresh tail (`tail_from`) is never offered to the choice and stays visible, as in `RestrictedView`.
"""

from __future__ import annotations

from typing import Any

import torch

from kv_policies.view import InForwardSelector, InForwardView


class TopKView(InForwardView):
    selector_takes_tail = True  # core.decode_graph may take it with a draft tail: the selector stages it

    @property
    def selector_key(self) -> tuple:
        pol = self.policy
        return ("topk", pol.budget, pol.dense_layers)

    def selector(self, static: Any) -> TopKSelector:
        return TopKSelector(static, self.policy)


class TopKSelector(InForwardSelector):
    """Top-K's choice inside a fixed-shape forward of `static` (a `core.decode_graph.StaticForward`)."""

    def __init__(self, static: Any, policy: Any) -> None:
        super().__init__(static, policy)
        self.keep = min(policy.budget, self.capacity)

    def select(
        self, layer: int, q: torch.Tensor, restricted: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor:
        """bool `[n_kv_heads, capacity]`: the slots layer `layer`'s restricted rows see (the chosen
        entries; every slot from the selectable length on, the tail's and the block's, is left to the
        staged visibility)."""
        if layer < self.dense:
            return self.dense_layer(layer, slots)
        cache = self.engine.cache
        hkv = cache.n_kv_heads
        beyond = slots >= self.length
        h, rows, d = q.shape
        g = h // hkv
        keys = cache.k[layer, :, : slots.numel()]
        logits = q.float().reshape(hkv, g * rows, d) @ keys.float().transpose(1, 2) * self.engine.scale
        probs = logits.masked_fill(beyond[None, None, :], float("-inf")).softmax(-1)
        weight = restricted.repeat(g).to(probs.dtype)  # the reshape's row order: head-major, then row
        scores = (probs * weight[None, :, None]).sum(1).masked_fill(beyond[None, :], float("-inf"))
        chosen = torch.zeros(hkv, slots.numel(), dtype=torch.bool, device=slots.device)
        chosen.scatter_(1, scores.topk(self.keep, dim=1).indices, True)
        sel = chosen & ~beyond
        self.reads[layer].copy_(sel.sum() // hkv)
        return sel | beyond
