"""Decode forwards with fixed shapes, replayed as CUDA graphs (`run.cuda_graphs`: auto, on for a CUDA model).

On a GPU a small model's forward is bound by kernel launches, not by the GPU: each of a forward's ~1300
operators (SmolLM2-135M) is its own launch from the host. A CUDA graph replays the whole forward as one
launch, which needs every shape and address fixed when it is captured. So these forwards read their
tokens, positions, cache length and visibility from device buffers, write the block's entries at slots
`length + i` through a device index (not a Python slice), and attend over the whole allocated cache
through a boolean visibility of every slot.

A block of n rows runs padded to the next power of two (one graph per padded size and cache
allocation; `KVCache.reset` reallocates only to grow). Pad rows repeat the last position, see the
cache and their own slot, are never committed, and their logits are dropped.
`Engine(cuda_graphs=True)` sends here every decode step whose view's `kind` (`core.attention.ViewKind`)
has a fixed-shape forward, with no hooks, whose padded block fits the cache: `CAUSAL` (vanilla's
steps), `CAUSAL_SHOWN_TO_POLICY` (a causal view whose policy is shown the queries:
`observe_layers(queries)`), `WHOLE_CACHE_BLOCK` (every verification over the full cache: PLD's
chains, Lookahead's and FAFO's blocks, LongSpec's tree under its masked backend), `MASK` (one
visibility for every layer, a KV policy's one selection among them), `HOLE` (StreamingLLM's window
as a `cache_hole` in the whole cache, built into the forward's own visibility without a mask),
`LAYER_SELECTION` (`selection [n_layers, n_kv_heads, L]` for its `restricted` rows, `block_mask`
inside the block, `observe_layers(queries)`: the blocks restricted by a policy that chooses before
the forward: SnapKV, H2O, retrieval, kvpress presses, SFI's fast steps) and `SELECTED_IN_FORWARD`
(Quest's and Top-K's blocks, whose choice runs inside the forward: the `selector` below; Top-K's
with a self-drafting decoder's tail too). A draft model's engine has fixed-shape forwards of its own
(`Engine.use_graphs`), LongSpec's draft too (`decoders/longspec/static_draft.py`). A per-layer
selection view with a `gather_budget` (a compressed-region backend's all-restricted block, built by
`core.policy_views.gathered_view` instead of moving entries) reads each layer's selected slots by
gather from a fixed number per KV head. The prefill, the hybrid tree backend, the steps a compressed
region lays out (`kv.backend=sliced|flex|flash`: entries move between steps), per-head masks and hooks
take the regular forward. The queries a policy observes are kept per layer by the forward and handed
to it after the forward, before the commit.

`StaticForwards(engine, capture=False)` runs the same fixed-shape forwards eagerly: the CPU tests check
them against `Engine.step`, and `make test-gpu` checks the captured graphs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from core.attention import View, ViewKind, sdpa
from core.positions import StagedPositions, flat_on, same_key, version_of
from core.replay import Replay


def padded_rows(n: int) -> int:
    """The block size a graph runs `n` rows in: the next power of two."""
    return 1 << (n - 1).bit_length()


def has_room(cache, n: int) -> bool:
    """Whether `cache` holds a padded block of `n` rows after its entries."""
    return cache.length + padded_rows(n) <= cache.capacity


def fits(cache, n: int, view: View) -> bool:
    """Whether a step of `n` rows under `view` can run as a fixed-shape forward over `cache` (hooks
    aside: the engine decides those)."""
    if not has_room(cache, n):
        return False
    kind = view.kind
    if kind in (ViewKind.CAUSAL, ViewKind.CAUSAL_SHOWN_TO_POLICY):
        return True
    if kind is ViewKind.MASK:  # one visibility for every head, over exactly [cache | block]
        return tuple(view.mask.shape) == (n, cache.length + n)
    if kind is ViewKind.WHOLE_CACHE_BLOCK:  # BlockView, LongSpec's tree (masked backend)
        return tuple(view.block_mask.shape) == (n, n)
    if kind in (ViewKind.HOLE, ViewKind.LAYER_SELECTION):
        return tuple(view.block_mask.shape) == (n, n) and view.cache_len == cache.length
    if kind is ViewKind.SELECTED_IN_FORWARD:  # a draft tail only where the selector stages it
        tail_ok = view.tail_from is None or view.selector_takes_tail
        return tuple(view.block_mask.shape) == (n, n) and tail_ok
    return False  # REGULAR, REGION_GATHERABLE


class StaticForwards:
    """The fixed-shape forwards of `engine`, one per padded block size (captured as CUDA graphs when
    `capture`). `applies` says whether a step can take them; calling it runs one like `Engine.step`."""

    def __init__(self, engine, capture: bool, compiled: bool = False) -> None:
        self.engine, self.capture, self.compiled = engine, capture, compiled
        self.by_rows: dict[int, StaticForward] = {}  # plain visibility (causal, block, one mask)
        # the per-layer selection forwards, by (rows, gathered slots or None, the layers read whole)
        self.by_rows_selected: dict[tuple, StaticForward] = {}
        self.by_rows_observed: dict[int, StaticForward] = {}  # causal forwards whose queries a policy sees
        self.by_rows_in_forward: dict[tuple, StaticForward] = {}  # (rows, selector) forwards
        self.by_rows_masked: dict[int, StaticForward] = {}  # a `MaskView`'s whole visibility, staged
        self.by_rows_holed: dict[int, StaticForward] = {}  # a `HoleView`'s: the cache but a hole

    @property
    def captures(self) -> int:
        every = (
            self.by_rows,
            self.by_rows_selected,
            self.by_rows_observed,
            self.by_rows_in_forward,
            self.by_rows_masked,
            self.by_rows_holed,
        )
        return sum(f.replay.captures for forwards in every for f in forwards.values())

    def applies(self, n: int, view) -> bool:
        return fits(self.engine.cache, n, view)

    def __call__(
        self,
        tokens: torch.Tensor,
        position_ids: torch.Tensor,
        view,
        logits_rows: Sequence[int] | torch.Tensor | None,
        argmax: bool = False,
        with_logits: bool = True,
    ) -> Any:
        fwd = self.forward_for(padded_rows(tokens.numel()), view)
        return fwd(tokens, position_ids, view, logits_rows, argmax, with_logits)

    def forward_for(self, rows: int, view) -> StaticForward:
        """The fixed-shape forward of `rows` padded rows that serves `view` (made on first use): one per
        kind of visibility, since each builds its own inside the graph."""
        kind = view.kind
        holed = kind is ViewKind.HOLE  # the cache but a hole
        if kind is ViewKind.SELECTED_IN_FORWARD:
            key = (rows, view.selector_key, holed)
            fwd = self.by_rows_in_forward.get(key)
            if fwd is None:
                fwd = StaticForward(self.engine, rows, self.capture, holed=holed, compiled=self.compiled)
                self.by_rows_in_forward[key] = fwd
            if fwd.selector is None or fwd.selector.capacity != self.engine.cache.capacity:
                fwd.selector = view.selector(fwd)  # buffers sized by the allocation (a new one recaptures)
            return fwd
        if kind is ViewKind.LAYER_SELECTION:
            key = (rows, *self.gathered(view, rows), holed)
            fwd = self.by_rows_selected.get(key)
            if fwd is None:
                fwd = StaticForward(
                    self.engine,
                    rows,
                    self.capture,
                    layered=True,
                    gather=key[1],
                    whole_layers=key[2],
                    holed=holed,
                    compiled=self.compiled,
                )
                self.by_rows_selected[key] = fwd
            return fwd
        observed = kind is ViewKind.CAUSAL_SHOWN_TO_POLICY
        masked = kind is ViewKind.MASK
        if observed:
            forwards = self.by_rows_observed
        elif masked:
            forwards = self.by_rows_masked
        else:
            forwards = self.by_rows_holed if holed else self.by_rows
        if rows not in forwards:
            forwards[rows] = StaticForward(
                self.engine,
                rows,
                self.capture,
                observed=observed,
                masked=masked,
                holed=holed,
                compiled=self.compiled,
            )
        return forwards[rows]

    def gathered(self, view, rows: int) -> tuple[int | None, frozenset[int]]:
        """A per-layer selection view with a `gather_budget` (every row restricted): the slots each KV
        head's rows read, a fixed count (the policy's bound on what it selects, plus the draft's tail
        and the block padded to a power of two), and the layers it reads whole. (None, {}) otherwise."""
        budget = view.gather_budget
        if budget is None:
            return None, frozenset()
        tail = view.cache_len - view.sel_len
        return min(self.engine.cache.capacity, budget + padded_rows(tail + rows)), view.whole_layers


class StaticForward:
    """Blocks of up to `rows` rows through fixed-shape buffers. Called like `Engine.step`; stages the
    padded block (commit block-relative rows of the real ones only). `layered`: the views with a
    per-layer selection; each layer's visibility is then the staged one narrowed, for the restricted
    rows, to the layer's selection, and every layer's queries are kept for the policy to observe.
    `observed`: a causal view whose policy observes every layer's queries (kept the same way).
    `selector` (set by `StaticForwards` for a view that `selects_in_forward`): an object of the view's
    policy that owns fixed-shape buffers, stages them each step (`stage(view, n, length)`, outside the
    graph) and chooses each layer's slots from the layer's queries inside it (`select(layer, q,
    restricted, slots)` -> bool `[n_kv_heads, capacity]`), noting what it chose in its `reads`; the
    view gets them after the forward (`take_reads`). `masked`: a `MaskView`'s own visibility of every
    slot, staged before the forward; every other forward builds its visibility inside itself from the
    cache length and the block's square (and, `holed`, a `HoleView`'s hole), so that what a step stages
    is what changed, at two small kernels inside the graph (a hole adds five)."""

    def __init__(
        self,
        engine,
        rows: int,
        capture: bool,
        layered: bool = False,
        observed: bool = False,
        gather: int | None = None,
        whole_layers: frozenset[int] = frozenset(),
        masked: bool = False,
        holed: bool = False,
        compiled: bool = False,
    ) -> None:
        self.engine, self.rows, self.capture, self.layered = engine, rows, capture, layered
        self.gather, self.whole_layers, self.masked, self.holed = gather, whole_layers, masked, holed
        dev = engine.device
        w = engine.w
        self.selection = torch.zeros(0, dtype=torch.bool, device=dev)  # [n_layers, n_kv_heads, capacity]
        self.selected_to = 0  # `selection` is True from here on (what a shorter selection left is reset)
        self.staged_stack: tuple | None = None  # (stack, width): `selection` holds that stack's prefix
        self.restricted = torch.zeros(rows, dtype=torch.bool, device=dev)
        self.staged_restricted: tuple | None = None  # (rows, the view's `restricted`, its version) staged
        shape = (w.n_layers, w.n_heads, rows, w.head_dim)
        self.queries = torch.zeros(shape, dtype=engine.dtype, device=dev) if layered or observed else None
        self.token = torch.zeros(rows, dtype=torch.long, device=dev)
        self.length = torch.zeros(1, dtype=torch.long, device=dev)
        self.row = torch.arange(rows, device=dev)
        self.positions = StagedPositions(self.row)  # relative to the cache length where they can be
        self.visible = torch.zeros(0, dtype=torch.bool, device=dev)  # [rows, capacity], per allocation
        self.slots = torch.zeros(0, dtype=torch.long, device=dev)  # 0..capacity-1
        # what the forward builds `visible` from (unless `masked`): the block's own visibility, pad rows
        # seeing their own slot, and (`holed`) the cache hole `[lo, hi)` the `hole_rows` do not see
        self.block = torch.zeros(rows, rows, dtype=torch.bool, device=dev)
        self.hole = torch.zeros(2, dtype=torch.long, device=dev)
        self.hole_rows = torch.zeros(rows, dtype=torch.bool, device=dev)
        self.staged_block: tuple | None = None  # what `block` holds: (rows, the mask and its version)
        self.staged_hole: tuple | None = None  # what `hole` and `hole_rows` hold (None: no hole)
        self.selector = None
        # captured with the greedy choice too: one small kernel, no launch of its own. Both the warm-up
        # and the capture write the staged slots only, which the replay that follows writes again.
        # `compiled`: the forward compiled by inductor (`run.compile`), one compile per shape, fusing the
        # elementwise work between the GEMMs and dropping the per-operator dispatch; under a capture too
        self.compiled = compiled
        self.kv_heads = torch.arange(w.n_kv_heads, device=dev)[:, None]  # `_write_kv`'s head index
        # eager, `forward` is looked up per run (tests patch it)
        run = compile_forward(self.forward) if compiled else lambda: self.forward()
        self.replay = Replay(run, capture, dev, compiled=compiled)

    def __call__(
        self,
        tokens: torch.Tensor,
        position_ids: torch.Tensor,
        view,
        logits_rows: Sequence[int] | torch.Tensor | None,
        argmax: bool = False,
        with_logits: bool = True,
    ) -> Any:
        eng, cache, n = self.engine, self.engine.cache, tokens.numel()
        self.token[:n].copy_(flat_on(tokens, eng.device))
        self.positions.stage(position_ids, n, eng, cache.length)
        cache.stage_block(self.rows)  # the capacity check; the forward writes the slots' positions
        self.length.fill_(cache.length)
        self._stage_visibility(view, n, cache.length, cache.capacity)
        logits, ids = self.replay((cache.k.data_ptr(), cache.capacity))  # eager without capture
        if self.queries is not None:  # the real rows' queries (pad rows are no one's), every layer's at once
            view.observe_layers(self.queries[:, :, :n])
        if self.selector is not None:
            view.take_reads(self.selector.reads.clone(), cache.length)
        picked = None if logits_rows is None else eng.stage(logits_rows)

        def returned(t: torch.Tensor) -> torch.Tensor:  # the asked rows, out of the forward's buffers
            return t[:n].clone() if picked is None else t.index_select(0, picked)

        if not argmax:
            return returned(logits)
        # the argmax alone when asked: no `[rows, vocab]` copy out of the buffers
        return (returned(logits) if with_logits else None, returned(ids))

    def _stage_visibility(self, view, n: int, length: int, capacity: int) -> None:
        """Stage which slots each row sees. A `masked` forward takes the view's whole visibility over
        [cache | block] (block row j is slot `length + j`) into `visible`; every other forward builds
        `visible` itself from the cache length, the block's own visibility and the cache hole
        (`_build_visibility`), so a step whose block and hole are those of the step before stages
        neither. A pad row sees the cache and its own slot, so none of its layers attends to nothing
        (its K/V, written past the block, stays finite)."""
        if self.visible.shape != (self.rows, capacity):
            self.visible = torch.zeros(self.rows, capacity, dtype=torch.bool, device=self.engine.device)
            self.slots = torch.arange(capacity, device=self.engine.device)
        if self.masked:
            torch.lt(self.slots[None, :].expand(self.rows, -1), length, out=self.visible)  # every cached slot
            self.visible[:n, : length + n].copy_(view.mask)
            if n < self.rows:  # one write: the pad rows' slots are the diagonal of their square
                self.visible[n:, length + n : length + self.rows].diagonal().fill_(True)
            return
        self._stage_block(view, n)
        if self.holed:
            self._stage_hole(view, n)
        if self.layered:
            self._stage_selection(view, n, length, capacity)
        if self.selector is not None:
            self._stage_restricted(view, n)
            self.selector.stage(view, n, length)

    def _stage_block(self, view, n: int) -> None:
        """The block's visibility `[rows, rows]`: the view's `block_mask` (a causal view's is the lower
        triangle), the pad rows their own slot. Staged again only for another mask, a mask written in
        place since (its version), or another row count."""
        causal = view.kind in (ViewKind.CAUSAL, ViewKind.CAUSAL_SHOWN_TO_POLICY)
        source = None if causal else view.block_mask
        key = (n,) if causal else (n, source, version_of(source))
        if self.staged_block is not None and same_key(self.staged_block, key):
            return
        self.block.zero_()
        if causal:
            self.block[:n, :n] = torch.ones(n, n, dtype=torch.bool, device=self.block.device).tril_()
        else:
            self.block[:n, :n].copy_(source)
        if n < self.rows:
            self.block[n:, n:].diagonal().fill_(True)
        self.staged_block = key

    def _stage_hole(self, view, n: int) -> None:
        """A `HoleView`'s hole `[lo, hi)` and the rows it is hidden from (its `rows` slice, or its
        `restricted` rows); staged again only when it changes."""
        hole = view.cache_hole
        if hole[1] <= hole[0]:
            if self.staged_hole is not None:
                self.hole.zero_()
                self.staged_hole = None
            return
        rows, flags = view.rows, view.restricted
        # the rows it is hidden from
        hidden = (n, rows) if rows is not None else (n, flags, version_of(flags))
        staged, hole = self.staged_hole, tuple(hole)
        if staged is None or staged[0] != hole:
            self.hole.copy_(self.engine.stage(list(hole)))
        if staged is None or not same_key(staged[1], hidden):
            self.hole_rows.zero_()
            if rows is not None:
                self.hole_rows[:n][rows] = True
            else:
                self.hole_rows[:n].copy_(flags)
        self.staged_hole = (hole, hidden)

    def _build_visibility(self, block_slots: torch.Tensor) -> None:
        """`visible` from the device buffers, inside the forward (so inside its graph): every slot before
        `length`, the block's square at its slots `length + row` (`block_slots`), the hole hidden from
        its rows."""
        torch.lt(self.slots[None, :].expand(self.rows, -1), self.length, out=self.visible)
        self.visible.index_copy_(1, block_slots, self.block)
        if self.holed:
            gap = (self.slots >= self.hole[0]) & (self.slots < self.hole[1])
            self.visible &= ~(self.hole_rows[:, None] & gap[None, :])

    def _stage_selection(self, view, n: int, length: int, capacity: int) -> None:
        """Each layer's selection over the cached slots (True from `length` on) and the restricted rows."""
        layers, hkv, sel_len = view.chosen.shape
        if self.selection.shape != (layers, hkv, capacity):
            self.selection = torch.ones(layers, hkv, capacity, dtype=torch.bool, device=self.engine.device)
            self.selected_to, self.staged_stack = 0, None
        prefix, staged = view.prefix_of, self.staged_stack
        # the same stack, both lengths past its masks: what lies between them is True in both already
        same = prefix is not None and staged is not None and prefix[0] is staged[0]
        if not (same and min(sel_len, self.selected_to) >= prefix[1]):
            self.selection[:, :, :sel_len].copy_(view.chosen)
            if sel_len < self.selected_to:  # True past the selection: a draft's tail, the block, free slots
                self.selection[:, :, sel_len : self.selected_to] = True
            self.staged_stack = prefix
        self.selected_to = sel_len
        self._stage_restricted(view, n)

    def _stage_restricted(self, view, n: int) -> None:
        """The restricted rows; staged again only for another tensor or row count than the last one
        (a layout's or a block size's shared mask comes back step after step); one written in place since
        it was staged (its version moved) is staged again."""
        key = (n, view.restricted, version_of(view.restricted))
        if self.staged_restricted is not None and same_key(self.staged_restricted, key):
            return
        self.restricted[:n].copy_(view.restricted)
        self.restricted[n:] = False
        self.staged_restricted = key

    def _narrowed(self, sel: torch.Tensor, heads: int) -> torch.Tensor:
        """`[1, heads, rows, capacity]`: the staged visibility, the restricted rows narrowed to the
        slots `sel [n_kv_heads, capacity]` (per KV head, repeated for its query heads)."""
        vis = self.visible[None] & (sel[:, None, :] | ~self.restricted[None, :, None])
        return vis.repeat_interleave(heads // sel.shape[0], dim=0, output_size=heads).unsqueeze(0)

    def forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Float logits `[rows, vocab]` of the rows in the buffers and each row's argmax; their K/V land
        in slots `length + row`."""
        eng, cache = self.engine, self.engine.cache
        slots = self.length + self.row
        position = self.positions.of(self.length)
        cache.slot_pos.index_copy_(0, slots, position)  # as `KVCache.stage_positions` does
        if not self.masked:
            self._build_visibility(slots)
        visible = self.visible.view(1, 1, self.rows, -1)
        if self.gather is not None:
            order, valid = self._gather_order()

        def attend(
            li: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x: torch.Tensor
        ) -> torch.Tensor:
            self._write_kv(li, slots, k, v)
            mask = visible
            if self.queries is not None:
                self.queries[li].copy_(q)
            if self.gather is not None and li not in self.whole_layers:
                return self._gathered_attention(li, q, order[li], valid[li])
            if self.layered:
                mask = self._narrowed(self.selection[li], q.shape[0])
            elif self.selector is not None:
                mask = self._narrowed(self.selector.select(li, q, self.restricted, self.slots), q.shape[0])
            return sdpa(q.unsqueeze(0), cache.k[li].unsqueeze(0), cache.v[li].unsqueeze(0), mask, eng.scale)

        h = eng.layers_forward(self.token, position, attend)
        logits = eng.lm_logits(eng.w.final_norm(h))
        return logits, logits.argmax(dim=-1)

    def _write_kv(self, li: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Layer `li`'s block K/V `[n_kv_heads, rows, d]` into its slots. Compiled, the write indexes the
        whole cache: inductor turns an in-place write into a view of a graph input (`cache.k[li]`) into a
        copy of the whole layer, which made a compiled SmolLM2 forward ~20x slower than eager (a
        1024-slot cache: 78 copies of 196,608 floats per token)."""
        cache = self.engine.cache
        if not self.compiled:
            cache.k[li].index_copy_(1, slots, k)
            cache.v[li].index_copy_(1, slots, v)
            return
        where = (torch.full((1, 1), li, dtype=torch.long, device=slots.device), self.kv_heads, slots[None, :])
        cache.k.index_put_(where, k)
        cache.v.index_put_(where, v)

    def _gather_order(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Each layer's and KV head's first `gather` slots among those its rows may read (the selection,
        the tail and the block: the selection is True from `sel_len` on, the block ends at `length +
        rows`), in slot order, then unread ones: (slots, whether each is read), both `[n_layers,
        n_kv_heads, gather]`. The policy bounds its selection (`max_selected`), so none is cut."""
        capacity = self.slots.numel()
        wanted = self.selection & (self.slots < self.length + self.rows)
        rank = torch.where(wanted, self.slots, self.slots + capacity)  # the read slots first, in order
        first, order = rank.topk(self.gather, dim=-1, largest=False, sorted=True)
        return order, first < capacity

    def _gathered_attention(
        self, li: int, q: torch.Tensor, order: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        """Layer `li`'s attention over the slots `order [n_kv_heads, gather]` only (those `valid`), read
        by gather: what a compressed region reads, without moving entries between steps."""
        cache = self.engine.cache
        index = order[..., None].expand(-1, -1, cache.k.shape[-1])
        k, v = cache.k[li].gather(1, index), cache.v[li].gather(1, index)
        seen = self.visible[:, order].transpose(0, 1) & valid[:, None, :]  # [n_kv_heads, rows, gather]
        heads = q.shape[0]
        mask = seen.repeat_interleave(heads // order.shape[0], dim=0, output_size=heads).unsqueeze(0)
        return sdpa(q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0), mask, self.engine.scale)


def compile_forward(forward: Callable[[], Any]) -> Callable[[], Any]:
    """`forward` compiled by inductor for its fixed shapes (`run.compile`). Every fixed-shape forward is
    the same function, compiled once per instance and cache allocation, so dynamo's limit of 8 compiled
    variants per function (past which it silently runs eagerly) is raised."""
    import torch._dynamo

    cfg = torch._dynamo.config
    cfg.cache_size_limit = max(cfg.cache_size_limit, 256)
    cfg.accumulated_cache_size_limit = max(cfg.accumulated_cache_size_limit, 1024)
    return torch.compile(forward, dynamic=False)
