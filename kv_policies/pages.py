"""Quest's page extremes (Tang et al. 2024, arXiv 2406.10774): per page of `page_size` consecutive
positions, each key channel's minimum and maximum, every layer's in one tensor
`[n_layers, n_kv_heads, pages, head_dim]` extended as entries are committed; a rollback forgets the cut
pages. `PageExtremes` keeps them for a policy (`kv_policies.quest.Quest`), which chooses pages by
`page_bounds`.
"""

from __future__ import annotations

import torch


def page_bounds(q: torch.Tensor, kmin: torch.Tensor, kmax: torch.Tensor) -> torch.Tensor:
    """Upper bounds `[..., rows, pages]` on q.k within each page, from q `[..., rows, d]` and page
    key extremes `[..., pages, d]`: sum over channels of max(q_d kmax_d, q_d kmin_d)."""
    q = q.float()
    return q.clamp(min=0) @ kmax.float().transpose(-1, -2) + q.clamp(max=0) @ kmin.float().transpose(-1, -2)


class PageExtremes:
    """The store a page-choosing policy mixes in: `_kmin`/`_kmax` (None until first read) and the
    entries each layer has read (`_seen`), over the policy's `page_size`, engine and slot map."""

    page_size: int
    _kmin: torch.Tensor | None
    _kmax: torch.Tensor | None
    _seen: dict[int, int]

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
            keys = self.slots.gather_keys(layer, k_cache, pos).float()  # [hkv, m, d]
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
        if len(seen) != 1 or self.slots.region is not None:
            for li in layers:
                self.sync(li, cache.k[li, :, :cache_len], cache_len)
            return
        self._ensure(cache.k[first], -(-cache_len // self.page_size), cache.n_layers)
        done = self._forget_cut(slice(first, None), seen.pop(), cache_len)
        if cache_len > done:
            pos = torch.arange(done, cache_len, device=cache.k.device)
            if self.slots.in_order():
                keys = cache.k[first:, :, done:cache_len]
            else:  # one slot map for every layer and head
                keys = cache.k[first:].index_select(2, self.slots.physical(first, pos, 1)[0])
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
