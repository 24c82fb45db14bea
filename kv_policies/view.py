"""`RestrictedView`: a block layout where some query rows see only a KV policy's selection.

Dense SDPA with a per-KV-head boolean mask: the reference path every sparse backend must equal.
`block_mask` `[n, n]` gives visibility inside the block; `restricted` `[n]` marks rows that see only
`policy.visible(...)` of the cache, the other rows see the whole cache. `tail_from` (optional): cached
entries from that position on are a speculative tail (a self-drafting decoder's own fresh tokens):
visible to every row, never offered to the policy, which selects over `[0, tail_from)` only.

`SelectionView`: the same layout for a policy whose selection is one set of slots for every layer,
head and query (`KVPolicy.fixed_selection`): a `MaskView` over `[n, L + n]` built on the device once per
step, so the step takes the fixed-shape forward and reads nothing back; `HoleView` when the selection is
every slot but a hole (`KVPolicy.fixed_hole`), whose mask no fixed-shape forward needs.

`LayerSelectionView`: the same layout for a policy that chooses per layer and KV head before the forward
(`KVPolicy.query_free`: SnapKV, H2O, retrieval, kvpress presses): the selections of every layer are
read once per step into one `[n_layers, n_kv_heads, L]` tensor on the device, so the step takes the
fixed-shape forward. A policy that watches the queries (`observe`) gets the restricted rows' queries
of every layer, as from `RestrictedView`.

`stack_masks`: per-layer keep masks fixed after the prefill, stacked once into the selection tensor a
`LayerSelectionView` reads (`KVPolicy.stacked_keep`).

`ObservedCausalView`: the plain causal view (bit-identical to `CausalView`) that also hands the
queries to `policy.observe` (H2O accumulates attention even while the budget still covers everything).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from core.attention import (
    CausalView,
    MaskView,
    ViewKind,
    decode_logits,
    decode_weighted_values,
    one_row_attention,
    one_row_two_slices,
    sdpa,
    split_applies,
)
from core.types import DeviceReads


@dataclass
class ViewMemo:
    """What a policy's views remember between steps (`KVPolicy.view_memo`): typed fields, not entries
    a view writes into the policy itself. `kept_of`: (a selection stack, what it keeps per layer and KV
    head, plus) when the policy knows it (`LayerSelectionView.build` then counts no more); `prefix_of`:
    (a selection, the stack it is a prefix of, the stack's mask width) (`LayerSelectionView.prefix_of`);
    `draft_mask`: (a selection, the one-row draft buffer written for it) (`_one_row_draft_mask`)."""

    kept_of: tuple[torch.Tensor, Any, int] | None = None
    prefix_of: tuple[torch.Tensor, torch.Tensor, int] | None = None
    draft_mask: tuple[Any, torch.Tensor] | None = None


def selectable_length(cache_len: int, tail_from: int | None) -> int:
    """The cached entries a policy selects over: all of them, or those before a draft's fresh tail."""
    return cache_len if tail_from is None else min(tail_from, cache_len)


def restricted_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    visible: torch.Tensor,
    restricted: torch.Tensor,
    block_mask: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """SDPA over [cache | block] where the `restricted` rows see the cached entries `visible`
    (`[n_kv_heads, L]`) marks, the other rows every cached entry, and every row the block through
    `block_mask [n, n]`."""
    n, total = q.shape[2], k.shape[2]
    h, hkv = q.shape[1], k.shape[1]
    mask = torch.empty(hkv, n, total, dtype=torch.bool, device=q.device)
    mask[:, :, : total - n] = visible[:, None, :] | ~restricted[None, :, None]
    mask[:, :, total - n :] = block_mask
    if h != hkv:
        mask = mask.repeat_interleave(h // hkv, dim=0, output_size=h)
    return sdpa(q, k, v, mask.unsqueeze(0), scale)


_CAUSAL_BLOCKS: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}


def causal_block(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(block mask `[n, n]` causal, restricted `[n]` every row) of a block whose rows all see a policy's
    selection: made once per size and device and shared by every view (no view writes them), so a
    step builds no masks."""
    # a step passes the engine's `torch.device`, which needs no conversion
    key = (n, device if isinstance(device, torch.device) else torch.device(device))
    masks = _CAUSAL_BLOCKS.get(key)
    if masks is None:
        tril = torch.ones(n, n, dtype=torch.bool, device=device).tril()
        masks = _CAUSAL_BLOCKS[key] = (tril, torch.ones(n, dtype=torch.bool, device=device))
    return masks


class RestrictedView:
    kind: ClassVar[ViewKind] = ViewKind.REGULAR  # the policy's `visible` runs inside the regular forward

    def __init__(
        self,
        policy: Any,
        scale: float,
        block_mask: torch.Tensor,
        restricted: torch.Tensor,
        tail_from: int | None = None,
        rows: slice | None = None,
    ) -> None:
        self.policy, self.scale = policy, scale
        self.block_mask = block_mask
        self.restricted = restricted
        self.tail_from = tail_from
        # the restricted rows: the caller's range, or their indices read once per forward (not per layer)
        self._rows: torch.Tensor | slice | None = rows
        self._read: list[torch.Tensor] = []  # per layer, on the device

    @classmethod
    def all_rows(cls, policy: Any, engine: Any, n_block: int) -> RestrictedView:
        tril, every = causal_block(n_block, engine.device)
        return cls(policy, engine.scale, tril, every, rows=slice(None))

    def _restricted_rows(self) -> torch.Tensor | slice:
        if self._rows is None:
            self._rows = self.restricted.nonzero().squeeze(1)
        return self._rows

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        cache_len = k.shape[2] - q.shape[2]
        sel_len = selectable_length(cache_len, self.tail_from)
        hkv = k.shape[1]
        rows = self._restricted_rows()
        any_rows = isinstance(rows, slice) or rows.numel() > 0
        vis = torch.ones(hkv, cache_len, dtype=torch.bool, device=q.device)
        if any_rows:
            q_rows = q[0, :, rows]
            self.policy.observe(layer, q_rows)
            vis[:, :sel_len] = self.policy.visible(layer, q_rows, k[0, :, :sel_len], sel_len)  # [hkv, L]
        read = vis[:, :sel_len].sum() // hkv  # stays on the device: read when the generation ends
        self._read.append(read + (cache_len - sel_len))
        if any_rows:
            self.policy.activity.note_layer(layer, read, sel_len)
        return restricted_attention(q, k, v, vis, self.restricted, self.block_mask, self.scale)

    def kv_read(self, cache_len: int) -> int | torch.Tensor:
        """Cached entries read per KV head by the restricted rows, per layer on the device (`Counts` takes
        their rounded mean when the generation ends)."""
        if not self._read:
            return cache_len
        return torch.stack(self._read)


class InForwardView(RestrictedView):
    """`RestrictedView` (the regular forward is unchanged) whose choice can also be made inside a
    fixed-shape forward (`core.decode_graph`), for a policy that chooses from the forward's own queries
    (Quest, Top-K): the policy names its `selector_key()` and its `Selector` (an `InForwardSelector`
    that calls the same rule as the policy's `select`, over buffers of the allocation's capacity); the
    entries the selector chose come back through `take_reads`."""

    kind: ClassVar[ViewKind] = ViewKind.SELECTED_IN_FORWARD

    @property
    def selector_takes_tail(self) -> bool:
        """Whether the selector stages a self-drafting decoder's fresh tail (`tail_from`), so that
        `core.decode_graph` may take such a block too."""
        return self.policy.Selector.takes_tail

    @property
    def selector_key(self) -> tuple:
        return self.policy.selector_key()

    def selector(self, static: Any) -> InForwardSelector:
        return self.policy.Selector(static, self.policy)

    def take_reads(self, reads: torch.Tensor, cache_len: int) -> None:
        """Every layer's chosen entries per KV head (`[n_layers]`, on the device) from the fixed-shape
        forward, noted as the regular forward notes them (a draft tail is read by every row)."""
        sel_len = selectable_length(cache_len, self.tail_from)
        self._read = [reads + (cache_len - sel_len) if cache_len > sel_len else reads]
        self.policy.activity.note_forward(reads, sel_len)


class InForwardSelector:
    """What an `InForwardView`'s selector shares: buffers sized by one cache allocation (a new one makes a
    new selector), the selectable length on the device (`length`, staged before each step), every layer's
    chosen entries per KV head (`reads`), and the dense layers, which see every entry. One selector serves
    every policy with its view's `selector_key` on one engine (a fixed-shape forward, and its graph, is
    kept per key): what a step needs of a policy's state it stages from `view.policy`, never from the
    policy it was made for."""

    takes_tail: ClassVar[bool] = False  # whether `stage` handles a draft's fresh tail (`tail_from`)

    def __init__(self, static: Any, policy: Any) -> None:
        eng = static.engine
        self.engine, self.dense = eng, policy.dense_layers
        self.capacity = eng.cache.capacity
        self.length = torch.zeros(1, dtype=torch.long, device=eng.device)
        self.reads = torch.zeros(eng.cache.n_layers, dtype=torch.long, device=eng.device)

    def stage(self, view: Any, n: int, length: int) -> None:
        """Before the step (outside a CUDA graph): the selectable length of a cache of `length` entries."""
        if self.engine.cache.capacity != self.capacity:  # StaticForward's key
            raise RuntimeError(f"the cache was reallocated under a {type(self).__name__}")
        self.length.fill_(selectable_length(length, view.tail_from))

    def dense_layer(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """A dense layer's selection: every slot (its reads: the selectable entries)."""
        self.reads[layer].copy_(self.length[0])
        return torch.ones(self.engine.cache.n_kv_heads, slots.numel(), dtype=torch.bool, device=slots.device)


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
        rows: slice | None = None,
    ) -> SelectionView | None:
        """The view, or None when the policy's selection is not fixed (or it watches the queries).
        `rows`: the restricted rows as a range, when the caller knows it (one write instead of a
        blend over every row)."""
        if policy.watches_queries or not policy.may_fix_selection:
            return None
        cache_len = engine.length
        sel_len = selectable_length(cache_len, tail_from)
        n = block_mask.shape[0]
        draft_row = n == 1 and tail_from is not None and block_mask is causal_block(1, engine.device)[0]
        hole = policy.fixed_hole(sel_len)
        if hole is not None:
            lo, hi, kept = hole
            selection: torch.Tensor | tuple[int, int] = (lo, hi)
        else:
            fixed = policy.fixed_selection(sel_len)
            if fixed is None:
                return None
            selection, kept = fixed
        # restricted rows exist in every caller's block: every layer saw `kept` of `sel_len`
        policy.activity.note_layers(engine.cache.n_layers, kept, sel_len)
        read = kept + cache_len - sel_len
        # a one-row draft step's mask is a prefix of one buffer per draft (`_one_row_draft_mask`), but
        # a fixed-shape forward would copy that mask into its visibility every row; a hole it stages
        # once per draft and builds the visibility from inside the graph
        graphed_hole = isinstance(selection, tuple) and getattr(engine, "graphs", None) is not None
        if draft_row and not graphed_hole:
            mask = _one_row_draft_mask(policy, engine, selection, sel_len, cache_len)
        elif isinstance(selection, tuple):
            return HoleView(block_mask, restricted, rows, selection, cache_len, engine, read)
        else:
            mask = _selection_mask(engine, block_mask, restricted, rows, selection, sel_len, cache_len)
        return cls(mask, engine.scale, read)

    def kv_read(self, cache_len: int) -> int:
        return self.read


