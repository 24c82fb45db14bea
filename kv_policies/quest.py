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

The page metadata of every layer is kept in one tensor and extended incrementally as entries are
committed (read from the cache the first time a layer is scored after they arrive; before a fixed-shape
forward, every layer in one pass); a shorter cache (rollback) re-reads the cut page.
"""

from __future__ import annotations

from typing import Any

import torch

from core.types import HarnessError
from kv_policies.base import KVPolicy
from kv_policies.checks import check_backend, check_budget, check_budget_frac

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
    keeps_alike = True  # `keeps_all`: one answer for every layer past the dense ones

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
        # every layer's page extremes, `[n_layers, n_kv_heads, pages, head_dim]` (a step's fixed-shape
        # forward brings every layer up to date in one pass), and the entries each layer has read
        self._kmin: torch.Tensor | None = None
        self._kmax: torch.Tensor | None = None
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
        self._kmin, self._kmax, self._seen = None, None, {}

    def keeps_all(self, layer: int, cache_len: int) -> bool:
        return layer < self.dense_layers or cache_len <= self.budget

    def max_selected(self, capacity: int) -> int:
        return min(self.n_pages * self.page_size, capacity)

    # --- page metadata -------------------------------------------------------------------------
    def _ensure(self, k_cache: torch.Tensor, pages: int, layers: int) -> None:
        """Room for `pages` pages of the first `layers` layers' extremes at least (every layer of the
        attached engine's cache; `k_cache`: one layer's keys, for the shape)."""
        have = self._kmin
        if have is not None and have.shape[2] >= pages and have.shape[0] >= layers:
            return
        hkv, _, d = k_cache.shape
        n_layers = max(layers, self.engine.cache.n_layers if self.engine is not None else 0)
        if have is not None:
            n_layers, pages = max(n_layers, have.shape[0]), max(pages, 2 * have.shape[2])
        shape = (n_layers, hkv, max(pages, 64), d)
        kmin = torch.full(shape, float("inf"), device=k_cache.device)
        kmax = torch.full(shape, float("-inf"), device=k_cache.device)
        if have is not None:
            kmin[: have.shape[0], :, : have.shape[2]] = have
            kmax[: have.shape[0], :, : have.shape[2]] = self._kmax
        self._kmin, self._kmax = kmin, kmax

    @torch.inference_mode()
    def sync(self, layer: int, k_cache: torch.Tensor, cache_len: int) -> None:
        """Bring layer `layer`'s page extremes up to `cache_len` entries."""
        self._ensure(k_cache, -(-cache_len // self.page_size), layer + 1)
        seen = self._forget_cut(slice(layer, layer + 1), self._seen.get(layer, 0), cache_len)
        if cache_len > seen:
            pos = torch.arange(seen, cache_len, device=k_cache.device)
            keys = self.gather_keys(layer, k_cache, pos).float()  # [hkv, m, d]
            self._extend(self._kmin[layer], self._kmax[layer], keys, pos)
        self._seen[layer] = cache_len

    @torch.inference_mode()
    def sync_layers(self, first: int, cache_len: int) -> None:
        """`sync` of layers `first..` over the engine's cache, every layer in one pass when they have
        read as many entries and share one slot map (no compressed region): the fixed-shape forward's
        staging, before every step (one scatter per bound instead of one per layer)."""
        cache = self.engine.cache
        layers = range(first, cache.n_layers)
        seen = {self._seen.get(li, 0) for li in layers}
        if len(seen) != 1 or self.region is not None:
            for li in layers:
                self.sync(li, cache.k[li, :, :cache_len], cache_len)
            return
        self._ensure(cache.k[first], -(-cache_len // self.page_size), cache.n_layers)
        done = self._forget_cut(slice(first, None), seen.pop(), cache_len)
        if cache_len > done:
            pos = torch.arange(done, cache_len, device=cache.k.device)
            if self.in_order():
                keys = cache.k[first:, :, done:cache_len]
            else:  # one slot map for every layer and head
                keys = cache.k[first:].index_select(2, self.physical(first, pos, 1)[0])
            self._extend(self._kmin[first:], self._kmax[first:], keys.float(), pos)
        self._seen.update(dict.fromkeys(layers, cache_len))

    def _forget_cut(self, layers: slice, seen: int, cache_len: int) -> int:
        """After a rollback below `seen`, forget the cut pages of `layers`; the entries still read."""
        if cache_len >= seen:
            return seen
        first = cache_len // self.page_size  # the partial page is read again
        self._kmin[layers, :, first:].fill_(float("inf"))
        self._kmax[layers, :, first:].fill_(float("-inf"))
        return first * self.page_size

    def _extend(self, kmin: torch.Tensor, kmax: torch.Tensor, keys: torch.Tensor, pos: torch.Tensor) -> None:
        """Fold `keys [..., m, d]` of positions `pos [m]` into their pages' extremes `[..., pages, d]`."""
        idx = (pos // self.page_size).view(*[1] * (keys.dim() - 2), -1, 1).expand_as(keys)
        kmin.scatter_reduce_(-2, idx, keys, "amin")
        kmax.scatter_reduce_(-2, idx, keys, "amax")

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
