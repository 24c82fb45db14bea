"""FAFO's compressed-region KV layout: "physically contiguous, logically sparse" (FAFO §4.4, App. H).

A KV policy's selection lives in a fixed, block-aligned region at the head of the KV tensors:
for every layer and KV head, slots `[0, region_len)` hold exactly the selected entries (in some order)
and every other entry sits somewhere after them. When the selection changes, entries are swapped in and
out (App. H, Fig. 5: a new entry trades places with an evicted one), so the restricted query rows only
ever read the first `ceil(size / 128)` KV blocks and one static block mask serves every step
(`core.sparse_attention.RegionBlockMask`). Keys are post-RoPE, so a physical permutation never changes
attention; causality only matters inside the new block, which always sits right after the cache.

- Shared selections (the same set for every layer and head: StreamingLLM) are moved with
  `engine.cache.swap_slots` once per step, keeping `cache.slot_pos` right for everyone.
- Per-layer / per-head selections (Quest, SnapKV, H2O) are moved per (layer, KV head) with one indexed
  swap per layer; the region's `pos` table (logical position of each slot) is then the truth and the
  policy finds entries through it (`policy.slots.physical`). `cache.slot_pos` is not updated in that case.
- Placement only moves entries that must move: the selected entries found at slots >= region_len trade
  places with the unselected ones inside `[0, region_len)` ("holes"), pairwise, per head.

The region assumes committed entries sit at logical positions 0..length-1 (true for every decoder:
commit appends accepted tokens in order). Call `restore()` before `engine.crop()` to a length that
would cut entries the region moved (it raises otherwise, instead of attending to lost entries).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from core.attention import ViewKind, one_row_attention, sdpa
from core.sparse_attention import (
    KV_BLOCK,
    RegionBlockMask,
    flash_available,
    flash_region_attend,
    sliced_attend,
)
from core.types import HarnessError, PolicyEngine

if TYPE_CHECKING:
    from kv_policies.base import KVPolicy

REGION_BACKENDS = ("flex", "sliced", "flash")
# one static BlockMask per (layout size, KV length, heads, ...), reused across generations
_MASKS: OrderedDict[tuple, RegionBlockMask] = OrderedDict()


def _mask_for(
    n: int,
    kv_len: int,
    h: int,
    hkv: int,
    restricted: torch.Tensor,
    block_vis: torch.Tensor,
    q_block: int | None,
) -> RegionBlockMask:
    key = (n, kv_len, h, hkv, str(block_vis.device), q_block, bool(restricted.all()))
    mask = _MASKS.get(key)
    if mask is None:
        mask = RegionBlockMask(n, kv_len, h, hkv, restricted, block_vis, q_block)
        _MASKS[key] = mask
        if len(_MASKS) > 16:
            _MASKS.popitem(last=False)
    else:
        _MASKS.move_to_end(key)
        mask.set_layout(restricted, block_vis)
    return mask


def gathers(policy: KVPolicy, rows: slice | None) -> bool:
    """Whether a compressed-region backend's block with restricted `rows` reads its selection by
    gather on an engine with fixed-shape forwards (`gathered_view`): every row restricted, by a
    policy that chooses before the forward. Otherwise the region lays the step out."""
    return rows == slice(None) and policy.query_free


class CompressedRegion:
    """Keeps `policy`'s selection in slots `[0, region_len[layer, head])` of `engine.cache`."""

    def __init__(
        self,
        policy: KVPolicy,
        engine: PolicyEngine,
        backend: str = "flex",
        compiled: bool = True,
        q_block: int | None = None,
    ) -> None:
        if backend not in REGION_BACKENDS:
            raise HarnessError(f"compressed-region backend must be one of {REGION_BACKENDS}, got {backend!r}")
        if backend == "flash" and not flash_available(engine.device):
            raise HarnessError(
                "backend=flash needs a CUDA device and flash-attn installed "
                "(`pip install .[gpu]`); use backend=flex"
            )
        cache = engine.cache
        self.policy, self.engine, self.cache, self.backend = policy, engine, cache, backend
        self.compiled, self.q_block = compiled, q_block
        need = policy.max_selected(cache.capacity)
        self.size = min(-(-need // KV_BLOCK) * KV_BLOCK, cache.capacity)
        nl, hkv, cap, dev = cache.n_layers, cache.n_kv_heads, cache.capacity, cache.device
        self.pos = torch.arange(cap, device=dev).expand(nl, hkv, cap).clone()  # logical position at slot
        self.where = self.pos.clone()  # slot of logical position
        length = cache.length
        if length:
            sp = cache.slot_pos[:length]
            self.pos[:, :, :length] = sp
            self.where[:, :, sp] = torch.arange(length, device=dev)
        self.synced = length
        self.region_len = torch.zeros(nl, hkv, dtype=torch.long, device=dev)
        self._shared_at = -1
        self.placed: dict[int, Any] = {}  # layer -> the policy's `selection_key` of what is in place
        self._lengths: dict[int, tuple[int, int, int]] = {}  # layer -> region_len's (max, min, sum)
        self.swaps = 0  # entries moved so far (a cost measure)
        policy.slots.follow(self)  # the policy finds its entries through this region from now on

    # --- bookkeeping ---------------------------------------------------------------------------
    @torch.inference_mode()
    def sync(self, length: int | None = None) -> None:
        """Adopt entries committed since the last call (they sit at slot == position)."""
        length = self.cache.length if length is None else length
        if length > self.synced:
            fresh = torch.arange(self.synced, length, device=self.pos.device)
            if not torch.equal(self.cache.slot_pos[self.synced : length], fresh):
                raise RuntimeError("compressed region: committed entries must have positions 0..length-1")
            self.pos[:, :, fresh] = fresh
            self.where[:, :, fresh] = fresh
        elif length < self.synced:
            if bool((self.pos[:, :, :length] >= length).any()):
                raise RuntimeError(
                    "engine.crop() cut entries the compressed region had moved; "
                    "call region.restore() before cropping"
                )
            tail = torch.arange(length, self.synced, device=self.pos.device)
            self.pos[:, :, tail] = tail
            self.where[:, :, tail] = tail
            self.region_len.clamp_(max=length)
            self._shared_at = -1
            self._forget_placements()
        self.synced = length

    def _forget_placements(self, layers: Iterable[int] | None = None) -> None:
        """The region lengths (and what is in place) of `layers`, or of every layer, changed."""
        if layers is None:
            self.placed.clear()
            self._lengths.clear()
        for layer in layers or ():
            self.placed.pop(layer, None)
            self._lengths.pop(layer, None)

    def read_lengths(self) -> None:
        """Read every layer's `lengths` at once (after a placement of every layer)."""
        rl = self.region_len
        values = torch.stack([rl.amax(1), rl.amin(1), rl.sum(1)], dim=1).tolist()
        self._lengths = {layer: (top, low, total) for layer, (top, low, total) in enumerate(values)}

    def lengths(self, layer: int) -> tuple[int, int, int]:
        """(longest, shortest, total) of layer `layer`'s region lengths over its KV heads: read back once
        per placement."""
        if layer not in self._lengths:
            self.read_lengths()  # every layer's in the same one read
        return self._lengths[layer]

    def positions(self, layer: int, cache_len: int) -> torch.Tensor:
        """long `[n_kv_heads, cache_len]`: logical position held by each slot."""
        self.sync()
        return self.pos[layer, :, :cache_len]

    def slots_of(self, layer: int, positions: torch.Tensor) -> torch.Tensor:
        """long `[n_kv_heads, m]`: slot of each logical position (`positions [n_kv_heads, m]`)."""
        self.sync()
        return self.where[layer].gather(1, positions)

    # --- placement -----------------------------------------------------------------------------
    @torch.inference_mode()
    def place(self, layer: int, sel: torch.Tensor) -> None:
        """Make slots `[0, m_h)` of (layer, head h) hold exactly the logical positions selected in
        `sel [n_kv_heads, L]` (m_h = its count). Shared policies: once per cache length, all layers."""
        length = sel.shape[1]
        self.sync(length)
        if self.policy.shared:
            if self._shared_at == length:
                return
            self._place_shared(sel[0])
            self._shared_at = length
            self._forget_placements()
            return
        layers = torch.full((1,), layer, dtype=torch.long, device=sel.device)
        self._place_per_head(layers, sel[None])
        self._forget_placements([layer])

    @torch.inference_mode()
    def place_layers(self, sel: torch.Tensor, layers: list[int] | None = None) -> None:
        """`place` for several layers at once (a per-layer / per-head policy): `sel [len(layers),
        n_kv_heads, L]` (default: every layer). One set of indexed copies for all of them instead of one
        per layer."""
        self.sync(sel.shape[-1])
        layers = list(range(sel.shape[0])) if layers is None else layers
        self._place_per_head(torch.tensor(layers, dtype=torch.long, device=sel.device), sel)
        self._forget_placements(layers)

    def _place_per_head(self, layers: torch.Tensor, sel: torch.Tensor) -> None:
        """Place `sel [len(layers), n_kv_heads, L]` for the layers listed in `layers` (per-head moves)."""
        length = sel.shape[-1]
        m = sel.sum(-1)  # [layers, heads]
        self._check(m)
        at_slot = sel.gather(2, self.pos[layers, :, :length])
        inside = torch.arange(length, device=sel.device) < m[..., None]
        li, heads, holes = (inside & ~at_slot).nonzero(as_tuple=True)
        movers = (at_slot & ~inside).nonzero(as_tuple=True)[2]  # same (layer, head) order, same counts
        if holes.numel():
            self._swap_heads(layers[li], heads, holes, movers)
        self.region_len[layers] = m

    def _place_shared(self, sel: torch.Tensor) -> None:
        length = sel.shape[0]
        m = int(sel.sum())
        self._check(torch.tensor([m]))
        at_slot = sel[self.pos[0, 0, :length]]
        inside = torch.arange(length, device=sel.device) < m
        holes = (inside & ~at_slot).nonzero().squeeze(1)
        movers = (at_slot & ~inside).nonzero().squeeze(1)
        if holes.numel():
            self.cache.swap_slots(holes, movers)
            pa, pb = self.pos[:, :, holes].clone(), self.pos[:, :, movers].clone()
            self.pos[:, :, holes], self.pos[:, :, movers] = pb, pa
            self.where[:, :, pb[0, 0]] = holes
            self.where[:, :, pa[0, 0]] = movers
            self.swaps += holes.numel()
        self.region_len.fill_(m)

    def _check(self, m: torch.Tensor) -> None:
        if bool((m > self.size).any()):
            raise RuntimeError(
                f"kv={self.policy.name}: selection of {int(m.max())} entries exceeds the "
                f"compressed region ({self.size} slots); max_selected() is wrong"
            )

    def _swap_heads(
        self, layers: torch.Tensor, heads: torch.Tensor, a: torch.Tensor, b: torch.Tensor
    ) -> None:
        """Swap slots `a` and `b` of (layers, heads), element-wise, in the cache and the tables."""
        _, hkv, cap, _ = self.cache.k.shape
        base = (layers * hkv + heads) * cap
        fa, fb = base + a, base + b  # rows of the cache's [layers * heads * capacity, d] view
        for t in (self.cache.k, self.cache.v):
            rows = t.view(-1, t.shape[-1])  # one indexed copy per side: cheaper than 3-d advanced indexing
            ta, tb = rows.index_select(0, fa), rows.index_select(0, fb)
            rows.index_copy_(0, fa, tb)
            rows.index_copy_(0, fb, ta)
        pa, pb = self.pos[layers, heads, a], self.pos[layers, heads, b]
        self.pos[layers, heads, a], self.pos[layers, heads, b] = pb, pa
        self.where[layers, heads, pb], self.where[layers, heads, pa] = a, b
        self.swaps += a.numel()

    @torch.inference_mode()
    def restore(self) -> None:
        """Put every entry back at slot == position (all layers and heads)."""
        n = self.synced
        if n == 0:
            return
        idx = self.where[:, :, :n]
        for t in (self.cache.k, self.cache.v):
            t[:, :, :n] = t[:, :, :n].gather(2, idx.unsqueeze(-1).expand(-1, -1, -1, t.shape[-1]))
        self.cache.slot_pos[:n] = torch.arange(n, device=self.pos.device)
        self.pos[:, :, :n] = torch.arange(n, device=self.pos.device)
        self.where[:, :, :n] = self.pos[:, :, :n]
        self.region_len.zero_()
        self._shared_at = -1
        self._forget_placements()

    def placed_shared(self, cache_len: int) -> bool:
        """True when a shared selection is already in place for this cache length."""
        return self._shared_at == cache_len

    def selected(self, layer: int, head: int) -> set[int]:
        """Logical positions held in the region of (layer, head) (tests, debugging)."""
        return set(self.pos[layer, head, : int(self.region_len[layer, head])].tolist())

    # --- views ---------------------------------------------------------------------------------
    def view(
        self,
        block_mask: torch.Tensor,
        restricted: torch.Tensor,
        tail_from: int | None = None,
        rows: slice | None = None,
    ) -> RegionView:
        if tail_from is not None and self.backend == "flex":
            raise HarnessError(
                f"kv={self.policy.name}: backend=flex keeps one static block mask and cannot add a draft "
                "tail; use backend=sliced (or dense) with a self-drafting decoder"
            )
        return RegionView(self, block_mask, restricted, tail_from, rows)


class RegionView:
    """Attention view: `restricted` rows see the region (the policy's selection), the other rows the
    whole cache, every row the block through `block_mask [n, n]`. Same contract as `RestrictedView`,
    `tail_from` included (the tail stays at slot == position: the region never moves it). `rows`: the
    restricted rows as a range, when the caller knows it (otherwise read from `restricted` once)."""

    def __init__(
        self,
        region: CompressedRegion,
        block_mask: torch.Tensor,
        restricted: torch.Tensor,
        tail_from: int | None = None,
        rows: slice | None = None,
    ) -> None:
        self.region, self.scale = region, region.engine.scale
        self.block_vis, self.restricted = block_mask.bool(), restricted.bool()
        self.tail_from = tail_from
        n = self.block_vis.shape[0]
        self.rows: torch.Tensor | slice = self.restricted.nonzero().squeeze(1) if rows is None else rows
        self.n_rows = len(range(n)[rows]) if isinstance(self.rows, slice) else self.rows.numel()
        self._read: list[int] = []
        self._mask: RegionBlockMask | None = None
        # with graphs on, the step reads the selection by gather instead and keeps one shape
        self.kind = ViewKind.REGION_GATHERABLE if gathers(region.policy, rows) else ViewKind.REGULAR

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        reg, policy = self.region, self.region.policy
        n = q.shape[2]
        cache_len = k.shape[2] - n
        sel_len = cache_len if self.tail_from is None else min(self.tail_from, cache_len)
        q_rows = q[0, :, self.rows]
        if self.n_rows:
            policy.observe(layer, q_rows)
        if not self.n_rows or policy.keeps_all(layer, sel_len):
            self._read.append(cache_len)
            if self.n_rows:
                policy.activity.note(layer, sel_len, sel_len)
            return self._dense(q, k, v, cache_len)
        reg.sync(sel_len)
        if not (policy.shared and reg.placed_shared(sel_len)):  # shared: once per step, all layers
            key = policy.selection_key(layer, sel_len)
            if key is None:
                reg.place(layer, policy.select(layer, q_rows, k[0, :, :sel_len], sel_len))
            elif reg.placed.get(layer) != key:  # a draft's rounds share one placement
                self._place_every_layer(sel_len)
        rl = reg.region_len[layer]
        self._read.append(reg.lengths(layer)[2] // rl.numel() + cache_len - sel_len)
        policy.activity.note(layer, self._read[-1] - (cache_len - sel_len), sel_len)
        if self.tail_from is not None:  # the tail joins the block: always visible, read in place
            return self._gathered(layer, q, k, v, sel_len, rl)
        if reg.backend == "flex":
            return self._flex(layer, q, cache_len, rl)
        return self._gathered(layer, q, k, v, cache_len, rl)

    def _place_every_layer(self, sel_len: int) -> None:
        """A policy with a `selection_key` (its choice needs no query): every restricted layer whose key
        changed, placed in one go, their lengths read back once."""
        reg = self.region
        policy, cache = reg.policy, reg.cache
        keys = {li: policy.selection_key(li, sel_len) for li in range(cache.n_layers)}
        todo = [
            li for li, key in keys.items() if not policy.keeps_all(li, sel_len) and reg.placed.get(li) != key
        ]
        sel = torch.stack([policy.select(li, None, cache.k[li, :, :sel_len], sel_len) for li in todo])
        reg.place_layers(sel, todo)
        reg.placed.update((li, keys[li]) for li in todo)
        reg.read_lengths()

    def _dense(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_len: int) -> torch.Tensor:
        n = q.shape[2]
        if n == 1:
            return one_row_attention(q, k, v, self.scale)
        mask = torch.ones(n, cache_len + n, dtype=torch.bool, device=q.device)
        mask[:, cache_len:] = self.block_vis
        return sdpa(q, k, v, mask, self.scale)

    def _flex(self, layer: int, q: torch.Tensor, cache_len: int, rl: torch.Tensor) -> torch.Tensor:
        reg = self.region
        kf, vf = reg.cache.k[layer].unsqueeze(0), reg.cache.v[layer].unsqueeze(0)  # static length: capacity
        if self._mask is None:
            self._mask = _mask_for(
                q.shape[2], kf.shape[2], q.shape[1], kf.shape[1], self.restricted, self.block_vis, reg.q_block
            )
        if self._mask.owner is not self:  # another view of the same size used the shared mask since
            self._mask.set_layout(self.restricted, self.block_vis)
            self._mask.owner = self
        self._mask.update(cache_len, rl)
        return self._mask.attend(q, kf, vf, self.scale, compiled=reg.compiled)

    def _gathered(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache_len: int, rl: torch.Tensor
    ) -> torch.Tensor:
        """The restricted rows over the region slice + everything from `cache_len` on (the block, with
        a draft tail in front of it when `tail_from` is set); the other rows over the whole cache."""
        n, total = q.shape[2], k.shape[2]
        top, low, _ = self.region.lengths(layer)
        kb, vb = k[:, :, cache_len:], v[:, :, cache_len:]
        tail = total - n - cache_len
        bvis = self.block_vis
        if tail:
            bvis = torch.cat([torch.ones(n, tail, dtype=torch.bool, device=q.device), bvis], dim=1)
        args = (k[:, :, :top], v[:, :, :top], rl, kb, vb)
        rows = self.rows
        if self.region.backend == "flash":
            o_r = flash_region_attend(q[:, :, rows], *args, bvis[rows], self.scale)
        else:  # one row of a one-row block sees its whole block; the region is full when low == top
            plain = low == top and (n == 1 or None)
            o_r = sliced_attend(q[:, :, rows], *args, bvis[rows], self.scale, plain)
        if self.n_rows == n:
            return o_r
        full = (~self.restricted).nonzero().squeeze(1)  # these rows see the whole cache
        mask = torch.ones(full.numel(), total, dtype=torch.bool, device=q.device)
        mask[:, cache_len:] = bvis[full]
        out = torch.empty_like(q)
        out[:, :, full] = sdpa(q[:, :, full], k, v, mask, self.scale)
        out[:, :, rows] = o_r
        return out

    def kv_read(self, cache_len: int) -> int:
        """Mean over layers of cached entries read per KV head by the restricted rows."""
        return round(sum(self._read) / len(self._read)) if self._read else cache_len