def _selection_mask(
    engine: Any,
    block_mask: torch.Tensor,
    restricted: torch.Tensor,
    rows: slice | None,
    selection: torch.Tensor,
    sel_len: int,
    cache_len: int,
) -> torch.Tensor:
    n = block_mask.shape[0]
    mask = torch.ones(n, cache_len + n, dtype=torch.bool, device=engine.device)
    if rows is not None:
        mask[rows, :sel_len] = selection
    else:
        restricted = restricted.to(engine.device)
        mask[:, :sel_len] = selection[None, :] | ~restricted[:, None]
    mask[:, cache_len:] = block_mask
    return mask


class HoleView(SelectionView):
    """A `SelectionView` whose restricted rows see every cached slot but the hole `[lo, hi)` (StreamingLLM
    over slots that hold their positions). Its `[n, L + n]` mask is written when the forward's first
    layer reads it, as `BlockView`'s is; the fixed-shape forward never builds it: it stages the hole
    and the block when they change and builds the whole cache, the block and the hole into its own
    visibility inside the graph, so a restricted block costs the step no mask of its own."""

    kind: ClassVar[ViewKind] = ViewKind.HOLE

    def __init__(
        self,
        block_mask: torch.Tensor,
        restricted: torch.Tensor,
        rows: slice | None,
        hole: tuple[int, int],
        cache_len: int,
        engine: Any,
        read: int,
    ) -> None:
        self.block_mask, self.restricted, self.rows = block_mask, restricted, rows
        self.cache_hole, self.cache_len = hole, cache_len
        self.scale, self.device, self.read = engine.scale, engine.device, read
        self._mask: torch.Tensor | None = None

    @property
    def mask(self) -> torch.Tensor:  # type: ignore[override]
        if self._mask is None:
            n = self.block_mask.shape[0]
            mask = torch.ones(n, self.cache_len + n, dtype=torch.bool, device=self.device)
            self.write_hole(mask)
            mask[:, self.cache_len :] = self.block_mask
            self._mask = mask
        return self._mask

    def write_hole(self, visible: torch.Tensor) -> None:
        """Hide the hole from the restricted rows of `visible` (`[n, >= hi]`, the hole's slots visible)."""
        lo, hi = self.cache_hole
        if hi <= lo:
            return
        if self.rows is not None:
            visible[self.rows, lo:hi] = False
        else:
            visible[:, lo:hi] = ~self.restricted.to(visible.device)[:, None]


