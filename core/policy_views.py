"""Which attention view a block gets under a KV policy: written once here for every policy.

Decoders say which rows of their block are restricted to the policy's selection, and this module builds
the view (the policy only declares its rule: `kv_policies.base.KVPolicy`):
- `decode_view(policy, engine, n)`: every row restricted (vanilla + policy, the lossy baseline; PLD and
  Lookahead's lossy variants);
- `draft_view(policy, engine, tail_from, n)`: a self-drafting decoder's draft rows, over the selection
  of `[0, tail_from)` plus the draft's own fresh tail;
- `restricted_view(policy, engine, block_mask, restricted, ...)`: any rows (FAFO: only the fumble rows;
  verification rows see the full cache).

`backend="dense"` is SDPA with a mask: a `SelectionView` (one selection for every layer and head,
`kv_policies.shared_selection`), a `LayerSelectionView` (a `query_free` policy,
`kv_policies.layer_selection`), an `InForwardView` (a policy with a `Selector`), or else
`kv_policies.view.RestrictedView` (the reference). `flex` / `sliced` / `flash` keep the selection in a
block-aligned region at the head of the KV tensors (`core.compressed_region.CompressedRegion`) and skip
the rest for real; on an engine with fixed-shape forwards an all-restricted block of a `query_free` policy
reads its selection by gather instead (`gathered_view`), so that its step keeps one shape. A policy that
keeps every entry gets the plain causal view, so its output equals `kv=full` token for token."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import torch

from core.attention import CausalView, View
from core.compressed_region import CompressedRegion, gathers
from kv_policies.layer_selection import LayerSelectionView, ObservedCausalView
from kv_policies.shared_selection import SelectionView
from kv_policies.view import InForwardView, RestrictedView, causal_block

if TYPE_CHECKING:
    from core.types import PolicyEngine
    from kv_policies.base import KVPolicy

log = logging.getLogger(__name__)

_WARNED_UNGRAPHED: set[str] = set()  # region backends warned about under CUDA graphs (once per process)


def decode_view(policy: KVPolicy, engine: PolicyEngine, n_block: int) -> View:
    """View for a block whose rows all see the policy's selection (plus the block causally)."""
    if policy.keeps_every_layer(engine.cache.n_layers, engine.length):
        if not policy.watches_queries:
            return CausalView(engine.scale)
        return ObservedCausalView(engine.scale, policy)
    tril, every = causal_block(n_block, engine.device)
    return restricted_view(policy, engine, tril, every, rows=slice(None))


def draft_view(policy: KVPolicy, engine: PolicyEngine, tail_from: int, n_block: int = 1) -> View:
    """A block of `n_block` restricted rows, causal among themselves (a self-speculative draft step,
    or TriForce's middle level checking a draft model's tokens) over the selection of
    `[0, tail_from)` plus the fresh tail `[tail_from, length)`; the plain causal view when nothing
    is restricted."""
    if not policy.watches_queries and policy.keeps_every_layer(engine.cache.n_layers, tail_from):
        return CausalView(engine.scale)
    tril, rows = causal_block(n_block, engine.device)
    return restricted_view(policy, engine, tril, rows, tail_from=tail_from, rows=slice(None))


def restricted_view(
    policy: KVPolicy,
    engine: PolicyEngine,
    block_mask: torch.Tensor,
    restricted: torch.Tensor,
    backend: str | None = None,
    tail_from: int | None = None,
    rows: slice | None = None,
) -> View:
    """A view where `restricted` rows see only the policy's selection of the cache (plus the block
    through `block_mask [n, n]`) and the other rows the whole cache. `tail_from`: cached entries
    from that position on (a self-drafting decoder's fresh tokens) are visible to every row and
    the policy selects over the entries before it only. `rows`: the restricted rows as a range,
    when the caller knows it (the view then need not read `restricted` to find them)."""
    backend = backend or policy.backend
    if backend != "dense" and engine.fixed_shape and gathers(policy, rows):
        return gathered_view(policy, engine, block_mask, restricted, tail_from)
    if backend == "dense":
        view = SelectionView.build(policy, engine, block_mask, restricted, tail_from, rows)
        view = view or LayerSelectionView.build(policy, engine, block_mask, restricted, tail_from, rows=rows)
        view = view or in_forward_view(policy, engine, block_mask, restricted, tail_from, rows)
        return view or RestrictedView(policy, engine.scale, block_mask, restricted, tail_from, rows)
    return region_for(policy, engine, backend).view(block_mask, restricted, tail_from, rows)


def in_forward_view(
    policy: KVPolicy,
    engine: PolicyEngine,
    block_mask: torch.Tensor,
    restricted: torch.Tensor,
    tail_from: int | None,
    rows: slice | None,
) -> InForwardView | None:
    """A `RestrictedView` whose choice can also be made inside a fixed-shape forward, for a policy that
    chooses from the forward's own queries and names its `Selector` (Quest, Top-K); None (the plain
    `RestrictedView`, which takes the regular forward) under a compressed region, or with a draft tail
    its selector does not stage."""
    selector = policy.Selector
    if (
        selector is None
        or policy.slots.region is not None
        or (tail_from is not None and not selector.takes_tail)
    ):
        return None
    return InForwardView(policy, engine.scale, block_mask, restricted, tail_from, rows)


def gathered_view(
    policy: KVPolicy,
    engine: PolicyEngine,
    block_mask: torch.Tensor,
    restricted: torch.Tensor,
    tail_from: int | None,
) -> LayerSelectionView:
    """A compressed-region backend's view for a block that `gathers`: the per-layer selection, which
    the fixed-shape forward reads by gather (the same entries the region would pack, none moved
    between steps, so every step keeps one shape)."""
    view = LayerSelectionView.build(policy, engine, block_mask, restricted, tail_from, rows=slice(None))
    assert view is not None  # a `query_free` policy's
    view.gather_budget = policy.max_selected(engine.cache.capacity)
    n_layers = engine.cache.n_layers
    view.whole_layers = frozenset(li for li in range(n_layers) if policy.keeps_all(li, view.sel_len))
    return view


def region_for(policy: KVPolicy, engine: PolicyEngine, backend: str) -> CompressedRegion:
    """The compressed region laying out the policy's selection in `engine`'s cache (created once per
    generation: the policy's `reset` gives it a new slot map, without one)."""

    reg = policy.slots.region
    if reg is None or reg.cache is not engine.cache or reg.backend != backend:
        if reg is not None:
            reg.restore()
        if engine.fixed_shape and backend not in _WARNED_UNGRAPHED:
            _WARNED_UNGRAPHED.add(backend)
            log.warning(
                "kv.backend=%s moves entries between steps: the restricted steps it lays out "
                "(blocks with unrestricted rows, or a policy that chooses from the forward's queries) "
                "take the regular forward, not the CUDA graphs (kv.backend=dense keeps them on the "
                "graphs)",
                backend,
            )
        reg = CompressedRegion(policy, engine, backend=backend)
    return reg
