"""Full KV: every cached entry visible (the lossless default)."""

from __future__ import annotations

from typing import Any

from core.attention import CausalView
from kv_policies.base import KVPolicy


class FullKV(KVPolicy):
    name = "full"
    lossless = True

    def decode_view(self, engine: Any, n_block: int) -> CausalView:
        return CausalView(engine.scale)