def _one_row_draft_mask(
    policy: Any, engine: Any, selection: torch.Tensor | tuple[int, int], sel_len: int, cache_len: int
) -> torch.Tensor:
    """A one-row draft step's visibility `[1, cache_len + 1]`: the selection of `[0, sel_len)` (a bool
    tensor, or the `(lo, hi)` hole of every slot but `[lo, hi)`), then the draft's fresh tail and the row
    itself. The rows of one draft share the selection and differ only in how much tail they see, so each
    is a prefix of one buffer written once per draft (no operator a row)."""
    memo = policy.view_memo
    last = memo.draft_mask  # (selection, buffer): `selection` covers `[0, sel_len)`
    if last is None or not _same_selection(last[0], selection) or last[1].shape[1] <= cache_len:
        width = max(cache_len + 1, engine.cache.capacity)
        buffer = torch.ones(1, width, dtype=torch.bool, device=engine.device)
        if isinstance(selection, tuple):  # every slot visible but the hole, whatever `sel_len`
            buffer[0, selection[0] : selection[1]] = False
        else:
            buffer[0, :sel_len] = selection
        last = memo.draft_mask = (selection, buffer)
    return last[1][:, : cache_len + 1]


def _same_selection(a: torch.Tensor | tuple[int, int], b: torch.Tensor | tuple[int, int]) -> bool:
    """The same selection tensor, or equal holes."""
    return a is b or isinstance(a, tuple) and isinstance(b, tuple) and a == b


