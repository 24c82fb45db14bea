"""The KV policy contract: one small plug-in every decoder can use.

A policy decides which *cached* entries a restricted query row may see:
`visible(layer, q, k_cache, cache_len) -> bool [n_kv_heads, cache_len]` (GQA-aware: one choice per
KV head, shared by its query heads). `q` is `[n_heads, n_rows, head_dim]` for the restricted rows of
the current block (dynamic policies such as Quest score pages with it); `k_cache` is
`[n_kv_heads, cache_len, head_dim]` (post-RoPE keys, slots in physical order; the logical position
of slot s is `engine.cache.slot_pos[s]`).

Decoders combine it with their block layout through `kv_policies.view.RestrictedView`:
- vanilla + policy (the lossy baseline): every decode row is restricted (`decode_view`);
- FAFO: only the fumble rows are restricted (verification rows see the full cache);
- TriForce / SFI: the draft / sparse rows are restricted.
Hooks: `attach(engine)` once, `reset(prompt_len)` per generation, `after_prefill(engine)` (static
selections such as SnapKV), `after_commit(engine, n_new)` (sliding windows, accumulated scores).
"""

from __future__ import annotations

from typing import Any

import torch


class KVPolicy:
    name: str = "base"
    lossless: bool = False  # True only when every entry stays visible (FullKV)

    def attach(self, engine: Any) -> None:
        self.engine = engine

    def reset(self, prompt_len: int) -> None:
        pass

    def after_prefill(self, engine: Any) -> None:
        pass

    def visible(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, cache_len: int) -> torch.Tensor:
        raise NotImplementedError

    def decode_view(self, engine: Any, n_block: int) -> Any:
        """View for a block whose rows all see the policy's selection (plus the block causally)."""
        from kv_policies.view import RestrictedView

        return RestrictedView.all_rows(self, engine, n_block)

    def after_commit(self, engine: Any, n_new: int) -> None:
        pass

    def params(self) -> dict:
        return {}
