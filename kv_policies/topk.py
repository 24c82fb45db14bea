"""Top-K attention, the oracle (TriForce Table 1's upper bound): at every step each restricted row
set sees, per KV head, the `budget` cached entries that receive the most attention from it.

Scores are the exact softmax attention of the restricted rows' queries over the whole cache, summed
over the rows and over the KV head's query heads (GQA: one choice per KV head). This reads every
key to choose, so it never saves work: it measures how good a budget could be.
"""

from __future__ import annotations

from typing import Any

import torch

from kv_policies.base import KVPolicy
from kv_policies.checks import check_backend, check_budget, check_budget_frac, check_dense_layers


class TopK(KVPolicy):
    name = "topk"

    def __init__(
        self,
        budget: int = 4096,
        backend: str = "dense",
        budget_frac: float | None = None,
        dense_layers: int = 0,
    ) -> None:
        self.budget = check_budget(self.name, budget, 0, "zero")
        self.dense_layers = check_dense_layers(self.name, dense_layers)
        self.budget_frac = check_budget_frac(self.name, budget_frac)
        self.backend = check_backend(self.name, backend)

    def params(self) -> dict:
        return {
            "budget": self.budget,
            "budget_frac": self.budget_frac,
            "backend": self.backend,
            "dense_layers": self.dense_layers,
        }

    def forward_view(
        self,
        engine: Any,
        block_mask: torch.Tensor,
        restricted: torch.Tensor,
        tail_from: int | None,
        rows: slice | None,
    ) -> Any:
        """`TopKView`: the choice also runs inside the fixed-shape forward (draft tail included)."""
        if self.region is not None:
            return None
        from kv_policies.topk_view import TopKView

        return TopKView(self, engine.scale, block_mask, restricted, tail_from, rows)

    @torch.inference_mode()
    def select(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, cache_len: int) -> torch.Tensor:
        hkv, _, d = k_cache.shape
        k = self.gather_keys(layer, k_cache, torch.arange(cache_len, device=k_cache.device))
        h, rows, _ = q.shape
        scale = self.engine.scale if self.engine is not None else d**-0.5
        logits = q.float().reshape(hkv, (h // hkv) * rows, d) @ k.float().transpose(1, 2) * scale
        scores = logits.softmax(-1).sum(1)  # [hkv, L]
        sel = torch.zeros(hkv, cache_len, dtype=torch.bool, device=k_cache.device)
        return sel.scatter_(1, scores.topk(min(self.budget, cache_len), dim=1).indices, True)
