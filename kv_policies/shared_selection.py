"""`SelectionView`: a block layout for a policy whose selection is one set of slots for every layer,
head and query (`KVPolicy.fixed_selection`): a `MaskView` over `[n, L + n]` built on the device once per
step, so the step takes the fixed-shape forward and reads nothing back; `HoleView` when the selection is
every slot but a hole (`KVPolicy.fixed_hole`), whose mask no fixed-shape forward needs. Restricted rows
see the selection, the other rows the whole cache (as `kv_policies.view.RestrictedView`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from core.attention import MaskView, ViewKind
from kv_policies.view import causal_block, selectable_length

if TYPE_CHECKING:
    from core.types import PolicyEngine
    from kv_policies.base import KVPolicy


class SelectionView(MaskView):
    """Restricted rows see `selection` of the cache, the others all of it; `block_mask` inside the block.
    The policy's activity is noted for every layer when the view is built (one forward per view)."""

    def __init__(self, mask: torch.Tensor, scale: float, read: int) -> None:
        super().__init__(mask, scale)
        self.read = read

    @classmethod
    def build(
        cls,
        policy: KVPolicy,
        engine: PolicyEngine,
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
        graphed_hole = isinstance(selection, tuple) and engine.fixed_shape
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
    engine: PolicyEngine,
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
        engine: PolicyEngine,
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
    policy: KVPolicy,
    engine: PolicyEngine,
    selection: torch.Tensor | tuple[int, int],
    sel_len: int,
    cache_len: int,
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
