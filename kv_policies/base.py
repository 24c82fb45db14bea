"""The KV policy contract: one small plug-in every decoder can use.

A policy decides which *cached* entries a restricted query row may see:
`visible(layer, q, k_cache, cache_len) -> bool [n_kv_heads, cache_len]` (GQA-aware: one choice per
KV head, shared by its query heads). `q` is `[n_heads, n_rows, head_dim]` for the restricted rows of
the current block (dynamic policies such as Quest score pages with it); `k_cache` is
`[n_kv_heads, cache_len, head_dim]` (post-RoPE keys, slots in physical order; the logical position
of slot s is `engine.cache.slot_pos[s]`).

Policies reason in LOGICAL positions (0 .. cache_len-1, the token's index in the sequence, which is
also its RoPE position): subclasses implement `select(layer, q, k_cache, cache_len) -> bool
[n_kv_heads, cache_len]` over logical positions, and `visible` maps that onto physical slots. The
physical layout may be permuted by a compressed region (`core.compressed_region`, FAFO §4.4 / App. H);
keys are post-RoPE, so a permutation of cached entries never changes attention. Only freshly committed
entries (slots `>= ` the last length a policy saw) are guaranteed to sit at slot == position; anything
older is found through `physical(layer, positions)`.

Decoders combine a policy with their block layout through `restricted_view(engine, block_mask,
restricted, backend)`:
- vanilla + policy (the lossy baseline): every decode row is restricted (`decode_view`);
- FAFO: only the fumble rows are restricted (verification rows see the full cache);
- Lookahead / prompt lookup with a lossy policy: every block row is restricted (lossy variants).
`backend="dense"` is `kv_policies.view.RestrictedView` (SDPA with a mask, the reference);
`flex` / `sliced` / `flash` keep the selection in a block-aligned region at the head of the KV
tensors (`core.compressed_region.CompressedRegion`) and skip the rest for real; on an engine with
fixed-shape forwards an all-restricted block of a `query_free` policy reads its selection by gather
instead (`gathered_view`), so that its step keeps one shape.

Hooks, all scoped to one generation (a policy's state lives for one generation, and nothing a
constructor does touches an engine): `attach(engine)` and `reset(prompt_len, context_len)` at the
start of every generation (`BaseDecoder.generate`), `prefill_hooks()` handed to that generation's
`engine.prefill(..., hooks=...)` (`on_prefill(layer, q, k_all, cache_len)`: SnapKV's observation
window, H2O's prefill scores), `after_prefill(engine)` (static selections such as SnapKV),
`observe(layer, q)` (queries of the restricted rows, for accumulated scores), `after_commit(engine,
n_new)` (sliding windows, H2O). Several decoders (a run's decoder and the audit's vanilla reference)
may share one engine: each brings its own policy to each generation.

A budget counts cached entries per KV head; the block's own tokens are always visible on top of it.
`budget_frac` (when set) replaces the absolute budget per generation by that fraction of the
context the generation can reach (prompt + max_new_tokens), never below the policy's smallest valid
budget: the papers' 760-of-~8k budgets scaled to contexts of a few hundred tokens. A budget at or
above the context keeps everything, and the decode view is then exactly the full (`CausalView`)
path, so the output equals `kv=full` token for token; `activity` says per generation how often the
policy really restricted attention (`kv_policies.activity`).
"""

from __future__ import annotations

import logging
import math
from typing import Any, ClassVar

import torch

from core.attention import CausalView
from core.compressed_region import CompressedRegion
from core.options import NoOptions
from kv_policies.activity import Activity, SelectionActivity
from kv_policies.view import (
    LayerSelectionView,
    ObservedCausalView,
    RestrictedView,
    SelectionView,
    ViewMemo,
    causal_block,
    stack_masks,
)

log = logging.getLogger(__name__)

_WARNED_UNGRAPHED: set[str] = set()  # region backends warned about under CUDA graphs (once per process)


