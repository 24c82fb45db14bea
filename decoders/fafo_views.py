"""Attention views for FAFO's blocks: fumble rows restricted to the KV policy's selection.

`backend=dense` is the reference: SDPA with a boolean mask over [cache | block]
(`kv_policies.view.RestrictedView` with the fumble rows as restricted rows; with kv=full a plain
`MaskView` where every row sees the whole cache). A dense mask never skips work on CPU
(cpu-lab.md §2): the compressed region only saves memory traffic with a block-sparse kernel over a
physically compact region, the `flex` backend.
"""

from __future__ import annotations

from typing import Any

import torch

from core.attention import MaskView
from decoders.fafo_layout import FafoLayout
from kv_policies.full import FullKV
from kv_policies.view import RestrictedView

BACKENDS = ("dense",)


class ViewFactory:
    def __init__(self, engine: Any, kv: Any, backend: str = "dense") -> None:
        if backend not in BACKENDS:
            raise ValueError(f"fafo backend must be one of {BACKENDS}, got {backend!r}")
        self.engine, self.kv, self.backend = engine, kv, backend

    def _full(self, lay: FafoLayout, cache_len: int) -> MaskView:
        n = lay.size
        mask = torch.ones(n, cache_len + n, dtype=torch.bool, device=self.engine.device)
        mask[:, cache_len:] = lay.block_mask
        return MaskView(mask, self.engine.scale)

    def fused(self, lay: FafoLayout, cache_len: int) -> Any:
        """x_last and candidates see the full cache; stream rows only the policy's selection."""
        if isinstance(self.kv, FullKV) or lay.n == 0:
            return self._full(lay, cache_len)
        return RestrictedView(self.kv, self.engine.scale, lay.block_mask, lay.is_stream)

    def compressed(self, lay: FafoLayout, cache_len: int) -> Any:
        """Every row restricted (FAFO-2forward's compressed forward)."""
        if isinstance(self.kv, FullKV):
            return self._full(lay, cache_len)
        restricted = torch.ones(lay.size, dtype=torch.bool, device=self.engine.device)
        return RestrictedView(self.kv, self.engine.scale, lay.block_mask, restricted)
