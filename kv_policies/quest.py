"""Quest: query-aware page selection with per-page key min/max (Tang et al. 2024).

Keys are grouped into pages of `page_size` consecutive positions; each page keeps, per channel, the
minimum and maximum key. For a query q the page's upper bound on q.k is
`sum_d max(q_d * kmax_d, q_d * kmin_d)` (never below the true max over the page's keys, because each
term bounds its channel's product); the top pages by bound are attended.

As in the reference: the last page (the one the newest entry is in) is always attended and is part
of the page budget; the first `dense_layers` layers (2 in the paper) see everything; a budget of
`budget // page_size` pages. GQA-aware (the reference repeats KV and picks per query head): one page
choice per KV head, scored by the max over its query heads (and over the restricted rows) of their
bounds, which is an upper bound on the max score any of them can reach in that page.
Unlike the Quest reference implementation's `max(3, budget // page)` rule, a budget that covers the
context keeps everything. `page_size` must divide the compressed-region block (128) so pages tile
the region's blocks.

The page metadata is kept per layer and extended incrementally as entries are committed (read from the
cache the first time a layer is scored after they arrive); a shorter cache (rollback) re-reads the
cut page.
"""

from __future__ import annotations

from typing import Any

import torch

from core.types import HarnessError
from kv_policies.base import KVPolicy, check_backend, check_budget, check_budget_frac

REGION_BLOCK = 128


def page_bounds(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor) -> torch.Tensor:
    """Upper bounds `[..., rows, pages]` on q.k within each page, from q `[..., rows, d]` and page
    key extremes `[..., pages, d]`: sum over channels of max(q_d kmax_d, q_d kmin_d)."""
    q = q.float()
    return q.clamp(min=0) @ kmax.float().transpose(-1, -2) + q.clamp(max=0) @ kmin.float().transpose(-1, -2)


