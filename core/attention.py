"""Attention views: how a block of new queries sees [cache | block].

A *view* is handed to every layer of one forward. `attend(layer, q, k, v)` gets
q `[1, H, n, d]` and k/v `[1, H_kv, L + n, d]` (cache slots then the block) and returns `[1, H, n, d]`.
`kv_read(cache_len)` reports how many cached entries one layer/KV-head reads (hardware-independent
cost, recorded per forward).

- `CausalView`: every query sees the whole cache plus the block causally (vanilla, prefill).
  A few rows over a long float32 CPU cache (a verification block) take `few_rows_attention`.
- `BlockView`: the whole cache visible to every row, a boolean `[n, n]` visibility inside the block
  (Jacobi windows, candidate tries, prompt-lookup chains over the full cache). Its cost is known without
  reading the mask, and `core.decode_graph` stages it without building an `[n, L + n]` mask per step.
- `MaskView`: an arbitrary boolean visibility `[n, L + n]` or per-head `[H, n, L + n]` (tree / Jacobi /
  fumble layouts). Dense SDPA with a mask: the reference every sparse path is tested against.
Sparse views (FlexAttention block masks, KV-policy restricted views) live next to their users and
follow the same two-method shape.

Every view says what it is with one `kind` (`ViewKind`), the one thing the engine dispatches on
(`core.decode_graph.fits` and `StaticForwards.forward_for`): which fixed-shape forward can replay it,
or none.
"""

from __future__ import annotations

import enum
from typing import ClassVar, Protocol

import torch
import torch.nn.functional as F


class ViewKind(enum.Enum):
    """What a view lets a forward see, as far as the engine needs to know to choose the forward."""

    REGULAR = "regular"  # the regular forward only (per-head masks, hybrid trees, a region's layout)
    CAUSAL = "causal"  # the whole cache, causal inside the block (`CausalView`)
    CAUSAL_SHOWN_TO_POLICY = "causal_shown"  # `CAUSAL` whose every layer's queries a policy is shown
    WHOLE_CACHE_BLOCK = "whole_cache_block"  # the whole cache, `block_mask [n, n]` inside the block
    MASK = "mask"  # one visibility `mask [n, L + n]` for every layer and head
    HOLE = "hole"  # the whole cache but `cache_hole` for the restricted rows (`HoleView`)
    LAYER_SELECTION = "layer_selection"  # a per-layer selection chosen before the forward
    SELECTED_IN_FORWARD = "selected_in_forward"  # each layer's selection made from its own queries
    # a compressed region's layout (the regular forward); with graphs on the same step reads the same
    # set by gather with one shape, so it counts as a fixed-shape step
    REGION_GATHERABLE = "region_gatherable"


class View(Protocol):
    """What every attention view offers the engine."""

    kind: ViewKind

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor: ...

    def kv_read(self, cache_len: int) -> object: ...


def sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    scale: float,
    is_causal: bool = False,
) -> torch.Tensor:
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=q.shape[1] != k.shape[1]
    )


# one query row over this many keys or more takes the split path on CPU (`decode_attention`)
SPLIT_MIN_KEYS = 2048
SPLIT_CHUNK = 1024


# PyTorch's CPU softmax over a last dimension of fewer than 16 elements runs a scalar loop: about 100 ns
# an element, ten times the vectorised kernel's, so [30, 3, 72, 11] takes 1.2 ms and [30, 3, 72, 16]
# 0.13 ms (measured on an AVX-512 EPYC, torch 2.13)
SOFTMAX_MIN_CPU = 16


def softmax_lastdim(x: torch.Tensor) -> torch.Tensor:
    """`x.softmax(-1)`; on a CPU, a last dimension under `SOFTMAX_MIN_CPU` is padded with -inf columns
    (their probability is exactly zero) and the result cut back, to take the vectorised kernel."""
    m = x.shape[-1]
    if x.device.type != "cpu" or m >= SOFTMAX_MIN_CPU or m == 0:
        return x.softmax(-1)
    return F.pad(x, (0, SOFTMAX_MIN_CPU - m), value=float("-inf")).softmax(-1)[..., :m]


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """One query row per head over every key (`q [1, H, 1, d]`, k/v `[1, H_kv, L, d]`), for float32 on
    CPU: the group's query heads share one pass over their KV head, and the softmax-weighted sum of the
    values is split into chunks of `SPLIT_CHUNK` keys computed as one batched GEMM and summed. SDPA's
    CPU kernel runs that sum as a GEMM with a long reduction and few output rows, which keeps a core
    idle; split, both cores stream the values. Equal to SDPA to float32 rounding (not bit-identical)."""
    return decode_weighted_values(torch.softmax(decode_logits(q, k, scale), dim=-1), v, q.shape[1])