class LayerSelectionView:
    """Restricted rows see `selection[layer]` (bool `[n_layers, n_kv_heads, L]`: `chosen` over the first
    `sel_len` slots, True past them, a draft's tail) of the cache, the other rows all of it; `block_mask`
    inside the block. `rows`: the restricted rows' indices when the policy observes queries (None
    otherwise). The policy's activity is noted for the whole forward when the view is built, read when
    the generation is summarised."""

    kind: ClassVar[ViewKind] = ViewKind.LAYER_SELECTION  # core.decode_graph stages `chosen`, `restricted`
    # set for a compressed-region backend on an engine with fixed-shape forwards, every row restricted:
    # the policy's bound on what it selects (`max_selected`), so that the fixed-shape forward reads
    # only the selected entries, by gather; `whole_layers`: the layers that keep every entry
    gather_budget: int | None = None
    whole_layers: frozenset[int] = frozenset()
    # (stack, width) when `chosen` is the first `sel_len` slots of `stack`, a tensor nobody writes in
    # place, every entry True from `width` on (`KVPolicy.stacked_keep`): a fixed-shape forward that
    # staged the same stack before copies nothing while both lengths are past `width`
    prefix_of: tuple[torch.Tensor, int] | None = None

    def __init__(
        self,
        policy: Any,
        scale: float,
        block_mask: torch.Tensor,
        restricted: torch.Tensor,
        chosen: torch.Tensor,
        cache_len: int,
        read: DeviceReads,
        rows: torch.Tensor | slice | None,
    ) -> None:
        self.policy, self.scale = policy, scale
        self.block_mask, self.restricted, self.chosen = block_mask, restricted, chosen
        self.cache_len, self.sel_len = cache_len, chosen.shape[-1]
        self.read, self.rows = read, rows
        self._selection: torch.Tensor | None = None

    @property
    def selection(self) -> torch.Tensor:
        """`chosen` with the tail made visible: the regular forward's mask (the fixed-shape path stages
        `chosen` itself)."""
        if self._selection is None:
            self._selection = self.chosen
            tail = self.cache_len - self.sel_len
            if tail:
                n_layers, hkv, _ = self.chosen.shape
                ones = torch.ones(n_layers, hkv, tail, dtype=torch.bool, device=self.chosen.device)
                self._selection = torch.cat([self.chosen, ones], dim=2)
        return self._selection

    @classmethod
    def build(
        cls,
        policy: Any,
        engine: Any,
        block_mask: torch.Tensor,
        restricted: torch.Tensor,
        tail_from: int | None = None,
        rows: slice | None = None,
    ) -> LayerSelectionView | None:
        """The view, or None when the policy's selection depends on the forward's queries or keys.
        `rows`: the restricted rows as a range, when the caller knows it (otherwise read from
        `restricted` once, for a policy that watches their queries)."""
        if not policy.query_free:
            return None
        cache_len = engine.length
        sel_len = selectable_length(cache_len, tail_from)
        chosen = policy.layer_selections(sel_len)  # [n_layers, n_kv_heads, sel_len]
        # (stack, per layer, plus): what `chosen` keeps per layer and KV head, as `RestrictedView` counts
        # it, is `per layer + plus`; a policy may serve one stack to a draft's rounds, or know its counts
        memo = policy.view_memo
        if memo.kept_of is not None and memo.kept_of[0] is chosen:
            kept, plus = memo.kept_of[1], memo.kept_of[2]
        else:
            kept, plus = chosen.sum(dim=(1, 2)) // engine.cache.n_kv_heads, 0
            memo.kept_of = (chosen, kept, plus)
        policy.activity.note_forward(kept, sel_len, plus)
        if restricted.device != engine.device:
            restricted = restricted.to(engine.device)
        if not policy.watches_queries:
            rows = None
        elif rows is None:
            rows = restricted.nonzero().squeeze(1)
        read = DeviceReads(kept, plus + cache_len - sel_len)  # the tail: read by every row
        view = cls(policy, engine.scale, block_mask, restricted, chosen, cache_len, read, rows)
        prefix = memo.prefix_of
        if prefix is not None and prefix[0] is chosen:
            view.prefix_of = (prefix[1], prefix[2])
        return view

    def observe(self, layer: int, q: torch.Tensor) -> None:
        """Show the policy the restricted rows' queries of `q [n_heads, n, d]` (policies that watch them)."""
        if self.rows is not None:
            self.policy.observe(layer, q[:, self.rows])

    def observe_layers(self, queries: torch.Tensor) -> None:
        """`observe` of every layer's `queries [n_layers, n_heads, n, d]` at once."""
        if self.rows is not None:
            self.policy.observe_layers(queries[:, :, self.rows])

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.observe(layer, q[0])
        return restricted_attention(
            q, k, v, self.selection[layer], self.restricted, self.block_mask, self.scale
        )

    def kv_read(self, cache_len: int) -> DeviceReads:
        """Cached entries read per KV head by the restricted rows, per layer on the device, plus the tail
        (`Counts` takes their rounded mean when the generation ends)."""
        return self.read


