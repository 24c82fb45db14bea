"""Quest's restricted blocks on the fixed-shape forward: the page choice made inside the forward.

Quest chooses each layer's pages from that layer's own queries, so its choice cannot be read before
the forward as the other policies' can (`kv_policies.view.LayerSelectionView`). `QuestView` is an
`InForwardView` (the regular forward is unchanged, the choice is also made inside it): on the fixed-shape
path (`core.decode_graph`) a `QuestSelector` owns the page extremes of every layer in buffers sized by
the cache's capacity, brings them up to date before each step (outside a CUDA graph), and inside the
forward scores every page against the restricted rows' queries with fixed shapes: pages from the
last one on score -inf, the top `pages - 1` plus the last page are kept (the same pages as
`Quest.select`, which scores only the full pages), and their slots are the layer's selection.
"""

from __future__ import annotations

from typing import Any

import torch

from kv_policies.quest import page_bounds
from kv_policies.view import InForwardSelector, InForwardView


class QuestView(InForwardView):
    @property
    def selector_key(self) -> tuple:
        pol = self.policy
        return ("quest", pol.page_size, pol.n_pages, pol.dense_layers)

    def selector(self, static: Any) -> QuestSelector:
        return QuestSelector(static, self.policy)


class QuestSelector(InForwardSelector):
    """Quest's page choice inside a fixed-shape forward of `static` (a `core.decode_graph.StaticForward`)."""

    def __init__(self, static: Any, policy: Any) -> None:
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

    def stage(self, view: Any, n: int, length: int) -> None:
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
        hkv = self.kmin.shape[1]
        beyond = slots >= self.length  # the block and the free slots
        h, rows, d = q.shape
        g = h // hkv
        bounds = page_bounds(q.reshape(hkv, g * rows, d), self.kmin[layer], self.kmax[layer])
        bounds = torch.where(restricted.repeat(g)[None, :, None], bounds, float("-inf")).amax(1)  # [hkv, P]
        bounds = torch.where(self.page_index[None, :] < self.last_page, bounds, float("-inf"))
        chosen = torch.zeros(bounds.shape, dtype=torch.bool, device=slots.device)
        chosen.scatter_(1, bounds.topk(self.n_pages - 1, dim=1).indices, True)
        chosen.scatter_(1, self.last_page.expand(hkv, 1), True)
        logical = chosen.repeat_interleave(self.page, dim=1, output_size=chosen.shape[1] * self.page)
        positions = self.engine.cache.slot_pos[: slots.numel()].clamp(0, logical.shape[1] - 1)
        sel = logical.gather(1, positions.expand(hkv, -1)) & ~beyond
        self.reads[layer].copy_(sel.sum() // hkv)
        return sel | beyond
