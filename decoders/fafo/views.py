"""Attention views for FAFO's blocks: fumble rows restricted to the KV policy's selection.

Backends (the decoder's `backend`, default: the KV policy's own `backend` from conf/kv/*.yaml):
- `dense`: the reference, SDPA with a boolean mask over [cache | block]
  (`kv_policies.view.RestrictedView` with the fumble rows as the restricted rows). A dense mask never
  skips work on CPU.
- `flex` / `sliced` / `flash`: the compressed-region layout of FAFO §4.4 / App. H
  (`core.compressed_region`): the policy's selection is swapped into a fixed block-aligned region at
  the head of the KV tensors, so the fumble rows read only that region (a static FlexAttention
  BlockMask for `flex`, an SDPA over the region slice for `sliced`).
With kv=full (or while a policy still keeps every entry, and it needs no per-step observation) every
row sees the whole cache: one plain masked SDPA (`BlockView`), whatever the backend.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.attention import BlockView, View
from core.checks import choice
from core.policy_views import restricted_view
from decoders.fafo.layout import FafoLayout
from kv_policies.checks import BACKENDS
from kv_policies.full import FullKV
from kv_policies.view import causal_block

if TYPE_CHECKING:
    from core.engine import Engine
    from kv_policies.base import KVPolicy


class ViewFactory:
    def __init__(self, engine: Engine, kv: KVPolicy, backend: str | None = None) -> None:
        if backend is not None:  # null: the KV policy's backend
            choice("decoder.backend", backend, BACKENDS)
        self.engine, self.kv = engine, kv
        self.backend = backend or getattr(kv, "backend", "dense")

    def _full(self, lay: FafoLayout) -> BlockView:
        return BlockView(lay.block_mask, self.engine.scale)

    def _unrestricted(self, cache_len: int) -> bool:
        """True when restricting changes nothing: kv=full, or a budget still covering the whole cache
        for a policy that does not watch the restricted rows' queries (H2O does)."""
        kv = self.kv
        if isinstance(kv, FullKV):
            return True
        if kv.watches_queries:
            return False
        return kv.keeps_every_layer(self.engine.cache.n_layers, cache_len)

    def fused(self, lay: FafoLayout, cache_len: int) -> View:
        """x_last and candidates see the full cache; stream rows only the policy's selection."""
        if lay.n == 0 or self._unrestricted(cache_len):
            return self._full(lay)
        streams = slice(lay.stream_row, lay.size)  # the restricted rows: the streams (and their padding)
        return restricted_view(
            self.kv, self.engine, lay.block_mask, lay.is_stream, self.backend, rows=streams
        )

    def compressed(self, lay: FafoLayout, cache_len: int) -> View:
        """Every row restricted (FAFO-2forward's compressed forward)."""
        if self._unrestricted(cache_len):
            return self._full(lay)
        every = causal_block(lay.size, self.engine.device)[1]  # shared, made once per size
        return restricted_view(self.kv, self.engine, lay.block_mask, every, self.backend, rows=slice(None))