class ObservedCausalView(CausalView):
    """`CausalView` that first shows every layer's queries to `policy.observe` (all rows restricted)."""

    # core.decode_graph keeps every layer's queries and hands them to `observe_layers`
    kind: ClassVar[ViewKind] = ViewKind.CAUSAL_SHOWN_TO_POLICY

    def __init__(self, scale: float, policy: Any) -> None:
        super().__init__(scale)
        self.policy = policy

    def observe(self, layer: int, q: torch.Tensor) -> None:
        """Show the policy the queries `[n_heads, n, d]` of every row of the block."""
        self.policy.observe(layer, q)

    def observe_layers(self, queries: torch.Tensor) -> None:
        self.policy.observe_layers(queries)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        self.observe(layer, q[0])
        return super().attend(layer, q, k, v)


def stack_masks(keep: dict[int, torch.Tensor], shape: tuple[int, int, int], device: Any) -> torch.Tensor:
    """bool `shape` (`[n_layers, n_kv_heads, length]`, longer if a mask is): `keep[layer]` over its first
    positions, True elsewhere. Masks of one width on consecutive layers (every layer past the dense ones)
    are copied in one operator."""
    n_layers, hkv, length = shape
    length = max(length, *(m.shape[1] for m in keep.values()), 0)
    stack = torch.ones(n_layers, hkv, length, dtype=torch.bool, device=device)
    layers = sorted(keep)
    widths = {keep[layer].shape[1] for layer in layers}
    if len(widths) == 1 and layers == list(range(layers[0], layers[-1] + 1)):
        stack[layers[0] : layers[-1] + 1, :, : widths.pop()] = torch.stack([keep[layer] for layer in layers])
    else:
        for layer, mask in keep.items():
            stack[layer, :, : mask.shape[1]] = mask
    return stack


# --- SFI's views (`decoder=sfi`, `kv=sfi`) ---------------------------------------------------------
# SFI's fast step on the `sliced` backend (SFI §3.4, "Reorg"): the long-range part of the sparse
# set (sinks + the Selector's entries) is packed into the compressed region's first slots once per slow
# step, and the recent window is read in place at the end of the cache.
#
# A fast step's one query row then attends to two slices of the one cache, with one softmax over both
# (`core.attention.one_row_two_slices`): slots `[0, m_h)` (the packed set of KV head h) and slots
# `[L - recent, L]` (the recent window and the new token, which sit at slot == position: packing only
# trades places among entries older than the window of the slow step that chose them). Nothing is
# copied or moved between slow steps. The visible set is the policy's own (`SFI.select`): sinks,
# recent window, chosen entries; only the layout differs from the generic region view, which packs the
# recent window too and so moves entries on every step.


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
        pol.gather_evidence(layer, q, pol.engine.cache.length, logits[None])
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
