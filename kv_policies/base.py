"""The KV policy contract: one small plug-in every decoder can use.

A policy decides which *cached* entries a query row may see. Decoders ask it for a view of the
cache for the rows it restricts:
- vanilla + policy (the lossy baseline): every decode row is restricted;
- FAFO: only the fumble rows are restricted (verification rows see the full cache);
- TriForce / SFI: the draft / sparse rows are restricted.
Hooks: `attach(engine)` once, `reset(prompt_len)` per generation, `after_prefill(engine)` (static
selections such as SnapKV), `after_commit(engine, n_new)` (sliding windows, accumulated scores).
"""

from __future__ import annotations

from typing import Any


class KVPolicy:
    name: str = "base"
    lossless: bool = False  # True only when every entry stays visible (FullKV)

    def attach(self, engine: Any) -> None:
        self.engine = engine

    def reset(self, prompt_len: int) -> None:
        pass

    def after_prefill(self, engine: Any) -> None:
        pass

    def decode_view(self, engine: Any, n_block: int) -> Any:
        """View for a block whose rows all see the policy's selection (plus the block causally)."""
        raise NotImplementedError

    def after_commit(self, engine: Any, n_new: int) -> None:
        pass

    def params(self) -> dict:
        return {}