def page_minmax(k: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-page channel min and max `[..., pages, d]` of keys `[..., L, d]` (last page may be partial)."""
    *lead, length, d = k.shape
    pages = -(-length // page_size)
    pad = pages * page_size - length
    kp = torch.nn.functional.pad(k.float(), (0, 0, 0, pad), value=float("nan"))
    kp = kp.reshape(*lead, pages, page_size, d)
    return kp.nan_to_num(float("inf")).amin(-2), kp.nan_to_num(float("-inf")).amax(-2)


class Quest(KVPolicy):
    name = "quest"

    def __init__(
        self,
        budget: int = 760,
        page_size: int = 16,
        dense_layers: int = 2,
        backend: str = "dense",
        budget_frac: float | None = None,
    ) -> None:
        if not isinstance(page_size, int) or page_size <= 0 or REGION_BLOCK % page_size:
            raise HarnessError(
                f"kv=quest: page_size ({page_size}) must be a positive divisor of the attention block size "
                f"({REGION_BLOCK}) so pages tile the compressed region's blocks"
            )
        if not isinstance(dense_layers, int) or dense_layers < 0:
            raise HarnessError(f"kv=quest: dense_layers must be a non-negative integer, got {dense_layers!r}")
        check_budget(self.name, budget, page_size, "one page (the always-kept last page)")
        if budget // page_size < 2:
            raise HarnessError(f"kv=quest: budget ({budget}) must hold at least two pages of {page_size}")
        self.page_size, self.dense_layers = page_size, dense_layers
        self.set_budget(budget)
        self.budget_frac = check_budget_frac(self.name, budget_frac)
        self.backend = check_backend(self.name, backend)
        self._kmin: dict[int, torch.Tensor] = {}
        self._kmax: dict[int, torch.Tensor] = {}
        self._seen: dict[int, int] = {}

    def min_budget(self) -> int:
        return 2 * self.page_size

    def set_budget(self, budget: int) -> None:
        self.budget, self.n_pages = budget, budget // self.page_size

    def can_restrict(self, prompt_len: int, context: int) -> bool:
        layers = self.engine.cache.n_layers if self.engine is not None else None
        return super().can_restrict(prompt_len, context) and (layers is None or self.dense_layers < layers)

    def params(self) -> dict:
        return {
            "budget": self.budget,
            "budget_frac": self.budget_frac,
            "page_size": self.page_size,
            "dense_layers": self.dense_layers,
            "pages": self.n_pages,
            "backend": self.backend,
        }

    def reset(self, prompt_len: int, context_len: int | None = None) -> None:
        super().reset(prompt_len, context_len)
        self._kmin, self._kmax, self._seen = {}, {}, {}

    def keeps_all(self, layer: int, cache_len: int) -> bool:
        return layer < self.dense_layers or cache_len <= self.budget

    def max_selected(self, capacity: int) -> int:
        return min(self.n_pages * self.page_size, capacity)

    # --- page metadata -------------------------------------------------------------------------
    def _ensure(self, layer: int, k_cache: torch.Tensor, pages: int) -> None:
        hkv, _, d = k_cache.shape
        have = self._kmin.get(layer)
        if have is not None and have.shape[1] >= pages:
            return
        cap = max(pages, 2 * (have.shape[1] if have is not None else 0), 64)
        kmin = torch.full((hkv, cap, d), float("inf"), device=k_cache.device)
        kmax = torch.full((hkv, cap, d), float("-inf"), device=k_cache.device)
        if have is not None:
            kmin[:, : have.shape[1]] = have
            kmax[:, : have.shape[1]] = self._kmax[layer]
        self._kmin[layer], self._kmax[layer] = kmin, kmax

    @torch.inference_mode()
    def sync(self, layer: int, k_cache: torch.Tensor, cache_len: int) -> None:
        """Bring layer `layer`'s page extremes up to `cache_len` entries."""
        p = self.page_size
        seen = self._seen.get(layer, 0)
        self._ensure(layer, k_cache, -(-cache_len // p))
        kmin, kmax = self._kmin[layer], self._kmax[layer]
        if cache_len < seen:  # rolled back: forget the cut pages, re-read the partial one
            first = cache_len // p
            kmin[:, first:].fill_(float("inf"))
            kmax[:, first:].fill_(float("-inf"))
            seen = first * p
        if cache_len > seen:
            pos = torch.arange(seen, cache_len, device=k_cache.device)
            keys = self.gather_keys(layer, k_cache, pos).float()  # [hkv, m, d]
            idx = (pos // p).view(1, -1, 1).expand_as(keys)
            kmin.scatter_reduce_(1, idx, keys, "amin")
            kmax.scatter_reduce_(1, idx, keys, "amax")
        self._seen[layer] = cache_len

    def forward_view(
        self,
        engine: Any,
        block_mask: torch.Tensor,
        restricted: torch.Tensor,
        tail_from: int | None,
        rows: slice | None,
    ) -> Any:
        """`QuestView`: the page choice also runs inside the fixed-shape forward (no draft tail there)."""
        if tail_from is not None or self.region is not None:
            return None
        from kv_policies.quest_view import QuestView

        return QuestView(self, engine.scale, block_mask, restricted, tail_from, rows)

    @torch.inference_mode()
    def select(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, cache_len: int) -> torch.Tensor:
        hkv = k_cache.shape[0]
        if self.keeps_all(layer, cache_len):
            return torch.ones(hkv, cache_len, dtype=torch.bool, device=k_cache.device)
        self.sync(layer, k_cache, cache_len)
        p = self.page_size
        pages = -(-cache_len // p)
        h, rows, d = q.shape
        qg = q.reshape(hkv, (h // hkv) * rows, d)  # query heads of KV head j: j*G .. j*G+G-1
        older = pages - 1  # the last page is always kept
        bounds = page_bounds(qg, self._kmin[layer][:, :older], self._kmax[layer][:, :older]).amax(1)
        chosen = torch.zeros(hkv, pages, dtype=torch.bool, device=k_cache.device)
        chosen[:, older] = True
        top = bounds.topk(min(self.n_pages - 1, older), dim=1).indices
        chosen.scatter_(1, top, True)
        return chosen.repeat_interleave(p, dim=1)[:, :cache_len]
