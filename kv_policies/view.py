"""`RestrictedView`: a block layout where some query rows see only a KV policy's selection.

Dense SDPA with a per-KV-head boolean mask: the reference path every sparse backend must equal.
`block_mask` `[n, n]` gives visibility inside the block; `restricted` `[n]` marks rows that see only
`policy.visible(...)` of the cache, the other rows see the whole cache. `tail_from` (optional): cached
entries from that position on are a speculative tail (a self-drafting decoder's own fresh tokens):
visible to every row, never offered to the policy, which selects over `[0, tail_from)` only.

`InForwardView`: the same, for a policy that chooses from the forward's own queries and can also make
that choice inside a fixed-shape forward (Quest, Top-K: their `InForwardSelector`).

The views that read a selection made before the forward: `kv_policies.shared_selection` (one selection for
every layer and head) and `kv_policies.layer_selection` (one per layer and KV head). Which view a block
gets: `core.policy_views`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import torch

from core.attention import ViewKind, sdpa

if TYPE_CHECKING:
    from core.types import PolicyEngine
    from kv_policies.base import KVPolicy


class FixedShapeForward(Protocol):
    """The fixed-shape forward a selector serves (`core.decode_graph.StaticForward`), as far as the
    selector reads it: policies do not import the graph machinery (tests/test_policy_structure.py)."""

    engine: PolicyEngine


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
        policy: KVPolicy,
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
    def all_rows(cls, policy: KVPolicy, engine: PolicyEngine, n_block: int) -> RestrictedView:
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

    def selector(self, static: FixedShapeForward) -> InForwardSelector:
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

    def __init__(self, static: FixedShapeForward, policy: KVPolicy) -> None:
        eng = static.engine
        self.engine, self.dense = eng, policy.dense_layers
        self.capacity = eng.cache.capacity
        self.length = torch.zeros(1, dtype=torch.long, device=eng.device)
        self.reads = torch.zeros(eng.cache.n_layers, dtype=torch.long, device=eng.device)

    def stage(self, view: InForwardView, n: int, length: int) -> None:
        """Before the step (outside a CUDA graph): the selectable length of a cache of `length` entries."""
        if self.engine.cache.capacity != self.capacity:  # StaticForward's key
            raise RuntimeError(f"the cache was reallocated under a {type(self).__name__}")
        self.length.fill_(selectable_length(length, view.tail_from))

    def dense_layer(self, layer: int, slots: torch.Tensor) -> torch.Tensor:
        """A dense layer's selection: every slot (its reads: the selectable entries)."""
        self.reads[layer].copy_(self.length[0])
        return torch.ones(self.engine.cache.n_kv_heads, slots.numel(), dtype=torch.bool, device=slots.device)
