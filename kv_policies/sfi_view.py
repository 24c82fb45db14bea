"""SFI's fast step on the `sliced` backend (SFI §3.4, "Reorg"): the long-range part of the sparse
set (sinks + the Selector's entries) is packed into the compressed region's first slots once per slow
step, and the recent window is read in place at the end of the cache.

A fast step's one query row then attends to two slices of the one cache, with one softmax over both
(`core.attention.one_row_two_slices`): slots `[0, m_h)` (the packed set of KV head h) and slots
`[L - recent, L]` (the recent window and the new token, which sit at slot == position: packing only
trades places among entries older than the window of the slow step that chose them). Nothing is
copied or moved between slow steps. The visible set is the policy's own (`SFI.select`): sinks,
recent window, chosen entries; only the layout differs from the generic region view, which packs the
recent window too and so moves entries on every step.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from core.attention import (
    ViewKind,
    decode_logits,
    decode_weighted_values,
    one_row_attention,
    one_row_two_slices,
    split_applies,
)
from kv_policies.layer_view import ObservedCausalView


class SFISlowView(ObservedCausalView):
    """Attention view of a slow step of `decoder=sfi`: dense attention over the whole cache whose query
    rows reach the Selector (`SFI.observe`). Where the split decode attention serves the step (one row,
    float32, CPU, a long cache) it computes the logits of every cached key anyway; the Selector gets
    those instead of computing them a second time (same numbers: the same product, in slot order)."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        pol = self.policy
        if not (pol.slow and split_applies(q, k)):
            return super().attend(layer, q, k, v)
        logits = decode_logits(q, k, self.scale)  # [hkv, G, cache_len + 1]: the new token last
        pol.gather_evidence(layer, q[0], pol.engine.cache.length, logits)
        return decode_weighted_values(torch.softmax(logits, dim=-1), v, q.shape[1])


class SFIFastView:
    """Attention view of one fast step (one query row) of `decoder=sfi` with `kv=sfi backend=sliced`."""

    kind: ClassVar[ViewKind] = ViewKind.REGION_GATHERABLE  # with graphs on, read by gather (one shape)

    def __init__(self, policy: Any, region: Any) -> None:
        self.policy, self.region = policy, region
        self.scale = region.engine.scale
        self._read: list[int] = []

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        pol, reg = self.policy, self.region
        cache_len = k.shape[2] - 1
        if pol.keeps_all(layer, cache_len):
            self._read.append(cache_len)
            pol.activity.note(layer, cache_len, cache_len)
            return one_row_attention(q, k, v, self.scale)
        pol.pack_long_range(layer, cache_len)
        rl = reg.region_len[layer]
        start = cache_len - min(pol.recent, cache_len)
        m, low, total = reg.lengths(layer)  # read once per packing, not per step
        if m > start:
            raise RuntimeError(f"kv=sfi: the packed set ({m} slots) reaches the recent window (slot {start})")
        out = one_row_two_slices(
            q, k[:, :, :m], v[:, :, :m], rl, k[:, :, start:], v[:, :, start:], self.scale, low < m
        )
        read = total // rl.numel() + cache_len - start
        self._read.append(read)
        pol.activity.note(layer, read, cache_len)
        return out

    def kv_read(self, cache_len: int) -> int:
        """Mean over layers of cached entries read per KV head."""
        return round(sum(self._read) / len(self._read)) if self._read else cache_len
