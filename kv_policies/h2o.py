"""H2O: heavy hitters by accumulated attention plus a recent window (Zhang et al. 2023).

Reference (`H2OKVCache_LayerWise(hh_size, recent_size)`): every cached entry
accumulates, per head, the attention mass it receives from every query (the prompt's queries at
prefill, then each decode query); once the cache is over budget the `recent` newest entries are kept
plus the `budget - recent` entries with the largest accumulated score among the older ones; evicted
entries never come back.

GQA-aware (the reference breaks on GQA: scores per query head, cache per KV head): the attention a
KV head's query heads pay is summed into one score per KV head, and eviction is per KV head.
Prefill scores come from `on_prefill` (an `engine.prefill_hooks` entry, causal attention of each
chunk's queries, computed in row tiles). During decoding the restricted rows' queries are captured by
`observe` and scored in `after_commit` against the visible set plus the newly committed entries
(for one decode row this is exactly the step's softmax; for multi-row blocks such as FAFO's fumble
rows every restricted row's attention is added, a stated approximation).
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from functools import partial
from typing import Any

import torch

from core.options import options
from core.types import HarnessError, PolicyEngine
from kv_policies.attention_mass import attention_mass
from kv_policies.base import KVPolicy
from kv_policies.checks import check_backend, check_budget, check_budget_frac, check_dense_layers
from kv_policies.h2o_rule import FixedCommit, KeyRows, h2o_commit

PREFILL_TILE = 256


@dataclass
class H2OConfig:
    budget: int = 760  # cached entries per KV head (the papers' setting; ~10% of their ~8k contexts)
    recent: int | None = None  # newest entries kept (None = budget // 2: equal heavy and recent sizes)
    backend: str = "dense"
    budget_frac: float | None = None  # a fraction of each generation's context instead (None: budget)
    dense_layers: int = 0  # the first layers see the whole cache (TriForce Table 1: 2)


class H2O(KVPolicy):
    name = "h2o"
    keeps_alike = True  # `keeps_all`: one answer for every layer past the dense ones
    query_free = True  # chosen from the prefill and earlier steps, never from the forward it restricts

    Config = H2OConfig

    def __init__(self, **given: Any) -> None:
        o = options(self.Config, given)
        budget, recent, backend, budget_frac, dense_layers = astuple(o)  # in their declared order
        self.dense_layers = check_dense_layers(self.name, dense_layers)
        self._recent_cfg = recent  # None: half of the budget, whatever the budget becomes
        recent = budget // 2 if recent is None and isinstance(budget, int) else recent
        if not isinstance(recent, int) or recent < 0:
            raise HarnessError(f"kv=h2o: recent must be a non-negative integer, got {recent!r}")
        self.set_budget(check_budget(self.name, budget, recent, "the recent window"))
        self.budget_frac = check_budget_frac(self.name, budget_frac)
        self.backend = check_backend(self.name, backend)
        self._S = self._A = self._P = None
        self._keys = KeyRows()
        self._P_valid = False
        self._fixed: FixedCommit | None = None

    def min_budget(self) -> int:
        return 2 if self._recent_cfg is None else self._recent_cfg + 1

    def set_budget(self, budget: int) -> None:
        self.budget = budget
        self.recent = budget // 2 if self._recent_cfg is None else self._recent_cfg
        self.heavy = budget - self.recent

    def reset(self, prompt_len: int, context_len: int | None = None) -> None:
        super().reset(prompt_len, context_len)
        # every layer's scores and alive flags in one tensor each, `[n_layers, n_kv_heads, capacity]`, so a
        # step updates all layers in a few operators; `_layers` holds the layers that have state. The
        # buffers are zeroed, not dropped: the steady update's graph was captured on their addresses.
        if self._S is not None and self._A is not None:
            with torch.inference_mode():  # made under inference mode (`after_commit`, `on_prefill`)
                self._S.zero_()
                self._A.zero_()
        self._P_valid = False  # `_P` holds the alive positions (the steady update keeps them)
        self._layers: set[int] = set()
        self._q = {}
        self._qbuf: torch.Tensor | None = None  # `observe`'s stacked copies
        self._stacked: torch.Tensor | None = None  # `_qbuf` whole, when `observe_layers` filled it
        self._count: dict[int, int] = {}  # alive entries per KV head (every head keeps as many), on the host
        self._evicted = False

    def keeps_all(self, layer: int, cache_len: int) -> bool:
        return layer < self.dense_layers or (cache_len <= self.budget and not self._evicted)

    def _scale(self, d: int) -> float:
        return self.engine.scale if self.engine is not None else d**-0.5

    def _grow(self, layers: int, hkv: int, length: int, device: torch.device) -> None:
        S, A = self._S, self._A
        if S is not None and S.shape[0] >= layers and S.shape[2] >= length:
            return
        cap = max(length, 2 * (S.shape[2] if S is not None else 0), 256)
        shape = (max(layers, S.shape[0] if S is not None else 0), hkv, cap)
        self._S, self._A = (
            torch.zeros(shape, device=device),
            torch.zeros(shape, dtype=torch.bool, device=device),
        )
        if S is not None and A is not None:
            self._S[: S.shape[0], :, : S.shape[2]], self._A[: A.shape[0], :, : A.shape[2]] = S, A

    def _state(
        self, layer: int, hkv: int, length: int, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s scores and alive flags `[n_kv_heads, capacity]` (views of the stacked state)."""
        layers = self.engine.cache.n_layers if self.engine is not None else layer + 1
        self._grow(max(layers, layer + 1), hkv, length, device)
        self._layers.add(layer)
        return self._S[layer], self._A[layer]  # type: ignore[index]

    # --- accumulation --------------------------------------------------------------------------
    @torch.inference_mode()
    def on_prefill(self, layer: int, q: torch.Tensor, k_all: torch.Tensor, cache_len: int) -> None:
        hkv, total, d = k_all.shape
        score, alive = self._state(layer, hkv, total, k_all.device)
        for lo in range(0, q.shape[1], PREFILL_TILE):
            tile = q[:, lo : lo + PREFILL_TILE]
            score[:, :total] += attention_mass(tile, k_all, self._scale(d), cache_len + lo)
        alive[:, cache_len:total] = True
        self._count[layer] = total  # nothing is evicted before the prefill ends

    @torch.inference_mode()
    def after_prefill(self, engine: PolicyEngine) -> None:
        self._P_valid = False
        for layer in sorted(self._layers):  # the prompt scored: its first eviction
            self._commit(slice(layer, layer + 1), None, engine.length, 0, self._count[layer], False)
        self._cap_counts()

    def observe(self, layer: int, q: torch.Tensor) -> None:
        """Keep layer `layer`'s restricted queries `[n_heads, r, d]` for `after_commit`, copied into one
        buffer of every layer's (`[n_layers, n_heads, r, d]`) while the forward that made them has them
        at hand, so that scoring every layer at once stacks nothing."""
        n_layers = self.engine.cache.n_layers if self.engine is not None else layer + 1
        buf = self._qbuf
        if buf is None or buf.shape[1:] != q.shape or buf.dtype != q.dtype or buf.shape[0] <= layer:
            buf = self._qbuf = torch.empty(max(n_layers, layer + 1), *q.shape, dtype=q.dtype, device=q.device)
        buf[layer].copy_(q)
        self._q[layer] = buf[layer]
        self._stacked = None  # the stack holds this step's queries only where `observe_layers` wrote them

    def observe_layers(self, queries: torch.Tensor) -> None:
        """Every layer's queries in one copy, kept whole (a view per layer is host work)."""
        buf = self._qbuf
        if buf is None or buf.shape != queries.shape or buf.dtype != queries.dtype:
            buf = self._qbuf = torch.empty_like(queries, memory_format=torch.contiguous_format)
        buf.copy_(queries)
        self._q, self._stacked = {}, buf

    @torch.inference_mode()
    def after_commit(self, engine: PolicyEngine, n_new: int) -> None:
        """Score and evict by `h2o_commit` (`kv_policies.h2o_rule`), the one update: every layer at once
        where they observed the same rows and keep as many entries in the plain layout (at fixed shapes,
        `FixedCommit`, once evicting at every step on an engine with fixed-shape forwards), else layer
        by layer."""
        length, cache = engine.length, engine.cache
        layers, start = cache.n_layers, length - n_new
        self._grow(layers, cache.n_kv_heads, length, cache.device)  # every layer's state, as `_state` has it
        self._layers.update(range(layers))
        before = [self._count.get(layer, 0) for layer in range(layers)]
        for layer in range(layers):
            self._count[layer] = before[layer] + n_new
        stacked, self._stacked, buf = self._stacked, None, self._qbuf
        qs = [self._q.get(layer) for layer in range(layers)]
        self._q = {}
        if stacked is None and all(q is not None and q.shape == qs[0].shape for q in qs):
            # `observe` filled every layer of its buffer (the stack itself), else a stack of its views
            whole = buf is not None and all(q.data_ptr() == buf[li].data_ptr() for li, q in enumerate(qs))
            stacked = buf[:layers] if whole else torch.stack(qs)  # type: ignore[index]
        rows = stacked is not None and stacked.shape[2] > 0
        if stacked is not None and self.slots.region is None and len(set(before)) == 1:
            in_buf = buf is not None and stacked.data_ptr() == buf.data_ptr()
            if rows and in_buf and self._evicted and before[0] == self.budget and self._fixed_shape():
                self._fixed = FixedCommit.commit(self, self._fixed, length, n_new, stacked)
            else:
                self._A[:, :, length:] = False  # type: ignore[index]
                self._commit(slice(0, layers), stacked if rows else None, start, n_new, before[0], True)
            self._cap_counts()
            return
        if stacked is not None:  # a compressed region: layer by layer
            qs = list(stacked[:layers])
        self._A[:, :, length:] = False  # type: ignore[index]
        for layer, q in enumerate(qs):
            q = q[None] if q is not None and q.shape[1] else None
            self._commit(slice(layer, layer + 1), q, start, n_new, before[layer], False)
        self._cap_counts()

    def _commit(
        self, layers: slice, queries: torch.Tensor | None, start: int, n_new: int, count: int, whole: bool
    ) -> None:
        """`h2o_commit` of `layers`, each with `count` entries alive before the commit: while most are
        alive (`whole`: every layer, plain layout) over every committed slot, else the alive ones."""
        cache, length, alive = self.engine.cache, start + n_new, count + n_new
        self._P_valid = False  # `FixedCommit`'s alive positions: found again when it next applies
        S, A = self._S[layers], self._A[layers]  # type: ignore[index]
        new, scale = slice(start, length), self._scale(cache.k.shape[-1])
        evict, keys = self._eviction(alive, length), partial(self._keys.by_position, self.slots, layers.start)
        if queries is not None and whole and length <= 2 * alive and self.slots.in_order():
            visible = None if alive == length else A[..., :length]
            h2o_commit(S, A, new, None, visible, queries, cache.k[layers, :, :length], scale, evict)
            return
        h2o_commit(S, A, new, alive, None, queries, keys, scale, evict)  # the alive positions' keys

    def _eviction(self, alive: int, length: int) -> tuple | None:
        """`h2o_commit`'s eviction with `alive` entries after a commit to `length` (None: in budget)."""
        if alive <= self.budget:
            return None
        self._evicted = True
        return length - self.recent, self.heavy, None

    def _cap_counts(self) -> None:
        self._count = {layer: min(count, self.budget) for layer, count in self._count.items()}

    def _fixed_shape(self) -> bool:
        return self.engine.fixed_shape and self.slots.in_order()

    # --- selection -----------------------------------------------------------------------------
    @torch.inference_mode()
    def select(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, cache_len: int) -> torch.Tensor:
        hkv = k_cache.shape[0]
        if self.keeps_all(layer, cache_len) or layer not in self._layers:
            return torch.ones(hkv, cache_len, dtype=torch.bool, device=k_cache.device)
        _, alive = self._state(layer, hkv, cache_len, k_cache.device)
        return alive[:, :cache_len].clone()

    def layer_selections(self, cache_len: int) -> torch.Tensor:
        """Every layer's alive entries at once (dense layers: all), mapped to physical slots."""
        cache = self.engine.cache
        layers = cache.n_layers
        if self._A is None or len(self._layers) < layers:
            return super().layer_selections(cache_len)
        sel = self._A[:layers, :, :cache_len].clone()
        if self.dense_layers:  # (an empty slice's write is a launch all the same)
            sel[: self.dense_layers] = True
        if not self._evicted and cache_len <= self.budget:
            sel[:] = True
        return self.slots.physical_stack(sel)
