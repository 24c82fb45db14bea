"""`LayerSelectionView`: a block layout for a policy that chooses per layer and KV head before the
forward (`KVPolicy.query_free`: SnapKV, H2O, retrieval, kvpress presses): the selections of every layer
are read once per step into one `[n_layers, n_kv_heads, L]` tensor on the device
(`kv_policies.stacking`), so the step takes the fixed-shape forward. A policy that watches the queries
(`observe`) gets the restricted rows' queries of every layer, as from `RestrictedView`.

`ObservedCausalView`: the plain causal view (bit-identical to `CausalView`) that also hands the
queries to `policy.observe` (H2O accumulates attention even while the budget still covers everything).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from core.attention import CausalView, ViewKind
from core.types import DeviceReads
from kv_policies.stacking import selections
from kv_policies.view import restricted_attention, selectable_length

if TYPE_CHECKING:
    from core.types import PolicyEngine
    from kv_policies.base import KVPolicy


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
    # place, every entry True from `width` on (`kv_policies.stacking.KeepStack`): a fixed-shape forward that
    # staged the same stack before copies nothing while both lengths are past `width`
    prefix_of: tuple[torch.Tensor, int] | None = None

    def __init__(
        self,
        policy: KVPolicy,
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
        policy: KVPolicy,
        engine: PolicyEngine,
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
        chosen = selections(policy, sel_len)  # [n_layers, n_kv_heads, sel_len]
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

    def __init__(self, scale: float, policy: KVPolicy) -> None:
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
