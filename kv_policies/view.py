"""`RestrictedView`: a block layout where some query rows see only a KV policy's selection.

Dense SDPA with a per-KV-head boolean mask: the reference path every sparse backend must equal.
`block_mask` `[n, n]` gives visibility inside the block; `restricted` `[n]` marks rows that see only
`policy.visible(...)` of the cache, the other rows see the whole cache. `tail_from` (optional): cached
entries from that position on are a speculative tail (a self-drafting decoder's own fresh tokens):
visible to every row, never offered to the policy, which selects over `[0, tail_from)` only.

`SelectionView`: the same layout for a policy whose selection is one set of slots for every layer,
head and query (`KVPolicy.fixed_selection`): a `MaskView` over `[n, L + n]` built on the device once per
step, so the step takes the fixed-shape forward and reads nothing back.

`ObservedCausalView`: the plain causal view (bit-identical to `CausalView`) that also hands the
queries to `policy.observe` (H2O accumulates attention even while the budget still covers everything).
"""

from __future__ import annotations

from typing import Any

import torch

from core.attention import CausalView, MaskView, sdpa


class RestrictedView:
    def __init__(
        self,
        policy: Any,
        scale: float,
        block_mask: torch.Tensor,
        restricted: torch.Tensor,
        tail_from: int | None = None,
    ) -> None:
        self.policy, self.scale = policy, scale
        self.block_mask = block_mask
        self.restricted = restricted
        self.tail_from = tail_from
        self._read: list[int] = []

    @classmethod
    def all_rows(cls, policy: Any, engine: Any, n_block: int) -> RestrictedView:
        dev = engine.device
        tril = torch.ones(n_block, n_block, dtype=torch.bool, device=dev).tril()
        return cls(policy, engine.scale, tril, torch.ones(n_block, dtype=torch.bool, device=dev))

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        n, total = q.shape[2], k.shape[2]
        cache_len = total - n
        sel_len = cache_len if self.tail_from is None else min(self.tail_from, cache_len)
        h, hkv = q.shape[1], k.shape[1]
        rows = self.restricted.nonzero().squeeze(1)
        q_rows = q[0, :, rows]
        vis = torch.ones(hkv, cache_len, dtype=torch.bool, device=q.device)
        if rows.numel():
            if hasattr(self.policy, "observe"):
                self.policy.observe(layer, q_rows)
            vis[:, :sel_len] = self.policy.visible(layer, q_rows, k[0, :, :sel_len], sel_len)  # [hkv, L]
        read = int(vis[:, :sel_len].sum().item()) // hkv
        self._read.append(read + cache_len - sel_len)
        if rows.numel():
            self.policy.activity.note(layer, read, sel_len)
        mask = torch.empty(hkv, n, total, dtype=torch.bool, device=q.device)
        mask[:, :, :cache_len] = torch.where(self.restricted[None, :, None], vis[:, None, :], True)
        mask[:, :, cache_len:] = self.block_mask
        if h != hkv:
            mask = mask.repeat_interleave(h // hkv, dim=0)
        return sdpa(q, k, v, mask.unsqueeze(0), self.scale)

    def kv_read(self, cache_len: int) -> int:
        """Mean over layers of cached entries read per KV head by the restricted rows."""
        return round(sum(self._read) / len(self._read)) if self._read else cache_len


class SelectionView(MaskView):
    """Restricted rows see `selection` of the cache, the others all of it; `block_mask` inside the block.
    The policy's activity is noted for every layer when the view is built (one forward per view)."""

    def __init__(self, mask: torch.Tensor, scale: float, read: int) -> None:
        super().__init__(mask, scale)
        self.read = read

    @classmethod
    def build(
        cls,
        policy: Any,
        engine: Any,
        block_mask: torch.Tensor,
        restricted: torch.Tensor,
        tail_from: int | None = None,
    ) -> SelectionView | None:
        """The view, or None when the policy's selection is not fixed (or it watches the queries)."""
        from kv_policies.base import KVPolicy

        if type(policy).observe is not KVPolicy.observe:
            return None
        cache_len = engine.length
        sel_len = cache_len if tail_from is None else min(tail_from, cache_len)
        fixed = policy.fixed_selection(sel_len)
        if fixed is None:
            return None
        selection, kept = fixed
        n = block_mask.shape[0]
        mask = torch.ones(n, cache_len + n, dtype=torch.bool, device=engine.device)
        restricted = restricted.to(engine.device)
        mask[:, :sel_len] = selection[None, :] | ~restricted[:, None]
        mask[:, cache_len:] = block_mask
        for layer in range(engine.cache.n_layers):  # restricted rows exist in every caller's block
            policy.activity.note(layer, kept, sel_len)
        return cls(mask, engine.scale, kept + cache_len - sel_len)

    def kv_read(self, cache_len: int) -> int:
        return self.read


class ObservedCausalView(CausalView):
    """`CausalView` that first shows every layer's queries to `policy.observe` (all rows restricted)."""

    def __init__(self, scale: float, policy: Any) -> None:
        super().__init__(scale)
        self.policy = policy

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.policy.observe(layer, q[0])
        return super().attend(layer, q, k, v)
