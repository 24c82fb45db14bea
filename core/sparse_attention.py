"""Sparse attention backends that skip the masked-out KV for real.

The dense reference is SDPA with a boolean mask (`core.attention`, `kv_policies.view.RestrictedView`):
it costs the same whatever the mask says. The backends here only touch the KV blocks a
query may see, for the compressed-region layout of FAFO (FAFO §4.4, App. H, Algorithm 1): the
entries a KV policy selects live in slots `[0, region_len[h])` at the head of the KV tensor (per KV
head h), so the rows restricted to the policy read the first `ceil(region_len / 128)` KV blocks plus the
block(s) of the new tokens, whatever the context length.

- `RegionBlockMask` (backend `flex`): ONE FlexAttention `BlockMask` per query layout, over the
  whole static KV tensor (`KV_LEN = cache capacity`), built once. Per step and layer only a few
  integers change: the cache length and the region lengths (0-d / `[n_kv_heads]` tensors read by the
  `mask_mod` inside the kernel) and the block table (`kv_num_blocks` / `kv_indices`, rewritten in
  place). Nothing is recompiled and no `create_block_mask` runs per step (the paper's "static block
  mask"; rebuilding costs as much as the attention on CPU). Compiled flex is required for the skip: eager
  flex materialises the full score matrix. `BLOCK_SIZE = (q_block, 128)` with
  `q_block = n` for a uniform block.
- `sliced_attend` (backend `sliced`): SDPA over the region slice `k[:, :, :max(region_len)]` (a view,
  no copy) concatenated with the block's keys; works on any device.
- flash-attn (backend `flash`, CUDA only, optional): `flash_region_attend` runs the region through
  `flash_attn_varlen_func` (one "sequence" per KV head, so every head can have its own region length),
  the block part with a small masked attention, and merges the two with their log-sum-exps.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import BlockMask, flex_attention

from core.attention import one_row_attention

log = logging.getLogger(__name__)

KV_BLOCK = 128


@functools.lru_cache(maxsize=4)
def flex_attention_fn(compiled: bool = True, dynamic: bool = True) -> Callable:
    """FlexAttention, compiled once per process (`dynamic=True`: one graph serves every cache
    capacity, so a new prompt length never recompiles)."""
    if not compiled:
        return flex_attention
    import torch._dynamo.config as dynamo_config

    # static compiles (one per cache capacity / layout) must not hit dynamo's default limit of 8,
    # after which it silently falls back to eager flex (which materialises every score)
    dynamo_config.recompile_limit = max(dynamo_config.recompile_limit, 64)
    return torch.compile(flex_attention, dynamic=dynamic)


_STATIC_ONLY = False


def compiled_flex(*args, **kwargs) -> torch.Tensor:
    """Compiled flex, dynamic shapes first. torch 2.13's CPU template miscompiles (C++ error) when a
    process that already compiled one head layout recompiles for another; then, and for the rest of the
    process, a static compile per shape is used (one compile per cache capacity)."""
    global _STATIC_ONLY
    if not _STATIC_ONLY:
        try:
            return flex_attention_fn(True, True)(*args, **kwargs)
        except Exception as exc:  # InductorError / BackendCompilerFailed; a static failure raises below
            _STATIC_ONLY = True
            log.warning(
                "dynamic-shape flex compile failed (%s); using static compiles from now on",
                exc.__class__.__name__,
            )
    return flex_attention_fn(True, False)(*args, **kwargs)


def default_q_block(n: int, uniform: bool, cuda: bool) -> int:
    """Query rows per BlockMask block. CPU: the whole block when every row has the same visibility,
    else 16-row tiles. CUDA: a power of two in [16, 128], since
    it doubles as the Triton kernel's BLOCK_M."""
    if not cuda:
        return n if uniform else min(n, 16)
    return 16 if not uniform else min(128, max(16, 1 << (n - 1).bit_length()))