class KVPolicy:
    """Base of every KV policy (the module docstring explains the layout it reasons in).

    A subclass MUST set `name` (its config name: conf/kv/<name>.yaml, its `kv_policies.registry` key) and
    implement `select(layer, q, k_cache, cache_len)` -> bool `[n_kv_heads, cache_len]` over logical
    positions. It MAY set `budget` (and `min_budget()`), `shared`, `query_free`, `backend`, `dense_layers`,
    and use the per-generation hooks: `reset`, `prefill_hooks`/`on_prefill`, `after_prefill`, `observe`,
    `after_commit`, `rebuild` (what each is for: the module docstring). Its options are one dataclass,
    `Config` (`core.options`): what its YAML holds and the records show. `fixed_selection` may give a
    selection shared by every layer and head without reading the cache. Its constructor takes only its
    config's keys, checked with `core.checks` or the `check_*`
    helpers of `kv_policies.checks`; state that depends on a prompt is created in `reset`, never in the
    constructor, so one policy object serves every generation of a run. Decoders use it only through
    `decode_view`, `draft_view`, `restricted_view` and `after_commit`.
    """

    name: str = "base"
    Config: ClassVar[type] = NoOptions  # its options (core.options): the one place each is declared
    lossless: bool = False  # True only when every entry stays visible (FullKV)
    shared: bool = False  # True: the same selection for every layer and KV head (StreamingLLM)
    budget: int | None = None  # cached entries per KV head (None = unbounded)
    backend: str = "dense"  # decode_view's attention backend (see `kv_policies.checks.BACKENDS`)
    dense_layers: int = 0  # the first layers keep every entry (TriForce Table 1's "first two layers full")
    # True: `select` reads neither the forward's queries nor its keys (the choice was made before it, from
    # the prefill or earlier steps): the selections of every layer can be read before the forward, which
    # then takes the fixed-shape path (`kv_policies.view.LayerSelectionView`)
    query_free: bool = False
    # True: `keeps_all` gives one answer for every layer from `dense_layers` on, so the last layer's answer
    # is every layer's. A subclass with its own `keeps_all` is asked layer by layer unless it says True.
    keeps_alike: bool = True

    engine: Any = None
    region: Any = None  # the CompressedRegion currently laying out this policy's selection, if any
    _noted_large: bool = False
    # made on first use (a subclass's constructor need not call this one's): the activity counters, the
    # views' memo, and `stacked_keep`'s stack (its layers, its last prefix, what its layers keep)
    _activity: SelectionActivity | None = None
    _view_memo: ViewMemo | None = None
    _stack: torch.Tensor | None = None
    _stack_layers: int | None = None
    _stacked: tuple[int, torch.Tensor] | None = None
    _kept_beyond: tuple[int, torch.Tensor] | None = None

    @property
    def may_fix_selection(self) -> bool:
        """Whether the policy overrides `fixed_selection` (a `SelectionView` is worth trying)."""
        return type(self).fixed_selection is not KVPolicy.fixed_selection

    @property
    def watches_queries(self) -> bool:
        """Whether the policy overrides `observe`: it is shown the restricted rows' queries."""
        return type(self).observe is not KVPolicy.observe

    # --- hooks ---------------------------------------------------------------------------------
    def attach(self, engine: Any) -> None:
        """Bind to the engine of the generation about to start (reads it; changes nothing in it)."""
        self.engine = engine

    def prefill_hooks(self) -> list:
        """Callbacks for this generation's `engine.prefill(..., hooks=...)`."""
        return [self.on_prefill] if type(self).on_prefill is not KVPolicy.on_prefill else []

    def on_prefill(self, layer: int, q: torch.Tensor, k_all: torch.Tensor, cache_len: int) -> None:
        """In each prefill chunk: q `[n_heads, chunk, d]`, keys `[n_kv_heads, cache_len + chunk, d]`."""

    def reset(self, prompt_len: int, context_len: int | None = None) -> None:
        """Start a generation over a prompt of `prompt_len` tokens that may grow to `context_len`."""
        self.region = None
        self.forget_stack()  # `stacked_keep`'s stack belongs to one generation
        context = max(context_len or prompt_len, prompt_len)
        if self.budget_frac is not None:
            self.set_budget(max(self.min_budget(), math.ceil(self.budget_frac * context)))
        self.activity.reset()
        if not self.can_restrict(prompt_len, context):
            self._warn_inactive(context)

    # --- budget --------------------------------------------------------------------------------
    budget_frac: float | None = None

    def min_budget(self) -> int:
        """Smallest valid budget (the always-kept part plus one selectable entry)."""
        return 1

    def can_restrict(self, prompt_len: int, context: int) -> bool:
        """False when this generation's selection is bound to keep every entry (budget >= context)."""
        return self.budget is None or self.budget < context

    def set_budget(self, budget: int) -> None:
        """Use `budget` from now on (subclasses recompute what derives from it)."""
        self.budget = budget

    @property
    def activity(self) -> SelectionActivity:
        if self._activity is None:
            self._activity = SelectionActivity()
        return self._activity

    @property
    def view_memo(self) -> ViewMemo:
        """What this policy's views remember between steps (`kv_policies.view.ViewMemo`)."""
        if self._view_memo is None:
            self._view_memo = ViewMemo()
        return self._view_memo

    def activity_summary(self, forwards: int) -> Activity:
        """How much this generation's `forwards` decode forwards were restricted."""
        return self.activity.summary(forwards)

    def after_prefill(self, engine: Any) -> None:
        pass

    def observe(self, layer: int, q: torch.Tensor) -> None:
        """Queries `[n_heads, rows, head_dim]` of the rows restricted to this policy (every layer)."""

    def observe_layers(self, queries: torch.Tensor) -> None:
        """`observe` of every layer at once, `queries [n_layers, n_heads, rows, head_dim]` (the
        fixed-shape forward keeps them stacked)."""
        for layer in range(queries.shape[0]):
            self.observe(layer, queries[layer])

    def after_commit(self, engine: Any, n_new: int) -> None:
        pass

    def rebuild(self, engine: Any) -> float:
        """Choose the selection again from what has been observed (a drafting decoder's stride).
        Returns the cached entries it read per layer and KV head (keys count half an entry)."""
        return 0.0

    # --- selection -----------------------------------------------------------------------------
    def keeps_all(self, layer: int, cache_len: int) -> bool:
        """True when this layer's selection is every cached entry (budget >= context, dense layers)."""
        return layer < self.dense_layers or self.budget is None or cache_len <= self.budget

    def keeps_every_layer(self, n_layers: int, cache_len: int) -> bool:
        """`keeps_all` for layers `0..n_layers-1`. The last layer is asked first: dense layers come
        first, so a restricting policy, and one whose layers answer alike, answer in one call."""
        if not self.keeps_all(n_layers - 1, cache_len):
            return False
        return self.keeps_alike or all(self.keeps_all(li, cache_len) for li in range(n_layers - 1))

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "keeps_all" in vars(cls) and "keeps_alike" not in vars(cls):
            cls.keeps_alike = False  # its own rule may tell layers apart: asked layer by layer

    def fixed_selection(self, cache_len: int) -> tuple[torch.Tensor, int] | None:
        """`(bool [cache_len] over physical slots, entries it keeps)` when this generation's selection
        of `[0, cache_len)` is the same for every layer, KV head and query and is known without reading
        the cache's keys or the host-side state of the device (StreamingLLM's sinks and window); None
        otherwise (the default). Such a selection becomes one `[n, L + n]` visibility built on the
        device, so the step takes the fixed-shape forward (`core.decode_graph`) without a sync."""
        return None

    def fixed_hole(self, cache_len: int) -> tuple[int, int, int] | None:
        """`(lo, hi, entries kept)` when `fixed_selection(cache_len)` is every slot but `[lo, hi)` (a
        window over slots that hold their positions): the visibility is then written without building
        the selection. None (the default): use `fixed_selection`."""
        return None

    def layer_selections(self, cache_len: int) -> torch.Tensor:
        """bool `[n_layers, n_kv_heads, cache_len]` over physical slots: every layer's `visible` for a
        `query_free` policy, read once per step before the forward (`kv_policies.view.LayerSelectionView`).
        A policy whose selections change only at chosen moments may serve a cached stack instead."""
        cache = self.engine.cache
        out = torch.ones(cache.n_layers, cache.n_kv_heads, cache_len, dtype=torch.bool, device=cache.device)
        for layer in range(cache.n_layers):
            if not self.keeps_all(layer, cache_len):
                out[layer] = self.visible(layer, None, cache.k[layer, :, :cache_len], cache_len)
        return out

    def stacked_keep(self, keep: dict[int, torch.Tensor], cache_len: int) -> torch.Tensor:
        """`layer_selections` from per-layer keep masks fixed after the prefill (`keep[layer]`: bool
        `[n_kv_heads, P]` over the first P logical positions; later entries and layers without a mask are
        visible). The masks are stacked once per generation over the whole allocation, so that a step's
        selection is the stack's first `cache_len` slots (a view; a compressed region's map: a gather)."""
        cache = self.engine.cache
        stacked = self._stack_layers == len(keep)  # `reset` drops the last generation's
        last = self._stacked
        if stacked and last is not None and last[0] == cache_len and self.region is None:
            return last[1]  # a draft's rounds select over the same entries, which committing never moves
        stack = self._stack
        if not stacked or stack is None or stack.shape[2] < cache_len:
            shape = (cache.n_layers, cache.n_kv_heads, max(cache_len, cache.capacity))
            stack = self._stack = stack_masks(keep, shape, cache.device)
            self._stack_layers = len(keep)
            # what each layer keeps of its first `width` positions per KV head, less `width`: past the
            # masks every entry is kept, so of `cache_len >= width` positions it keeps this + cache_len
            width = max((m.shape[1] for m in keep.values()), default=0)
            beyond = stack[:, :, :width].sum(dim=(1, 2)) // cache.n_kv_heads - width
            self._kept_beyond = (width, beyond)
        logical = stack.narrow(2, 0, cache_len)  # one call, not tuple indexing
        physical = self.physical_stack(logical)
        self._stacked = (cache_len, physical)  # committed slots keep their entries
        width, beyond = self._kept_beyond
        if cache_len >= width and self.region is None:  # slots 0..cache_len-1 hold positions 0..cache_len-1
            self.view_memo.kept_of = (physical, beyond, cache_len)  # `LayerSelectionView` counts no more
        if physical is logical:  # the stack's own prefix (`LayerSelectionView.prefix_of`)
            self.view_memo.prefix_of = (physical, stack, width)
        return physical

    def forget_stack(self) -> None:
        """Drop `stacked_keep`'s stack: the keep masks changed (a new generation, a rebuild)."""
        self._stack_layers = self._stacked = None
        self.view_memo.prefix_of = None

    def physical_stack(self, logical: torch.Tensor) -> torch.Tensor:
        """Every layer's selection `[n_layers, n_kv_heads, L]` over logical positions, mapped onto
        physical slots (as `visible` maps one layer's)."""
        n_layers, hkv, cache_len = logical.shape
        if self.region is not None:  # a permuted layout: each layer's own map
            maps = [self.logical_of_slots(li, hkv, cache_len) for li in range(n_layers)]
            return torch.stack([logical[li].gather(1, m) for li, m in enumerate(maps)])
        if self.in_order():
            return logical
        slots = self.engine.cache.slot_pos[:cache_len].expand(n_layers, hkv, cache_len)
        return logical.gather(2, slots)

    def selection_key(self, layer: int, sel_len: int) -> Any:
        """A value that changes whenever layer `layer`'s `select` over `[0, sel_len)` may change, for a
        policy whose `select` needs neither the forward's queries nor its keys (it is then called with
        `q=None`); None (the default): choose again at every forward. A compressed region places such
        selections once per key, every layer in one go (a draft's rounds share one placement)."""
        return None

    def max_selected(self, capacity: int) -> int:
        """Upper bound on entries selected per KV head for any cache length <= capacity."""
        return capacity if self.budget is None else min(self.budget, capacity)

    def select(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, cache_len: int) -> torch.Tensor:
        """bool `[n_kv_heads, cache_len]` over logical positions; True = the restricted rows may see it."""
        raise NotImplementedError

    @torch.inference_mode()
    def visible(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, cache_len: int) -> torch.Tensor:
        """The selection as a mask over physical slots `[n_kv_heads, cache_len]`."""
        hkv = k_cache.shape[0]
        if self.keeps_all(layer, cache_len):
            return torch.ones(hkv, cache_len, dtype=torch.bool, device=k_cache.device)
        sel = self.select(layer, q, k_cache, cache_len).to(k_cache.device)
        if self.in_order():
            return sel
        return sel.gather(1, self.logical_of_slots(layer, hkv, cache_len, k_cache.device))

    # --- layout helpers ------------------------------------------------------------------------
    def logical_of_slots(self, layer: int, hkv: int, cache_len: int, device: Any = "cpu") -> torch.Tensor:
        """long `[n_kv_heads, cache_len]`: the logical position held by each physical slot."""
        if self.region is not None:
            return self.region.positions(layer, cache_len)
        if self.engine is not None and self.engine.cache.capacity >= cache_len:
            return self.engine.cache.slot_pos[:cache_len].expand(hkv, cache_len)
        return torch.arange(cache_len, device=device).expand(hkv, cache_len)

    def physical(self, layer: int, positions: torch.Tensor, hkv: int) -> torch.Tensor:
        """long `[n_kv_heads, m]`: the slot holding each logical position `positions [m]` (or
        `[n_kv_heads, m]`), per KV head."""
        pos = positions if positions.dim() >= 2 else positions.expand(hkv, -1)
        if self.region is not None:
            return self.region.slots_of(layer, pos)
        if self.in_order() or self.engine is None or not pos.numel():
            return pos
        # committed slots hold a permutation of the positions before the cache's length: invert it on
        # the device (checking for the identity would make the host wait for the cache)
        cache = self.engine.cache
        sp = cache.slot_pos[: cache.length]
        inv = torch.empty(cache.length, dtype=torch.long, device=sp.device)
        inv[sp] = torch.arange(cache.length, device=sp.device)
        return inv[pos]

    def in_order(self) -> bool:
        """Whether committed slot s holds position s (`KVCache.in_order`, no compressed region): slots
        are then read as positions, without a map."""
        return self.region is None and (self.engine is None or self.engine.cache.in_order)

    def gather_keys(self, layer: int, k_cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Keys `[n_kv_heads, m, head_dim]` of logical `positions` from physical `k_cache`."""
        hkv = k_cache.shape[0]
        slots = self.physical(layer, positions, hkv)
        # one row copy per entry and head (a `gather` over an expanded [hkv, m, d] index is ~5x slower)
        return torch.stack([k_cache[h].index_select(0, slots[h]) for h in range(hkv)])

    # --- views ---------------------------------------------------------------------------------
    def restricted_view(
        self,
        engine: Any,
        block_mask: torch.Tensor,
        restricted: torch.Tensor,
        backend: str | None = None,
        tail_from: int | None = None,
        rows: slice | None = None,
    ) -> Any:
        """A view where `restricted` rows see only this policy's selection of the cache (plus the block
        through `block_mask [n, n]`) and the other rows the whole cache. `tail_from`: cached entries
        from that position on (a self-drafting decoder's fresh tokens) are visible to every row and
        the policy selects over the entries before it only. `rows`: the restricted rows as a range,
        when the caller knows it (the view then need not read `restricted` to find them)."""
        backend = backend or self.backend
        if backend != "dense" and getattr(engine, "graphs", None) is not None and self.gathers(rows):
            return self.gathered_view(engine, block_mask, restricted, tail_from)
        if backend == "dense":
            view = SelectionView.build(self, engine, block_mask, restricted, tail_from, rows)
            view = view or LayerSelectionView.build(
                self, engine, block_mask, restricted, tail_from, rows=rows
            )
            view = view or self.forward_view(engine, block_mask, restricted, tail_from, rows)
            return view or RestrictedView(self, engine.scale, block_mask, restricted, tail_from, rows)
        return self.region_for(engine, backend).view(block_mask, restricted, tail_from, rows)

    def gathers(self, rows: slice | None) -> bool:
        """Whether a compressed-region backend's block with restricted `rows` reads its selection by
        gather on an engine with fixed-shape forwards (`gathered_view`): every row restricted, by a
        policy that chooses before the forward. Otherwise the region lays the step out."""
        return rows == slice(None) and self.query_free

    def gathered_view(
        self, engine: Any, block_mask: torch.Tensor, restricted: torch.Tensor, tail_from: int | None
    ) -> Any:
        """A compressed-region backend's view for a block that `gathers`: the per-layer selection, which
        the fixed-shape forward reads by gather (the same entries the region would pack, none moved
        between steps, so every step keeps one shape)."""
        view = LayerSelectionView.build(self, engine, block_mask, restricted, tail_from, rows=slice(None))
        view.gather_budget = self.max_selected(engine.cache.capacity)
        n_layers = engine.cache.n_layers
        view.whole_layers = frozenset(li for li in range(n_layers) if self.keeps_all(li, view.sel_len))
        return view

    def forward_view(
        self,
        engine: Any,
        block_mask: torch.Tensor,
        restricted: torch.Tensor,
        tail_from: int | None,
        rows: slice | None,
    ) -> Any:
        """A `RestrictedView` whose choice can also be made inside a fixed-shape forward (a policy that
        chooses from the forward's own queries, such as Quest: its `Selector`); None: the
        plain `RestrictedView`, which takes the regular forward."""
        return None

    def draft_view(self, engine: Any, tail_from: int, n_block: int = 1) -> Any:
        """A block of `n_block` restricted rows, causal among themselves (a self-speculative draft step,
        or TriForce's middle level checking a draft model's tokens) over the selection of
        `[0, tail_from)` plus the fresh tail `[tail_from, length)`; the plain causal view when nothing
        is restricted."""
        if not self.watches_queries and self.keeps_every_layer(engine.cache.n_layers, tail_from):
            return CausalView(engine.scale)
        tril, rows = causal_block(n_block, engine.device)
        return self.restricted_view(engine, tril, rows, tail_from=tail_from, rows=slice(None))

    def region_for(self, engine: Any, backend: str) -> Any:
        """The compressed region laying out this policy's selection in `engine`'s cache (created once
        per generation; `reset` drops it)."""
        reg = self.region
        if reg is None or reg.cache is not engine.cache or reg.backend != backend:
            if reg is not None:
                reg.restore()
            if getattr(engine, "graphs", None) is not None and backend not in _WARNED_UNGRAPHED:
                _WARNED_UNGRAPHED.add(backend)
                log.warning(
                    "kv.backend=%s moves entries between steps: the restricted steps it lays out "
                    "(blocks with unrestricted rows, or a policy that chooses from the forward's queries) "
                    "take the regular forward, not the CUDA graphs (kv.backend=dense keeps them on the "
                    "graphs)",
                    backend,
                )
            reg = CompressedRegion(self, engine, backend=backend)
        return reg

    def decode_view(self, engine: Any, n_block: int) -> Any:
        """View for a block whose rows all see the policy's selection (plus the block causally)."""
        cache_len = engine.length
        if self.keeps_every_layer(engine.cache.n_layers, cache_len):
            if not self.watches_queries:
                return CausalView(engine.scale)
            return ObservedCausalView(engine.scale, self)
        tril, every = causal_block(n_block, engine.device)
        return self.restricted_view(engine, tril, every, rows=slice(None))

    # --- misc ----------------------------------------------------------------------------------
    def _warn_inactive(self, context: int) -> None:
        """Warn once per policy object when it cannot restrict a generation."""
        if not self._noted_large:
            self._noted_large = True
            log.warning("kv=%s: %s: such generations equal kv=full", self.name, self.inactive_reason(context))

    def inactive_reason(self, context: int) -> str:
        """Why this policy cannot restrict a generation of `context` tokens (prompt + max_new_tokens)."""
        return (
            f"budget {self.budget} cannot restrict a context of {context} tokens (prompt + max_new_tokens); "
            "kv.budget_frac (e.g. the *_ctx10 presets) gives a budget that bites at this scale"
        )