def decode_logits(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """The first half of `decode_attention`: the scaled logits `[H_kv, G, L]` of one query row per head
    (`q [1, H, 1, d]`, G = H / H_kv query heads per KV head) over every key of `k [1, H_kv, L, d]`."""
    hkv, d = k.shape[1], k.shape[3]
    qg = q.view(hkv, q.shape[1] // hkv, d)
    return torch.matmul(k[0], qg.transpose(1, 2)).transpose(1, 2) * scale


def decode_weighted_values(p: torch.Tensor, v: torch.Tensor, h: int) -> torch.Tensor:
    """The second half of `decode_attention`: the attention weights `p [H_kv, G, L]` times the values
    `v [1, H_kv, L, d]`, as `[1, H, 1, d]` (the sum split into chunks of `SPLIT_CHUNK` keys)."""
    hkv, length, d = v.shape[1], v.shape[2], v.shape[3]
    v0, g = v[0], h // hkv
    n = length // SPLIT_CHUNK
    main = n * SPLIT_CHUNK
    pc = p[:, :, :main].unflatten(2, (n, SPLIT_CHUNK)).transpose(1, 2).reshape(hkv * n, g, SPLIT_CHUNK)
    vc = v0[:, :main].reshape(hkv * n, SPLIT_CHUNK, d)
    out = torch.bmm(pc, vc).view(hkv, n, g, d).sum(1)
    if main < length:
        out = out + torch.matmul(p[:, :, main:], v0[:, main:])
    return out.reshape(1, h, 1, d)


def split_applies(q: torch.Tensor, k: torch.Tensor) -> bool:
    """`decode_attention` serves this attention: one row, float32, CPU, a cache long enough to gain."""
    return (
        q.shape[2] == 1
        and q.shape[0] == 1
        and q.device.type == "cpu"
        and q.dtype == torch.float32
        and k.shape[2] >= SPLIT_MIN_KEYS
        and q.shape[1] % k.shape[1] == 0
    )


def one_row_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """A block of one query row that sees every key: `decode_attention` where it applies, SDPA otherwise."""
    if split_applies(q, k):
        return decode_attention(q, k, v, scale)
    return sdpa(q, k, v, None, scale)


# a block of at most this many query rows over SPLIT_MIN_KEYS keys or more takes `few_rows_attention` on CPU
FEW_ROWS_MAX = 10


def few_rows_applies(q: torch.Tensor, k: torch.Tensor) -> bool:
    """`few_rows_attention` serves this block: 2..FEW_ROWS_MAX rows, float32, CPU, a long cache."""
    n = q.shape[2]
    return (
        1 < n <= FEW_ROWS_MAX
        and q.shape[0] == 1
        and q.device.type == "cpu"
        and q.dtype == torch.float32
        and k.shape[2] - n >= SPLIT_MIN_KEYS
        and q.shape[1] % k.shape[1] == 0
    )


def few_rows_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: torch.Tensor, scale: float
) -> torch.Tensor:
    """A block of n query rows (`q [1, H, n, d]`) over [cache | block] (`k/v [1, H_kv, L + n, d]`):
    every cache key visible, `block_mask [n, n]` (True = visible) over the block. For float32 on CPU
    (a verification block over a long cache): the G = H / H_kv query heads of a group and the n rows
    are one GEMM over their KV head and the scores are laid out row-major for the softmax
    (`bench_block_cost --sdpa-column` compares it with masked SDPA). Equal to SDPA with the same mask
    to float32 rounding (not bit-identical)."""
    h, n, d = q.shape[1], q.shape[2], q.shape[3]
    hkv = k.shape[1]
    g = h // hkv
    cache_len = k.shape[2] - n
    qg = q[0].reshape(hkv, g * n, d)  # rows are (group member, query) pairs
    scores = torch.matmul(qg, k[0].transpose(1, 2)).mul_(scale)  # [H_kv, G*n, L+n]
    scores[:, :, cache_len:].masked_fill_(~block_mask.to(q.device).repeat(g, 1), float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), v[0])  # [H_kv, G*n, d]
    return out.reshape(1, h, n, d)


