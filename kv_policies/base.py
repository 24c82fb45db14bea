"""The KV policy contract: a policy is its rule (which cached entries a restricted query row may see),
its budget and the hooks it needs. What every policy needs besides is written once elsewhere: the slot
map (`kv_policies.layout`), every layer's selection at once (`kv_policies.stacking`) and the attention
views decoders ask for (`core.policy_views`). The layout, the hooks, the budgets: docs/kv-policies.md.
"""

from __future__ import annotations

import logging
import math
from functools import cached_property
from typing import Any, ClassVar

import torch

from core.options import NoOptions
from core.types import PolicyEngine  # at run time: no new load (core.options imports core.types)
from kv_policies.activity import SelectionActivity
from kv_policies.layout import SlotMap
from kv_policies.stacking import KeepStack
from kv_policies.view import InForwardSelector, ViewMemo

log = logging.getLogger(__name__)


class KVPolicy:
    """Base of every KV policy. A subclass MUST set `name` (its conf/kv/<name>.yaml, its registry key) and
    implement `select(layer, q, k_cache, cache_len)` -> bool `[n_kv_heads, cache_len]` over logical
    positions (keys through `self.slots.gather_keys`, not by slot). It MAY set `budget`, `shared`,
    `query_free`, `backend`, `dense_layers`, `Selector`, use the per-generation hooks below and declare
    what the views may exploit (`fixed_selection`, `fixed_hole`, `layer_selections`, `selection_key`,
    `max_selected`). Its options are one dataclass, `Config` (`core.options`), which its constructor
    fills; what depends on a prompt is made in `reset`, so one policy object serves every generation."""

    name: str = "base"
    Config: ClassVar[type] = NoOptions  # its options (core.options): the one place each is declared
    lossless: bool = False  # True only when every entry stays visible (FullKV)
    shared: bool = False  # True: the same selection for every layer and KV head (StreamingLLM)
    budget: int | None = None  # cached entries per KV head (None = unbounded)
    backend: str = "dense"  # decode_view's attention backend (see `kv_policies.checks.BACKENDS`)
    dense_layers: int = 0  # the first layers keep every entry (TriForce Table 1's "first two layers full")
    # True: `select` reads neither the forward's queries nor its keys (chosen from the prefill or earlier
    # steps): every layer's selection is read before the forward, which takes the fixed-shape path
    query_free: bool = False
    # True: `keeps_all` gives one answer for every layer from `dense_layers` on, so the last layer's answer
    # is every layer's. A subclass with its own `keeps_all` is asked layer by layer unless it says True.
    keeps_alike: bool = True

    engine: PolicyEngine | None = None  # set by `attach`
    _noted_large: bool = False
    # an `InForwardSelector` class when the choice can also run inside a fixed-shape forward (Quest, Top-K:
    # `kv_policies.view.InForwardView`); the policy then names the forwards it shares (`selector_key()`)
    Selector: type[InForwardSelector] | None = None
    # the engine side's `activity`, `view_memo`, `slots`, `keep_stack`: made on first use (below)

    @property
    def may_fix_selection(self) -> bool:
        """Whether the policy overrides `fixed_selection` (a `SelectionView` is worth trying)."""
        return type(self).fixed_selection is not KVPolicy.fixed_selection

    @property
    def watches_queries(self) -> bool:
        """Whether the policy overrides `observe`: it is shown the restricted rows' queries."""
        return type(self).observe is not KVPolicy.observe

    def attach(self, engine: PolicyEngine) -> None:
        """Bind to the engine of the generation about to start (reads it; changes nothing in it)."""
        self.engine, self.slots = engine, SlotMap(engine)

    def prefill_hooks(self) -> list:
        """Callbacks for this generation's `engine.prefill(..., hooks=...)`."""
        return [self.on_prefill] if type(self).on_prefill is not KVPolicy.on_prefill else []

    def on_prefill(self, layer: int, q: torch.Tensor, k_all: torch.Tensor, cache_len: int) -> None:
        """In each prefill chunk: q `[n_heads, chunk, d]`, keys `[n_kv_heads, cache_len + chunk, d]`."""

    def reset(self, prompt_len: int, context_len: int | None = None) -> None:
        """Start a generation over a prompt of `prompt_len` tokens that may grow to `context_len`."""
        self.slots = SlotMap(self.engine)  # no compressed region yet
        self.keep_stack.forget()  # the keep masks' stack belongs to one generation
        context = max(context_len or prompt_len, prompt_len)
        if self.budget_frac is not None:
            self.set_budget(max(self.min_budget(), math.ceil(self.budget_frac * context)))
        self.activity.reset()
        if not self.can_restrict(prompt_len, context):
            self._warn_inactive(context)

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

    @cached_property
    def activity(self) -> SelectionActivity:  # how much it restricted (`activity.summary(forwards)`)
        return SelectionActivity()

    @cached_property
    def view_memo(self) -> ViewMemo:  # what the views remember between steps
        return ViewMemo()

    @cached_property
    def slots(self) -> SlotMap:  # where the positions sit (a new map per generation: `attach`, `reset`)
        return SlotMap(self.engine)

    @cached_property
    def keep_stack(self) -> KeepStack:  # keep masks fixed after the prefill, stacked for every layer
        return KeepStack(self)

    def after_prefill(self, engine: PolicyEngine) -> None:
        """The prompt is cached (a static selection such as SnapKV's is made here)."""

    def observe(self, layer: int, q: torch.Tensor) -> None:
        """Queries `[n_heads, rows, head_dim]` of the rows restricted to this policy (every layer)."""

    def observe_layers(self, queries: torch.Tensor) -> None:
        """`observe` of every layer at once, `queries [n_layers, n_heads, rows, head_dim]`."""
        for layer in range(queries.shape[0]):
            self.observe(layer, queries[layer])

    def after_commit(self, engine: PolicyEngine, n_new: int) -> None:
        """`n_new` entries were committed (sliding windows, H2O's eviction)."""

    def rebuild(self, engine: PolicyEngine) -> float:
        """Choose the selection again from what has been observed (a drafting decoder's stride).
        Returns the cached entries it read per layer and KV head (keys count half an entry)."""
        return 0.0

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
        """`(bool [cache_len] over physical slots, entries kept)` when the selection of `[0, cache_len)`
        is the same for every layer, KV head and query and known without reading the keys or the device
        (StreamingLLM's sinks and window): one visibility built on the device, no sync (the default: None)."""
        return None

    def fixed_hole(self, cache_len: int) -> tuple[int, int, int] | None:
        """`(lo, hi, entries kept)` when `fixed_selection(cache_len)` is every slot but `[lo, hi)`: the
        visibility is then written without building the selection (the default: None)."""
        return None

    def selection_key(self, layer: int, sel_len: int) -> Any:
        """A value that changes whenever layer `layer`'s `select` over `[0, sel_len)` may (it is then
        called with `q=None`): a compressed region places once per key. None: choose at every forward."""
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
        if self.keeps_all(layer, cache_len):
            return torch.ones(k_cache.shape[0], cache_len, dtype=torch.bool, device=k_cache.device)
        return self.slots.to_slots(layer, self.select(layer, q, k_cache, cache_len).to(k_cache.device))

    def layer_selections(self, cache_len: int) -> torch.Tensor | None:
        """bool `[n_layers, n_kv_heads, cache_len]` over physical slots: every layer's `visible`, from a
        stack of a `query_free` policy's own (`keep_stack`); None (the default): asked layer by layer."""
        return None

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
