"""Top-K's restricted blocks on the fixed-shape forward: the oracle choice made inside the forward.

Top-K chooses each layer's entries from that layer's own exact attention, so, like Quest
(`kv_policies.quest_view`), its choice cannot be read before the forward. `TopKView` is `RestrictedView`
(the regular forward is unchanged) that also `selects_in_forward`: on the fixed-shape path
(`core.decode_graph`) a `TopKSelector` scores every slot of the allocation against the restricted
rows' queries with fixed shapes (slots from the selectable length on score -inf; pad rows weigh 0)
and keeps the `budget` best per KV head: the entries `TopK.select` keeps. A self-drafting decoder's
fresh tail (`tail_from`) is never offered to the choice and stays visible, as in `RestrictedView`.
"""

from __future__ import annotations

from typing import Any

import torch

from kv_policies.view import RestrictedView, selectable_length


class TopKView(RestrictedView):
    selects_in_forward = True
    selects_with_tail = True  # core.decode_graph may take it with a draft tail: the selector stages it

    @property
    def selector_key(self) -> tuple:
        pol = self.policy
        return ("topk", pol.budget, pol.dense_layers)

    def selector(self, static: Any) -> TopKSelector:
        return TopKSelector(static, self.policy)

    def take_reads(self, reads: torch.Tensor, cache_len: int) -> None:
        """Every layer's chosen entries per KV head (`[n_layers]`, on the device) from the fixed-shape
        forward, noted as the regular forward notes them (the tail is read by every row)."""
        sel_len = selectable_length(cache_len, self.tail_from)
        self._read = [reads + (cache_len - sel_len)]
        self.policy.activity.note_forward(reads, sel_len)


class TopKSelector:
    """Top-K's choice inside a fixed-shape forward of `static` (a `core.decode_graph.StaticForward`)."""

    def __init__(self, static: Any, policy: Any) -> None:
        eng = static.engine
        cache = eng.cache
        self.engine, self.policy = eng, policy
        self.capacity, self.dense = cache.capacity, policy.dense_layers
        self.keep = min(policy.budget, cache.capacity)
        dev = eng.device
        self.sel_len = torch.zeros(1, dtype=torch.long, device=dev)  # the choice is over [0, sel_len)
        self.reads = torch.zeros(cache.n_layers, dtype=torch.long, device=dev)

    def stage(self, view: Any, n: int, length: int) -> None:
        if self.engine.cache.capacity != self.capacity:
            raise RuntimeError("the cache was reallocated under a Top-K selector")  # StaticForward's key
        self.sel_len.fill_(selectable_length(length, view.tail_from))

    def select(
        self, layer: int, q: torch.Tensor, restricted: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor:
        """bool `[n_kv_heads, capacity]`: the slots layer `layer`'s restricted rows see (the chosen
        entries; every slot from the selectable length on, the tail's and the block's, is left to the
        staged visibility)."""
        cache = self.engine.cache
        hkv = cache.n_kv_heads
        beyond = slots >= self.sel_len
        if layer < self.dense:
            self.reads[layer].copy_(self.sel_len[0])
            return torch.ones(hkv, slots.numel(), dtype=torch.bool, device=slots.device)
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
