"""Full KV: every cached entry visible (the lossless default)."""

from __future__ import annotations

from kv_policies.base import KVPolicy


class FullKV(KVPolicy):
    name = "full"
    lossless = True
