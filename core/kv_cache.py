"""The one KV cache every decoder shares.

Our engine owns its cache (no transformers `Cache` object is involved), so this module is the only
place that knows the physical layout. Layout: one preallocated tensor per K and V,
`[n_layers, n_kv_heads, capacity, head_dim]`, keys stored AFTER RoPE, so entries can be moved
physically (compaction on commit, FAFO's compressed-region swaps) without changing attention.

Slots `[0, length)` hold committed entries; a forward stages its block at `[length, length + n)`;
`commit(keep)` compacts the kept block rows to `[length, length + len(keep))` and forgets the rest.
`slot_pos[s]` is the logical (RoPE) position of the entry in slot `s`. Every decoder commits its tokens
in sequence order, so committed slot `s` holds position `s` until entries are swapped (a compressed
region, `core.compressed_region`) or dropped: `in_order` says so, and the KV policies then read slots
as positions without a map (the tests check it after every generation).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


class KVCache:
    def __init__(
        self, n_layers: int, n_kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device
    ) -> None:
        self.n_layers, self.n_kv_heads, self.head_dim = n_layers, n_kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.capacity = 0
        self.allocations = 0  # times the tensors were (re)allocated: grows only with capacity
        self.length = 0
        self.staged = 0
        self.in_order = True
        self.k = self.v = torch.empty(0)
        self.slot_pos = torch.empty(0, dtype=torch.long)

    def reset(self, capacity: int) -> None:
        """Forget everything; make room for `capacity` entries (reallocates only to grow)."""
        if capacity > self.capacity:
            shape = (self.n_layers, self.n_kv_heads, capacity, self.head_dim)
            self.k = torch.zeros(shape, dtype=self.dtype, device=self.device)
            self.v = torch.zeros(shape, dtype=self.dtype, device=self.device)
            self.slot_pos = torch.zeros(capacity, dtype=torch.long, device=self.device)
            self.capacity = capacity
            self.allocations += 1
        self.length = 0
        self.staged = 0
        self.in_order = True  # committed slot s holds position s (see the module docstring)

    def bytes_per_entry(self) -> int:
        """Bytes of K+V for one cached position over all layers and KV heads."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.k.element_size()

    # --- staging (called by the engine inside a forward) ---------------------------------------
    def stage_positions(self, position_ids: torch.Tensor) -> None:
        self.stage_block(position_ids.numel())
        self.slot_pos[self.length : self.length + self.staged] = position_ids

    def stage_block(self, n: int) -> None:
        """Stage an `n`-row block whose slots' positions the caller writes (a fixed-shape forward, by
        device index inside the forward)."""
        if self.length + n > self.capacity:
            raise RuntimeError(
                f"KV cache overflow: {self.length} cached + {n} new > capacity {self.capacity}"
            )
        self.staged = n

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the block's K/V ([kv_heads, n, d]) for `layer`; return views over cache + block."""
        lo, hi = self.length, self.length + k.shape[1]
        self.k[layer, :, lo:hi] = k
        self.v[layer, :, lo:hi] = v
        return self.k[layer, :, :hi], self.v[layer, :, :hi]

    # --- commit / rollback ------------------------------------------------------------------------
    def commit(self, keep: Sequence[int] | torch.Tensor) -> None:
        """Keep staged block rows `keep` (block-relative, in order), drop the other staged rows."""
        rows = keep.tolist() if isinstance(keep, torch.Tensor) else list(keep)
        m = len(rows)
        if m and (min(rows) < 0 or max(rows) >= self.staged):
            raise IndexError(f"commit index out of the staged block (size {self.staged}): {rows}")
        if rows != list(range(m)):  # the block's first rows (a chain's accepted prefix) are in place
            self._move_down(rows)
        self.length += m
        self.staged = 0

    def _move_down(self, rows: list[int]) -> None:
        """Move the kept staged rows to the slots right after the committed ones."""
        if all(a < b for a, b in zip(rows, rows[1:])):
            self._compact_runs(rows)
            return
        # any order: gather every kept row before writing any
        src = torch.tensor(rows, device=self.device) + self.length
        dst = torch.arange(self.length, self.length + len(rows), device=self.device)
        self.k[:, :, dst] = self.k[:, :, src]
        self.v[:, :, dst] = self.v[:, :, src]
        self.slot_pos[dst] = self.slot_pos[src]

    def _compact_runs(self, rows: list[int]) -> None:
        """Increasing `rows`: each run of consecutive rows moves down as one slice copy (a decoder keeps the
        root plus one accepted run, so usually one copy per tensor and no index tensor). Row i moves to
        slot length + i <= length + rows[i], so a run never overwrites a later run's source."""
        dst, i = self.length, 0
        while i < len(rows):
            j = i
            while j + 1 < len(rows) and rows[j + 1] == rows[j] + 1:
                j += 1
            src, n = self.length + rows[i], j - i + 1
            if src != dst:
                overlap = src < dst + n
                for t in (self.k, self.v):
                    part = t[:, :, src : src + n]
                    t[:, :, dst : dst + n] = part.clone() if overlap else part
                part = self.slot_pos[src : src + n]
                self.slot_pos[dst : dst + n] = part.clone() if overlap else part
            dst, i = dst + n, j + 1

    def crop(self, length: int) -> None:
        """Roll back to the first `length` committed entries."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot crop a cache of length {self.length} to {length}")
        self.length = length
        self.staged = 0

    def drop(self, lo: int, hi: int) -> None:
        """Forget committed slots `[lo, hi)` and move `[hi, length)` down to `[lo, ...)` (all layers; slot
        positions travel with their entries). A StreamingLLM-evicting cache (a draft model's) uses it."""
        if not 0 <= lo <= hi <= self.length:
            raise ValueError(f"cannot drop slots [{lo}, {hi}) of a cache of length {self.length}")
        n = self.length - hi
        self.in_order = self.in_order and not (hi > lo and n)  # the moved entries keep their positions
        if hi > lo and n:
            self.k[:, :, lo : lo + n] = self.k[:, :, hi : self.length].clone()
            self.v[:, :, lo : lo + n] = self.v[:, :, hi : self.length].clone()
            self.slot_pos[lo : lo + n] = self.slot_pos[hi : self.length].clone()
        self.length -= hi - lo
        self.staged = 0

    def swap_slots(self, a: torch.Tensor, b: torch.Tensor) -> None:
        """Exchange the entries in committed slots `a[i]` and `b[i]` (all layers). Used by layouts
        that keep a selected set in a fixed region (FAFO's compressed head region)."""
        self.in_order = False
        ka, kb = self.k[:, :, a].clone(), self.k[:, :, b].clone()
        self.k[:, :, a], self.k[:, :, b] = kb, ka
        va, vb = self.v[:, :, a].clone(), self.v[:, :, b].clone()
        self.v[:, :, a], self.v[:, :, b] = vb, va
        pa, pb = self.slot_pos[a].clone(), self.slot_pos[b].clone()
        self.slot_pos[a], self.slot_pos[b] = pb, pa
