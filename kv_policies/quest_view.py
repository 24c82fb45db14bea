"""Quest's restricted blocks on the fixed-shape forward: the page choice made inside the forward.

Quest chooses each layer's pages from that layer's own queries, so its choice cannot be read before
the forward as the other policies' can (`kv_policies.view.LayerSelectionView`). `QuestView` is
`RestrictedView` (the regular forward is unchanged) that also `selects_in_forward`: on the fixed-shape
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
from kv_policies.view import RestrictedView


class QuestView(RestrictedView):
    selects_in_forward = True

    @property
    def selector_key(self) -> tuple:
        pol = self.policy
        return ("quest", pol.page_size, pol.n_pages, pol.dense_layers)

    def selector(self, static: Any) -> QuestSelector:
        return QuestSelector(static, self.policy)

    def take_reads(self, reads: torch.Tensor, cache_len: int) -> None:
        """Every layer's entries read per KV head (`[n_layers]`, on the device) from the fixed-shape
        forward, noted as the regular forward notes them."""
        self._read = [reads]
        self.policy.activity.note_forward(reads, cache_len)


class QuestSelector:
    """Quest's page choice inside a fixed-shape forward of `static` (a `core.decode_graph.StaticForward`)."""

    def __init__(self, static: Any, policy: Any) -> None:
        eng = static.engine
        cache = eng.cache
        self.engine, self.policy = eng, policy
        self.page, self.n_pages, self.dense = policy.page_size, policy.n_pages, policy.dense_layers
        self.capacity = cache.capacity
        pages = -(-cache.capacity // self.page)
        shape = (cache.n_layers, cache.n_kv_heads, pages, cache.head_dim)
        dev = eng.device
        self.kmin = torch.full(shape, float("inf"), device=dev)
        self.kmax = torch.full(shape, float("-inf"), device=dev)
        self.page_index = torch.arange(pages, device=dev)
        self.last_page = torch.zeros(1, dtype=torch.long, device=dev)  # the page of the newest entry
        self.length = torch.zeros(1, dtype=torch.long, device=dev)
        self.reads = torch.zeros(cache.n_layers, dtype=torch.long, device=dev)

    def stage(self, view: Any, n: int, length: int) -> None:
        """The page extremes of the `length` cached entries, every selected layer, and the last page."""
        if self.engine.cache.capacity != self.capacity:
            raise RuntimeError("the cache was reallocated under a Quest selector")  # StaticForward's key
        pol, cache = self.policy, self.engine.cache
        pages = -(-length // self.page)
        for layer in range(self.dense, cache.n_layers):
            pol.sync(layer, cache.k[layer, :, :length], length)
            self.kmin[layer, :, :pages].copy_(pol._kmin[layer][:, :pages])
            self.kmax[layer, :, :pages].copy_(pol._kmax[layer][:, :pages])
        self.last_page.fill_(pages - 1)
        self.length.fill_(length)

    def select(
        self, layer: int, q: torch.Tensor, restricted: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor:
        """bool `[n_kv_heads, capacity]`: the slots layer `layer`'s restricted rows see (the cache's
        chosen pages; every slot from `length` on, the block's, is left to the block's visibility)."""
        hkv = self.kmin.shape[1]
        beyond = slots >= self.length  # the block and the free slots
        if layer < self.dense:
            self.reads[layer].copy_(self.length[0])
            return torch.ones(hkv, slots.numel(), dtype=torch.bool, device=slots.device)
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
