"""H2O: heavy hitters by accumulated attention plus a recent window (Zhang et al. 2023).

Reference (`H2OKVCache_LayerWise(hh_size, recent_size)`): every cached entry
accumulates, per head, the attention mass it receives from every query (the prompt's queries at
prefill, then each decode query); once the cache is over budget the `recent` newest entries are kept
plus the `budget - recent` entries with the largest accumulated score among the older ones; evicted
entries never come back.

GQA-aware (the reference breaks on GQA: scores per query head, cache per KV head): the attention a
KV head's query heads pay is summed into one score per KV head, and eviction is per KV head.
Prefill scores come from `on_prefill` (an `engine.prefill_hooks` entry, causal attention of each
chunk's queries, computed in row tiles). During decoding the restricted rows' queries are captured by
`observe` and scored in `after_commit` against the visible set plus the newly committed entries
(for one decode row this is exactly the step's softmax; for multi-row blocks such as FAFO's fumble
rows every restricted row's attention is added, a stated approximation).
"""

from __future__ import annotations

from typing import Any

import torch

from core.types import HarnessError
from kv_policies.base import KVPolicy, check_backend, check_budget, check_budget_frac, check_dense_layers

PREFILL_TILE = 256


def attention_mass(q: torch.Tensor, k: torch.Tensor, scale: float, first_row: int | None) -> torch.Tensor:
    """Attention each key receives, summed over the query rows and the query heads of each KV head:
    q `[H, r, d]`, k `[n_kv_heads, m, d]` -> `[n_kv_heads, m]`. `first_row` (absolute position of
    q's first row, keys at positions 0..m-1) applies the causal mask; None = every key visible."""
    h, r, d = q.shape
    hkv, m, _ = k.shape
    logits = (q.float().reshape(hkv, (h // hkv) * r, d) @ k.float().transpose(1, 2)) * scale
    if first_row is not None:
        rows = (first_row + torch.arange(r, device=k.device)).repeat(h // hkv).view(-1, 1)
        logits = logits.masked_fill(torch.arange(m, device=k.device).view(1, -1) > rows, float("-inf"))
    return logits.softmax(-1).sum(1)


class H2O(KVPolicy):
    name = "h2o"
    query_free = True  # chosen from the prefill and earlier steps, never from the forward it restricts

    def __init__(
        self,
        budget: int = 760,
        recent: int | None = None,
        backend: str = "dense",
        budget_frac: float | None = None,
        dense_layers: int = 0,
    ) -> None:
        self.dense_layers = check_dense_layers(self.name, dense_layers)
        self._recent_cfg = recent  # None: half of the budget, whatever the budget becomes
        recent = budget // 2 if recent is None and isinstance(budget, int) else recent
        if not isinstance(recent, int) or recent < 0:
            raise HarnessError(f"kv=h2o: recent must be a non-negative integer, got {recent!r}")
        self.set_budget(check_budget(self.name, budget, recent, "the recent window"))
        self.budget_frac = check_budget_frac(self.name, budget_frac)
        self.backend = check_backend(self.name, backend)
        self._score: dict[int, torch.Tensor] = {}
        self._alive: dict[int, torch.Tensor] = {}
        self._q: dict[int, torch.Tensor] = {}
        self._evicted = False

    def min_budget(self) -> int:
        return 2 if self._recent_cfg is None else self._recent_cfg + 1

    def set_budget(self, budget: int) -> None:
        self.budget = budget
        self.recent = budget // 2 if self._recent_cfg is None else self._recent_cfg
        self.heavy = budget - self.recent

    def params(self) -> dict:
        return {
            "budget": self.budget,
            "budget_frac": self.budget_frac,
            "recent": self.recent,
            "heavy": self.heavy,
            "backend": self.backend,
            "dense_layers": self.dense_layers,
        }

    def reset(self, prompt_len: int, context_len: int | None = None) -> None:
        super().reset(prompt_len, context_len)
        self._score, self._alive, self._q = {}, {}, {}
        self._count: dict[int, int] = {}  # alive entries per KV head (every head keeps as many), on the host
        self._evicted = False

    def keeps_all(self, layer: int, cache_len: int) -> bool:
        return layer < self.dense_layers or (cache_len <= self.budget and not self._evicted)

    def _scale(self, d: int) -> float:
        return self.engine.scale if self.engine is not None else d**-0.5

    def _state(self, layer: int, hkv: int, length: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
        score, alive = self._score.get(layer), self._alive.get(layer)
        if score is None or score.shape[1] < length:
            cap = max(length, 2 * (score.shape[1] if score is not None else 0), 256)
            new_s = torch.zeros(hkv, cap, device=device)
            new_a = torch.zeros(hkv, cap, dtype=torch.bool, device=device)
            if score is not None:
                new_s[:, : score.shape[1]] = score
                new_a[:, : alive.shape[1]] = alive
            self._score[layer], self._alive[layer] = score, alive = new_s, new_a
        return score, alive

    # --- accumulation --------------------------------------------------------------------------
    @torch.inference_mode()
    def on_prefill(self, layer: int, q: torch.Tensor, k_all: torch.Tensor, cache_len: int) -> None:
        hkv, total, d = k_all.shape
        score, alive = self._state(layer, hkv, total, k_all.device)
        for lo in range(0, q.shape[1], PREFILL_TILE):
            tile = q[:, lo : lo + PREFILL_TILE]
            score[:, :total] += attention_mass(tile, k_all, self._scale(d), cache_len + lo)
        alive[:, cache_len:total] = True
        self._count[layer] = total  # nothing is evicted before the prefill ends

    @torch.inference_mode()
    def after_prefill(self, engine: Any) -> None:
        for layer in list(self._score):
            self._evict(layer, engine.length)

    def observe(self, layer: int, q: torch.Tensor) -> None:
        self._q[layer] = q

    @torch.inference_mode()
    def after_commit(self, engine: Any, n_new: int) -> None:
        length = engine.length
        cache = engine.cache
        for layer in range(cache.n_layers):
            score, alive = self._state(layer, cache.n_kv_heads, length, cache.device)
            new = torch.arange(length - n_new, length, device=cache.device)
            alive[:, length:] = False
            alive[:, new] = True
            self._count[layer] = self._count.get(layer, 0) + n_new
            score[:, new] = 0.0
            q = self._q.pop(layer, None)
            if q is not None and q.shape[1]:
                pos = self._positions(alive, length, self._count[layer])
                k = self.gather_keys(layer, cache.k[layer, :, :length], pos)
                score.scatter_add_(1, pos, attention_mass(q, k, self._scale(k.shape[-1]), None))
            self._evict(layer, length)

    @staticmethod
    def _positions(alive: torch.Tensor, length: int, count: int) -> torch.Tensor:
        """long `[n_kv_heads, count]`: the alive logical positions in increasing order (every KV head
        keeps `count`), found by a stable sort rather than `nonzero`, whose size the host would wait for."""
        order = torch.sort(alive[:, :length].to(torch.uint8), dim=1, descending=True, stable=True)
        return order.indices[:, :count]

    def _evict(self, layer: int, length: int) -> None:
        score, alive = self._score[layer], self._alive[layer]
        if self._count.get(layer, 0) <= self.budget:
            return
        self._evicted = True
        older = length - self.recent
        cand = score[:, :older].masked_fill(~alive[:, :older], float("-inf"))
        keep = cand.topk(self.heavy, dim=1).indices
        alive[:, :older] = False
        alive[:, :older].scatter_(1, keep, True)
        self._count[layer] = self.heavy + self.recent

    # --- selection -----------------------------------------------------------------------------
    @torch.inference_mode()
    def select(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, cache_len: int) -> torch.Tensor:
        hkv = k_cache.shape[0]
        if self.keeps_all(layer, cache_len) or layer not in self._alive:
            return torch.ones(hkv, cache_len, dtype=torch.bool, device=k_cache.device)
        _, alive = self._state(layer, hkv, cache_len, k_cache.device)
        return alive[:, :cache_len].clone()
