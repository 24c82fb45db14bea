"""Top-K attention, the oracle (TriForce Table 1's upper bound): at every step each restricted row
set sees, per KV head, the `budget` cached entries that receive the most attention from it.

Scores are the exact softmax attention of the restricted rows' queries over the whole cache, summed
over the rows and over the KV head's query heads (GQA: one choice per KV head). This reads every
key to choose, so it never saves work: it measures how good a budget could be.

The choice is one function, `top_attended`, that `TopK.select` (the regular forward) and `TopKSelector`
(inside a fixed-shape forward, over every slot of the allocation) both call.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Any

import torch

from core.options import options
from kv_policies.base import KVPolicy
from kv_policies.checks import check_backend, check_budget, check_budget_frac, check_dense_layers
from kv_policies.view import FixedShapeForward, InForwardSelector


def top_attended(
    q: torch.Tensor,
    keys: torch.Tensor,
    scale: float,
    keep: int,
    hidden: torch.Tensor | None = None,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """Top-K's rule: bool `[n_kv_heads, L]`, per KV head the `keep` entries of `keys [n_kv_heads, L, d]`
    that get the most softmax attention from the queries `q [h, rows, d]`, summed over the KV head's
    query heads and rows. `hidden [L]`: entries never offered (scored -inf, also in the softmax);
    `weight [rows * h / n_kv_heads]`: each query row's weight in the sum (0 for a pad row)."""
    hkv, length, d = keys.shape
    h, rows, _ = q.shape
    logits = q.float().reshape(hkv, (h // hkv) * rows, d) @ keys.float().transpose(1, 2) * scale
    if hidden is not None:
        logits = logits.masked_fill(hidden[None, None, :], float("-inf"))
    probs = logits.softmax(-1)
    scores = probs.sum(1) if weight is None else (probs * weight[None, :, None]).sum(1)  # [hkv, L]
    if hidden is not None:
        scores = scores.masked_fill(hidden[None, :], float("-inf"))
    chosen = torch.zeros(hkv, length, dtype=torch.bool, device=keys.device)
    return chosen.scatter_(1, scores.topk(keep, dim=1).indices, True)


class TopKSelector(InForwardSelector):
    """Top-K's choice inside a fixed-shape forward of `static` (a `core.decode_graph.StaticForward`):
    `top_attended` over every slot of the allocation, those from the selectable length on hidden (a
    self-drafting decoder's fresh tail and the block stay visible), pad rows weighing 0."""

    takes_tail = True

    def __init__(self, static: FixedShapeForward, policy: TopK) -> None:
        super().__init__(static, policy)
        self.keep = min(policy.budget, self.capacity)

    def select(
        self, layer: int, q: torch.Tensor, restricted: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor:
        """bool `[n_kv_heads, capacity]`: the slots layer `layer`'s restricted rows see."""
        if layer < self.dense:
            return self.dense_layer(layer, slots)
        cache = self.engine.cache
        hkv, beyond = cache.n_kv_heads, slots >= self.length
        weight = restricted.repeat(q.shape[0] // hkv).float()  # the reshape's row order: head-major, then row
        keys = cache.k[layer, :, : slots.numel()]
        sel = top_attended(q, keys, self.engine.scale, self.keep, beyond, weight) & ~beyond
        self.reads[layer].copy_(sel.sum() // hkv)
        return sel | beyond


@dataclass
class TopKConfig:
    budget: int = 4096  # cached entries per KV head
    backend: str = "dense"
    budget_frac: float | None = None  # a fraction of each generation's context instead (None: budget)
    dense_layers: int = 0  # the first layers see the whole cache (TriForce Table 1: 2)


class TopK(KVPolicy):
    name = "topk"
    Selector = TopKSelector

    Config = TopKConfig

    def __init__(self, **given: Any) -> None:
        o = options(self.Config, given)
        budget, backend, budget_frac, dense_layers = astuple(o)
        self.budget = check_budget(self.name, budget, 0, "zero")
        self.dense_layers = check_dense_layers(self.name, dense_layers)
        self.budget_frac = check_budget_frac(self.name, budget_frac)
        self.backend = check_backend(self.name, backend)

    def selector_key(self) -> tuple:
        """The settings a fixed-shape forward's selector is built for (policies alike share it)."""
        return ("topk", self.budget, self.dense_layers)

    @torch.inference_mode()
    def select(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, cache_len: int) -> torch.Tensor:
        d = k_cache.shape[2]
        k = self.slots.gather_keys(layer, k_cache, torch.arange(cache_len, device=k_cache.device))
        scale = self.engine.scale if self.engine is not None else d**-0.5
        return top_attended(q, k, scale, min(self.budget, cache_len))
