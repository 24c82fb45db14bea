"""Quest: query-aware page selection with per-page key min/max (Tang et al. 2024, arXiv 2406.10774).

Keys are grouped into pages of `page_size` consecutive positions; each page keeps, per channel, the
minimum and maximum key. For a query q the page's upper bound on q.k is
`sum_d max(q_d * kmax_d, q_d * kmin_d)` (never below the true max over the page's keys, because each
term bounds its channel's product); the top pages by bound are attended.

As in the reference: the last page (the newest entry's) is always attended and is part of the page
budget; the first `dense_layers` layers (2 in the paper) see everything; a budget of
`budget // page_size` pages. GQA-aware (the reference repeats KV and picks per query head): one page
choice per KV head, scored by the max over its query heads (and restricted rows) of their bounds, an
upper bound on the max score any of them can reach in that page. Unlike the reference's
`max(3, budget // page)` rule, a budget that covers the context keeps everything. `page_size` must
divide the compressed-region block (128) so pages tile the region's blocks.

The page extremes of every layer live in one tensor, extended as entries are committed (read the first
time a layer is scored after they arrive; before a fixed-shape forward, every layer in one pass); a
rollback re-reads the cut page. The choice is one function, `choose_pages`, that `Quest.select` (the
regular forward) and `QuestSelector` (inside a fixed-shape forward) both call.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Any

import torch

from core.options import options
from core.types import HarnessError
from kv_policies.base import KVPolicy
from kv_policies.checks import check_backend, check_budget, check_budget_frac
from kv_policies.pages import PageExtremes, page_bounds
from kv_policies.view import FixedShapeForward, InForwardSelector, InForwardView

REGION_BLOCK = 128


def choose_pages(
    q: torch.Tensor,
    kmin: torch.Tensor,
    kmax: torch.Tensor,
    n_pages: int,
    last: int | torch.Tensor,
    page_index: torch.Tensor,
    rows: torch.Tensor | None = None,
) -> torch.Tensor:
    """Quest's rule: bool `[n_kv_heads, pages]`, the page `last` (the newest entry's, always kept) and
    the `n_pages - 1` pages before it with the highest bound for queries `q [h, rows, d]` (the max over
    each KV head's query heads and its rows, those `rows` flags if given) against the page extremes
    `kmin`/`kmax [n_kv_heads, pages, d]`. Pages from `last` on (a partial page, free ones) never
    compete. `last`: an int, or a one-element device tensor (staged for a fixed-shape forward);
    `page_index`: `arange(pages)`."""
    hkv = kmin.shape[0]
    h, n, d = q.shape
    g = h // hkv
    bounds = page_bounds(q.reshape(hkv, g * n, d), kmin, kmax)  # query heads of KV head j: j*g .. j*g+g-1
    if rows is not None:
        bounds = torch.where(rows.repeat(g)[None, :, None], bounds, float("-inf"))
    bounds = torch.where(page_index[None, :] < last, bounds.amax(1), float("-inf"))  # [hkv, pages]
    chosen = torch.zeros(bounds.shape, dtype=torch.bool, device=bounds.device)
    chosen.scatter_(1, bounds.topk(n_pages - 1, dim=1).indices, True)
    return chosen | (page_index[None, :] == last)


class QuestSelector(InForwardSelector):
    """Quest's page choice inside a fixed-shape forward of `static` (a `core.decode_graph.StaticForward`):
    the page extremes of every layer in buffers of the cache's capacity, brought up to date before each
    step (outside a CUDA graph), `choose_pages` over every page inside the forward."""

    def __init__(self, static: FixedShapeForward, policy: Quest) -> None:
        super().__init__(static, policy)
        cache = self.engine.cache
        self.page, self.n_pages = policy.page_size, policy.n_pages
        pages = -(-cache.capacity // self.page)
        shape = (cache.n_layers, cache.n_kv_heads, pages, cache.head_dim)
        dev = self.engine.device
        self.kmin = torch.full(shape, float("inf"), device=dev)
        self.kmax = torch.full(shape, float("-inf"), device=dev)
        self.page_index = torch.arange(pages, device=dev)
        self.last_page = torch.zeros(1, dtype=torch.long, device=dev)  # the page of the newest entry

    def stage(self, view: InForwardView, n: int, length: int) -> None:
        """The page extremes of the `length` cached entries, every selected layer, and the last page."""
        super().stage(view, n, length)
        pol = view.policy  # this step's policy: a later one with the same settings shares the forward
        pages, first = -(-length // self.page), self.dense
        pol.sync_layers(first, length)
        self.kmin[first:, :, :pages].copy_(pol._kmin[first:, :, :pages])
        self.kmax[first:, :, :pages].copy_(pol._kmax[first:, :, :pages])
        self.last_page.fill_(pages - 1)

    def select(
        self, layer: int, q: torch.Tensor, restricted: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor:
        """bool `[n_kv_heads, capacity]`: the slots layer `layer`'s restricted rows see (the cache's
        chosen pages; every slot from `length` on, the block's, is left to the block's visibility)."""
        if layer < self.dense:
            return self.dense_layer(layer, slots)
        hkv, beyond = self.kmin.shape[1], slots >= self.length  # the block and the free slots
        chosen = choose_pages(
            q, self.kmin[layer], self.kmax[layer], self.n_pages, self.last_page, self.page_index, restricted
        )
        logical = chosen.repeat_interleave(self.page, dim=1, output_size=chosen.shape[1] * self.page)
        positions = self.engine.cache.slot_pos[: slots.numel()].clamp(0, logical.shape[1] - 1)
        sel = logical.gather(1, positions.expand(hkv, -1)) & ~beyond
        self.reads[layer].copy_(sel.sum() // hkv)
        return sel | beyond


@dataclass
class QuestConfig:
    budget: int = 760  # cached entries per KV head (the papers' setting; ~10% of their ~8k contexts)
    page_size: int = 16  # keys per page; must divide the attention block size (128)
    dense_layers: int = 2  # the first layers see everything (2 in the paper)
    backend: str = "dense"
    budget_frac: float | None = None  # a fraction of each generation's context instead (None: budget)


class Quest(PageExtremes, KVPolicy):
    name = "quest"
    keeps_alike = True  # `keeps_all`: one answer for every layer past the dense ones
    Selector = QuestSelector

    Config = QuestConfig

    def __init__(self, **given: Any) -> None:
        o = options(self.Config, given)
        budget, page_size, dense_layers, backend, budget_frac = astuple(
            o
        )  # the options, in their declared order
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

    def reset(self, prompt_len: int, context_len: int | None = None) -> None:
        super().reset(prompt_len, context_len)
        self._kmin, self._kmax, self._seen = None, None, {}

    def keeps_all(self, layer: int, cache_len: int) -> bool:
        return layer < self.dense_layers or cache_len <= self.budget

    def max_selected(self, capacity: int) -> int:
        return min(self.n_pages * self.page_size, capacity)

    def selector_key(self) -> tuple:
        """The settings a fixed-shape forward's selector is built for (policies alike share it)."""
        return ("quest", self.page_size, self.n_pages, self.dense_layers)

    @torch.inference_mode()
    def select(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, cache_len: int) -> torch.Tensor:
        hkv = k_cache.shape[0]
        if self.keeps_all(layer, cache_len):
            return torch.ones(hkv, cache_len, dtype=torch.bool, device=k_cache.device)
        self.sync(layer, k_cache, cache_len)
        pages = -(-cache_len // self.page_size)  # more than `n_pages`: the cache exceeds the budget
        kmin, kmax = self._kmin[layer][:, :pages], self._kmax[layer][:, :pages]
        index = torch.arange(pages, device=k_cache.device)
        chosen = choose_pages(q, kmin, kmax, self.n_pages, pages - 1, index)
        return chosen.repeat_interleave(self.page_size, dim=1)[:, :cache_len]