def flash_available(device: torch.device | str) -> bool:
    """True when flash-attn can serve `device` (CUDA build of torch + flash_attn importable)."""
    return torch.device(device).type == "cuda" and importlib.util.find_spec("flash_attn") is not None


def _dense_to_table(mask: torch.Tensor, num: torch.Tensor, idx: torch.Tensor) -> None:
    """Write a dense `[q_blocks, kv_blocks]` block choice into (count, ordered indices) tensors in place."""
    num.copy_(mask.sum(-1).to(num.dtype))
    idx.copy_(torch.argsort((~mask).to(torch.int8), dim=-1, stable=True).to(idx.dtype))


class RegionBlockMask:
    """A static FlexAttention BlockMask for `n` query rows over a KV tensor of `kv_len` slots.

    Row r sees: if `restricted[r]`, the cache slots `< region_len[kv_head]` (the compressed region);
    otherwise every cache slot `< cache_len`; and always the new block `[cache_len, cache_len + n)`
    through `block_vis[r]`. `update(cache_len, region_len)` before each call; `set_layout` when the
    block's visibility changes (same `n`).
    """

    def __init__(
        self,
        n: int,
        kv_len: int,
        n_heads: int,
        n_kv_heads: int,
        restricted: torch.Tensor,
        block_vis: torch.Tensor,
        q_block: int | None = None,
    ) -> None:
        dev = block_vis.device
        self.n, self.kv_len, self.group = n, kv_len, n_heads // n_kv_heads
        uniform = bool(restricted.all()) or not bool(restricted.any())
        self.cuda = dev.type == "cuda"
        self.q_block = q_block or default_q_block(n, uniform, self.cuda)
        self.n_qb = -(-n // self.q_block)
        rows = self.n_qb * self.q_block  # padded so the kernel never indexes past the layout
        self.n_kb = -(-kv_len // KV_BLOCK)
        self.cache_len = torch.zeros((), dtype=torch.long, device=dev)
        self.region_len = torch.zeros(n_kv_heads, dtype=torch.long, device=dev)
        self._region_len_q = torch.zeros(n_heads, dtype=torch.long, device=dev)  # per query head
        self.restricted = torch.zeros(rows, dtype=torch.bool, device=dev)
        self.block_vis = torch.zeros(rows, n, dtype=torch.bool, device=dev)
        shape = (1, 1, self.n_qb)
        self._num = torch.zeros(shape, dtype=torch.int32, device=dev)
        self._idx = torch.zeros((*shape, self.n_kb), dtype=torch.int32, device=dev)
        self._full_num = torch.zeros(shape, dtype=torch.int32, device=dev)
        self._full_idx = torch.zeros((*shape, self.n_kb), dtype=torch.int32, device=dev)
        self._kb = torch.arange(self.n_kb, device=dev)
        self.owner: object | None = None  # the view that last set the layout
        self.set_layout(restricted, block_vis)
        self.block_mask = BlockMask.from_kv_blocks(
            self._num,
            self._idx,
            self._full_num,
            self._full_idx,
            BLOCK_SIZE=(self.q_block, KV_BLOCK),
            mask_mod=self._mask_mod(),
            seq_lengths=(n, kv_len),
            compute_q_blocks=False,
        )

    def _mask_mod(self) -> Callable:
        # only tensors in the closure: a captured Python int becomes a symbol under dynamic=True and
        # trips the CPU template's codegen (torch 2.13)
        cache_len, region_len = self.cache_len, self._region_len_q
        restricted, block_vis = self.restricted, self.block_vis
        last = torch.tensor(self.n - 1, device=cache_len.device)

        def mask_mod(b, h, q_idx, kv_idx):
            rel = kv_idx - cache_len
            in_block = (rel >= 0) & (rel <= last) & block_vis[q_idx, torch.minimum(rel.clamp(min=0), last)]
            in_cache = (kv_idx < cache_len) & ((kv_idx < region_len[h]) | ~restricted[q_idx])
            return in_cache | in_block

        return mask_mod

    def set_layout(self, restricted: torch.Tensor, block_vis: torch.Tensor) -> None:
        if block_vis.shape != (self.n, self.n) or restricted.shape != (self.n,):
            raise ValueError(
                f"layout of {self.n} rows expected, got block {tuple(block_vis.shape)}, "
                f"restricted {tuple(restricted.shape)}"
            )
        self.restricted[: self.n] = restricted
        self.block_vis[: self.n] = block_vis
        by_qb = self.restricted.view(self.n_qb, self.q_block)
        real = (torch.arange(self.n_qb * self.q_block, device=by_qb.device) < self.n).view_as(by_qb)
        self._has_r = (by_qb & real).any(1)
        self._has_f = (~by_qb & real).any(1)
        self._key: tuple | None = None

    def update(self, cache_len: int, region_len: torch.Tensor) -> None:
        """Point the mask at the current cache length and region lengths (in place, no rebuild)."""
        self.cache_len.fill_(cache_len)
        self.region_len.copy_(region_len)
        self._region_len_q.copy_(region_len.repeat_interleave(self.group))
        lo, hi = int(region_len.min()), int(region_len.max())
        key = (cache_len, lo, hi)
        if key == self._key:
            return
        self._key = key
        if cache_len + self.n > self.kv_len:
            raise ValueError(f"cache length {cache_len} + block {self.n} exceeds the KV length {self.kv_len}")
        b = self._kb
        full_region = b < lo // KV_BLOCK  # inside every head's region: no mask needed
        full_cache = b < cache_len // KV_BLOCK
        any_region = b < -(-hi // KV_BLOCK)
        any_cache = b < -(-cache_len // KV_BLOCK)
        in_block = (b >= cache_len // KV_BLOCK) & (b < -(-(cache_len + self.n) // KV_BLOCK))
        has_r, has_f = self._has_r[:, None], self._has_f[:, None]
        full = full_region[None] | (full_cache[None] & ~has_r)
        partial = ~full & ((has_r & any_region[None]) | (has_f & any_cache[None]) | in_block[None])
        _dense_to_table(full, self._full_num[0, 0], self._full_idx[0, 0])
        _dense_to_table(partial, self._num[0, 0], self._idx[0, 0])

    def blocks_read(self) -> int:
        """KV blocks the kernel loads for all query blocks together (a work measure)."""
        return int(self._num.sum() + self._full_num.sum())

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, compiled: bool = True
    ) -> torch.Tensor:
        """q `[1, H, n, d]`, k/v `[1, H_kv, kv_len, d]` (the whole static cache tensor)."""
        kw = {"block_mask": self.block_mask, "scale": scale, "enable_gqa": q.shape[1] != k.shape[1]}
        if self.cuda:  # Triton tiles must divide the mask's blocks (BLOCK_M=q_block, BLOCK_N | 128)
            kw["kernel_options"] = {"BLOCK_M": self.q_block, "BLOCK_N": 64}
        if not compiled:
            return flex_attention_fn(False)(q, k, v, **kw)
        return compiled_flex(q, k, v, **kw)


# --- gathered / flash paths ----------------------------------------------------------------------
def sliced_attend(
    q: torch.Tensor,
    k_region: torch.Tensor,
    v_region: torch.Tensor,
    region_len: torch.Tensor,
    k_block: torch.Tensor,
    v_block: torch.Tensor,
    block_vis: torch.Tensor,
    scale: float,
    plain: bool | None = None,
) -> torch.Tensor:
    """Rows `q [1, H, r, d]` over the region slice `[1, H_kv, R, d]` (slot < region_len[h] valid) and
    the block keys `[1, H_kv, n, d]` with `block_vis [r, n]`. Dense math over R + n keys only.
    `plain`: whether every region slot and block key is visible, when the caller knows (None: read
    from `region_len` and `block_vis`; False: take the masked path without reading)."""
    h, r, hkv, big_r, n = q.shape[1], q.shape[2], k_region.shape[1], k_region.shape[2], k_block.shape[2]
    k = torch.cat([k_region, k_block], dim=2)
    v = torch.cat([v_region, v_block], dim=2)
    if plain is None and r == 1:
        plain = bool((region_len == big_r).all()) and bool(block_vis.all())
    if r == 1 and plain:  # a decode step, no mask
        return one_row_attention(q, k, v, scale)
    mask = torch.empty(hkv, r, big_r + n, dtype=torch.bool, device=q.device)
    mask[:, :, :big_r] = (torch.arange(big_r, device=q.device)[None, :] < region_len[:, None])[:, None, :]
    mask[:, :, big_r:] = block_vis
    if h != hkv:
        mask = mask.repeat_interleave(h // hkv, dim=0)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None], scale=scale, enable_gqa=h != hkv)


def attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain attention returning (out `[1, H, r, d]`, lse `[1, H, r]`), for small key sets (the block).
    Rows with nothing visible get out = 0 and lse = -inf."""
    h, hkv = q.shape[1], k.shape[1]
    if h != hkv:
        k, v = k.repeat_interleave(h // hkv, dim=1), v.repeat_interleave(h // hkv, dim=1)
    s = (q.float() @ k.float().transpose(-1, -2)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1).clamp(min=torch.finfo(s.dtype).min)).nan_to_num(0.0)
    return (p @ v.float()).to(q.dtype), lse


def merge_lse(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor) -> torch.Tensor:
    """Softmax over the union of two disjoint key sets from each part's output and log-sum-exp."""
    m = torch.maximum(lse1, lse2)
    w1, w2 = torch.exp(lse1 - m).nan_to_num(0.0), torch.exp(lse2 - m).nan_to_num(0.0)
    out = (o1.float() * w1.unsqueeze(-1) + o2.float() * w2.unsqueeze(-1)) / (w1 + w2).unsqueeze(-1)
    return out.to(o1.dtype)


def flash_region_attend(
    q: torch.Tensor,
    k_region: torch.Tensor,
    v_region: torch.Tensor,
    region_len: torch.Tensor,
    k_block: torch.Tensor,
    v_block: torch.Tensor,
    block_vis: torch.Tensor,
    scale: float,
    varlen: Callable | None = None,
) -> torch.Tensor:
    """Like `sliced_attend`, with the region part on flash-attn's varlen kernel: KV head j's query
    heads (all rows) form sequence j, its keys are `k_region[j, :region_len[j]]`. `varlen` defaults to
    `flash_attn.flash_attn_varlen_func` (tests pass a reference with the same signature)."""
    if varlen is None:
        from flash_attn import flash_attn_varlen_func as varlen
    _, h, r, d = q.shape
    hkv = k_region.shape[1]
    g = h // hkv
    lens = region_len.to(torch.int32)
    qs = q[0].reshape(h * r, 1, d)  # head-major: sequence j = query heads j*g .. j*g+g-1, all rows
    keep = torch.arange(k_region.shape[2], device=q.device)[None, :] < region_len[:, None]
    ks = k_region[0][keep].unsqueeze(1)  # [sum(lens), 1, d], head-major
    vs = v_region[0][keep].unsqueeze(1)
    cu_q = torch.arange(0, (hkv + 1) * g * r, g * r, dtype=torch.int32, device=q.device)
    cu_k = F.pad(lens.cumsum(0, dtype=torch.int32), (1, 0))
    o1, lse1, _ = varlen(
        qs,
        ks,
        vs,
        cu_q,
        cu_k,
        g * r,
        int(lens.max()),
        softmax_scale=scale,
        causal=False,
        return_attn_probs=True,
    )
    o1 = o1.reshape(1, h, r, d)
    lse1 = lse1.reshape(1, h, r)  # flash-attn returns [n_heads=1, total_q]
    o2, lse2 = attention_with_lse(q, k_block, v_block, block_vis[None, None], scale)
    return merge_lse(o1, lse1, o2, lse2)