def one_row_two_slices(
    q: torch.Tensor,
    k1: torch.Tensor,
    v1: torch.Tensor,
    len1: torch.Tensor,
    k2: torch.Tensor,
    v2: torch.Tensor,
    scale: float,
    uneven: bool | None = None,
) -> torch.Tensor:
    """One query row per head (`q [1, H, 1, d]`) over two key/value slices read where they lie, with
    one softmax over both: `k1/v1 [1, H_kv, M, d]` of which the first `len1[h]` keys of KV head h are
    valid, and `k2/v2 [1, H_kv, T, d]` all valid. The group's query heads share one pass over their KV
    head. Equal to SDPA over the concatenated valid keys to float32 rounding, without copying them.
    `uneven`: whether some `len1[h] < M`, when the caller knows (None: read from `len1`)."""
    hkv, m, d = k1.shape[1], k1.shape[2], k1.shape[3]
    h = q.shape[1]
    qg = q.reshape(hkv, h // hkv, d).transpose(1, 2)  # [hkv, d, g]
    s1 = torch.matmul(k1[0], qg).transpose(1, 2)  # [hkv, g, M]: keys as the tall side
    if bool((len1 < m).any()) if uneven is None else uneven:
        pad = torch.arange(m, device=q.device)[None, None, :] >= len1.to(q.device)[:, None, None]
        s1 = s1.masked_fill(pad, float("-inf"))
    s2 = torch.matmul(k2[0], qg).transpose(1, 2)  # [hkv, g, T]
    p = torch.softmax(torch.cat([s1, s2], dim=-1) * scale, dim=-1)
    out = torch.matmul(p[:, :, :m], v1[0]) + torch.matmul(p[:, :, m:], v2[0])
    return out.reshape(1, h, 1, d)


class CausalView:
    """Whole cache visible; causal inside the block."""

    kind: ClassVar[ViewKind] = ViewKind.CAUSAL

    def __init__(self, scale: float) -> None:
        self.scale = scale
        self._mask: torch.Tensor | None = None
        self._tril: torch.Tensor | None = None  # the block part alone, for `few_rows_attention`

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        n, total = q.shape[2], k.shape[2]
        if n == 1:
            return one_row_attention(q, k, v, self.scale)
        if total == n:  # empty cache: plain causal
            return sdpa(q, k, v, None, self.scale, is_causal=True)
        if few_rows_applies(q, k):
            if self._tril is None or self._tril.shape[0] != n:
                self._tril = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
            return few_rows_attention(q, k, v, self._tril, self.scale)
        if self._mask is None or self._mask.shape != (n, total):
            self._mask = causal_block_mask(n, total - n, q.device)
        return sdpa(q, k, v, self._mask, self.scale)

    def kv_read(self, cache_len: int) -> int:
        return cache_len


def causal_block_mask(n: int, cache_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Boolean `[n, cache_len + n]`: all cache, causal over the block."""
    mask = torch.ones(n, cache_len + n, dtype=torch.bool, device=device)
    mask[:, cache_len:] = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    return mask


class BlockView:
    """The whole cache visible to every row; `block_mask [n, n]` (True = visible) inside the block. Dense
    SDPA with the mask `[cache: all | block_mask]`, exactly as `MaskView` over that mask."""

    kind: ClassVar[ViewKind] = ViewKind.WHOLE_CACHE_BLOCK

    def __init__(self, block_mask: torch.Tensor, scale: float) -> None:
        self.block_mask = block_mask
        self.scale = scale
        self._mask: torch.Tensor | None = None  # [n, L + n], built by the first layer of the forward

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        n, total = q.shape[2], k.shape[2]
        if self._mask is None or self._mask.shape[1] != total or self._mask.device != q.device:
            self._mask = torch.ones(n, total, dtype=torch.bool, device=q.device)
            self._mask[:, total - n :] = self.block_mask
        return sdpa(q, k, v, self._mask, self.scale)

    def kv_read(self, cache_len: int) -> int:
        return cache_len


class MaskView:
    """Dense SDPA with an explicit visibility mask (True = may attend)."""

    kind: ClassVar[ViewKind] = ViewKind.MASK

    def __init__(self, mask: torch.Tensor, scale: float) -> None:
        self.mask = mask if mask.dim() == 2 else mask.unsqueeze(0)
        self.scale = scale

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        mask = self.mask.to(q.device)
        if mask.dim() == 3 and mask.shape[0] != q.shape[1]:  # per-KV-head mask -> per query head
            mask = mask.repeat_interleave(q.shape[1] // mask.shape[0], dim=0)
        return sdpa(q, k, v, mask, self.scale)

    def kv_read(self, cache_len: int) -> int:
        block = self.mask[..., :cache_len]
        seen = block.reshape(-1, block.shape[-2], cache_len).any(dim=-2)  # [heads, cache_len]
        return int(seen.sum(dim=-1).float().mean().item())
