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

from typing import Any

import torch

from core.decode_graph import padded_rows
from core.types import HarnessError
from kv_policies.attention_mass import attention_mass, attention_mass_layers
from kv_policies.base import KVPolicy
from kv_policies.checks import check_backend, check_budget, check_budget_frac, check_dense_layers
from kv_policies.h2o_steady import SteadyUpdate

PREFILL_TILE = 256


class H2O(KVPolicy):
    name = "h2o"
    keeps_alike = True  # `keeps_all`: one answer for every layer past the dense ones
    query_free = True  # chosen from the prefill and earlier steps, never from the forward it restricts

    def __init__(
        self,
        budget: int = 760,
        recent: int | None = None,
        backend: str = "dense",
        budget_frac: float | None = None,
        dense_layers: int = 0,
    ) -> None:
        self.dense_layers = check_dense_layers(self.name, dense_layers)
        self._recent_cfg = recent  # None: half of the budget, whatever the budget becomes
        recent = budget // 2 if recent is None and isinstance(budget, int) else recent
        if not isinstance(recent, int) or recent < 0:
            raise HarnessError(f"kv=h2o: recent must be a non-negative integer, got {recent!r}")
        self.set_budget(check_budget(self.name, budget, recent, "the recent window"))
        self.budget_frac = check_budget_frac(self.name, budget_frac)
        self.backend = check_backend(self.name, backend)
        self._score: dict[int, torch.Tensor] = {}
        self._alive: dict[int, torch.Tensor] = {}
        self._q: dict[int, torch.Tensor] = {}
        self._qbuf: torch.Tensor | None = None
        self._stacked: torch.Tensor | None = None
        self._starts: tuple | None = None
        self._evicted = False
        self._S = self._A = self._P = None
        self._P_valid = False
        self._steady: SteadyUpdate | None = None

    def min_budget(self) -> int:
        return 2 if self._recent_cfg is None else self._recent_cfg + 1

    def set_budget(self, budget: int) -> None:
        self.budget = budget
        self.recent = budget // 2 if self._recent_cfg is None else self._recent_cfg
        self.heavy = budget - self.recent

    def params(self) -> dict:
        return {
            "budget": self.budget,
            "budget_frac": self.budget_frac,
            "recent": self.recent,
            "heavy": self.heavy,
            "backend": self.backend,
            "dense_layers": self.dense_layers,
        }

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
        self._starts: tuple | None = None  # `_row_starts`
        self._count: dict[int, int] = {}  # alive entries per KV head (every head keeps as many), on the host
        self._evicted = False

    def keeps_all(self, layer: int, cache_len: int) -> bool:
        return layer < self.dense_layers or (cache_len <= self.budget and not self._evicted)

    def _scale(self, d: int) -> float:
        return self.engine.scale if self.engine is not None else d**-0.5

    def _grow(self, layers: int, hkv: int, length: int, device: Any) -> None:
        S, A = self._S, self._A
        if S is not None and S.shape[0] >= layers and S.shape[2] >= length:
            return
        cap = max(length, 2 * (S.shape[2] if S is not None else 0), 256)
        layers = max(layers, S.shape[0] if S is not None else 0)
        new_s = torch.zeros(layers, hkv, cap, device=device)
        new_a = torch.zeros(layers, hkv, cap, dtype=torch.bool, device=device)
        if S is not None and A is not None:
            new_s[: S.shape[0], :, : S.shape[2]] = S
            new_a[: A.shape[0], :, : A.shape[2]] = A
        self._S, self._A = new_s, new_a

    def _state(self, layer: int, hkv: int, length: int, device: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s scores and alive flags `[n_kv_heads, capacity]` (views of the stacked state)."""
        layers = self.engine.cache.n_layers if self.engine is not None else layer + 1
        self._grow(max(layers, layer + 1), hkv, length, device)
        self._layers.add(layer)
        assert self._S is not None and self._A is not None
        return self._S[layer], self._A[layer]

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
    def after_prefill(self, engine: Any) -> None:
        self._P_valid = False
        for layer in sorted(self._layers):
            self._evict(layer, engine.length)

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
        """Every layer's queries in one copy (`observe`'s buffer, whole), kept whole: the steady update
        reads the stack, and only the plain one takes it apart per layer (a view per layer is host work
        a fixed-shape step would pay on its critical path)."""
        buf = self._qbuf
        if buf is None or buf.shape != queries.shape or buf.dtype != queries.dtype:
            buf = self._qbuf = torch.empty_like(queries, memory_format=torch.contiguous_format)
        buf.copy_(queries)
        self._q, self._stacked = {}, buf

    @torch.inference_mode()
    def after_commit(self, engine: Any, n_new: int) -> None:
        length, cache = engine.length, engine.cache
        layers = cache.n_layers
        self._grow(layers, cache.n_kv_heads, length, cache.device)  # every layer's state, as `_state` has it
        self._layers.update(range(layers))
        count = self._count
        for layer in range(layers):
            count[layer] = count.get(layer, 0) + n_new
        counts = {count[layer] for layer in range(layers)}
        stacked, self._stacked = self._stacked, None
        # `observe`'s views collected into the stack: only the steady update (fixed-shape forwards) reads it
        if stacked is None and getattr(self.engine, "graphs", None) is not None:
            stacked = self._observed_stack(layers)
        if stacked is not None and self._steady_applies(stacked, layers, counts, n_new):
            self._update_steady(length, n_new, layers)
            return
        if stacked is not None:
            qs: list = list(stacked[:layers])
        else:
            qs = [self._q.pop(layer, None) for layer in range(layers)]
        self._P_valid = False
        S, A = self._S[:layers], self._A[:layers]  # type: ignore[index]
        A[:, :, length:] = False
        A[:, :, length - n_new : length] = True
        S[:, :, length - n_new : length] = 0.0
        if self._batched(qs, counts):
            self._score_all(S, A, qs, length, counts.pop())
        else:
            for layer, q in enumerate(qs):
                if q is not None and q.shape[1]:
                    self._score_layer(layer, q, length)
        if len(counts) <= 1 and self.slots.region is None:
            self._evict_all(layers, length)
        else:
            for layer in range(layers):
                self._evict(layer, length)

    def _observed_stack(self, layers: int) -> torch.Tensor | None:
        """`observe`'s buffer when `observe` filled every layer of it since the last commit (their views
        taken off `_q`), else None."""
        buf, qs = self._qbuf, self._q
        if buf is None or buf.shape[0] < layers or len(qs) < layers:
            return None
        if any(layer not in qs or qs[layer].data_ptr() != buf[layer].data_ptr() for layer in range(layers)):
            return None
        for layer in range(layers):
            del qs[layer]
        return buf

    def _steady_applies(self, stacked: torch.Tensor, layers: int, counts: set[int], n_new: int) -> bool:
        """Whether the commit takes the fixed-shape update (`kv_policies.h2o_steady`): on an engine with
        fixed-shape forwards (where it replays as a graph; run eagerly it is more operators than the
        plain update), evicting at every step already, every layer holding `budget` entries before it
        and observing the same rows (`stacked`: every layer's queries, as `observe_layers` keeps them),
        in the plain layout."""
        return (
            getattr(self.engine, "graphs", None) is not None
            and self._evicted
            and n_new >= 1
            and counts == {self.budget + n_new}
            and self.slots.region is None
            and stacked.shape[0] >= layers
            and stacked.shape[2] > 0
            and self.slots.in_order()
        )

    def _update_steady(self, length: int, n_new: int, layers: int) -> None:
        cache = self.engine.cache
        shape = (layers, cache.n_kv_heads, self.budget)
        if self._P is None or tuple(self._P.shape) != shape:
            self._P = torch.zeros(shape, dtype=torch.long, device=cache.device)
            self._P_valid = False
        if not self._P_valid:  # the alive positions, found once when the steady state begins
            self._P.copy_(self._positions(self._A[:layers], length - n_new, self.budget))  # type: ignore[index]
            self._P_valid = True
        steady = self._steady
        if steady is None or not steady.fits(n_new):
            steady = self._steady = SteadyUpdate(self, max(padded_rows(n_new), steady.pad if steady else 1))
        steady(length, n_new, self._qbuf[:layers])  # type: ignore[index]
        for layer in range(layers):
            self._count[layer] = self.budget

    def _batched(self, qs: list, counts: set[int]) -> bool:
        """Every layer observed the same rows and keeps as many entries, in the plain layout."""
        first = qs[0]
        return (
            self.slots.region is None
            and len(counts) == 1
            and first is not None
            and first.shape[1] > 0
            and all(q is not None and q.shape == first.shape for q in qs)
        )

    def _score_all(self, S: torch.Tensor, A: torch.Tensor, qs: list, length: int, count: int) -> None:
        """Every layer's observed attention mass added to its alive entries, in one batch of operators.
        While most committed entries are alive the queries read every committed slot, the dead ones
        masked out of the softmax (the same mass, without finding and gathering the alive entries);
        once evictions leave a minority alive, only the alive entries' keys are gathered."""
        cache = self.engine.cache
        d, n_layers = cache.k.shape[-1], S.shape[0]
        buf = self._qbuf
        stacked = buf is not None and all(q.data_ptr() == buf[li].data_ptr() for li, q in enumerate(qs))
        queries = buf[:n_layers] if stacked else torch.stack(qs)  # type: ignore[index]
        if length <= 2 * count and self.slots.in_order():
            # the plain layout: slot s holds position s; nothing evicted yet: every entry alive, no mask
            alive = None if count == length else A[..., :length]
            S[..., :length] += attention_mass_layers(
                queries, cache.k[:n_layers, :, :length], self._scale(d), alive
            )
            return
        pos = self._positions(A, length, count)  # [layers, hkv, m]
        slots = self.slots.physical(0, pos, cache.n_kv_heads)  # in-order slots: the positions themselves
        S.scatter_add_(2, pos, attention_mass_layers(queries, self._keys_at(slots), self._scale(d)))

    def _keys_at(self, slots: torch.Tensor) -> torch.Tensor:
        """The cached keys `[n_layers, n_kv_heads, m, head_dim]` at `slots` `[n_layers, n_kv_heads, m]`:
        whole key rows by one index_select over the flattened cache (a gather over an index expanded
        along head_dim addresses each element)."""
        cache = self.engine.cache
        d = cache.k.shape[-1]
        flat = (slots + self._row_starts(slots.shape[0])).view(-1)
        return cache.k.view(-1, d).index_select(0, flat).view(*slots.shape, d)

    def _row_starts(self, n_layers: int) -> torch.Tensor:
        """long `[n_layers, n_kv_heads, 1]`: where each layer's and KV head's slots start in the cache
        flattened to key rows (made once per generation and allocation)."""
        cache = self.engine.cache
        key = (n_layers, cache.n_kv_heads, cache.capacity, cache.k.device)
        if self._starts is None or self._starts[0] != key:
            rows = torch.arange(n_layers * cache.n_kv_heads, device=cache.k.device) * cache.capacity
            self._starts = (key, rows.view(n_layers, -1, 1))
        return self._starts[1]

    def _score_layer(self, layer: int, q: torch.Tensor, length: int) -> None:
        cache = self.engine.cache
        score, alive = self._state(layer, cache.n_kv_heads, length, cache.device)
        pos = self._positions(alive, length, self._count[layer])
        k = self.slots.gather_keys(layer, cache.k[layer, :, :length], pos)
        score.scatter_add_(1, pos, attention_mass(q, k, self._scale(k.shape[-1]), None))

    @staticmethod
    def _positions(alive: torch.Tensor, length: int, count: int) -> torch.Tensor:
        """long `[..., n_kv_heads, count]`: the alive logical positions in increasing order (every KV head
        keeps `count`), found by a stable sort rather than `nonzero`, whose size the host would wait for."""
        order = torch.sort(alive[..., :length].to(torch.uint8), dim=-1, descending=True, stable=True)
        return order.indices[..., :count]

    def _evict(self, layer: int, length: int) -> None:
        if self._count.get(layer, 0) <= self.budget:
            return
        self._evicted = True
        score, alive = self._S[layer], self._A[layer]  # type: ignore[index]
        _keep_heavy(score, alive, length - self.recent, self.heavy)
        self._count[layer] = self.heavy + self.recent

    def _evict_all(self, layers: int, length: int) -> None:
        if self._count.get(0, 0) <= self.budget:
            return
        self._evicted = True
        _keep_heavy(self._S[:layers], self._A[:layers], length - self.recent, self.heavy)  # type: ignore[index]
        for layer in range(layers):
            self._count[layer] = self.heavy + self.recent

    # --- selection -----------------------------------------------------------------------------
    @torch.inference_mode()
    def select(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, cache_len: int) -> torch.Tensor:
        hkv = k_cache.shape[0]
        if self.keeps_all(layer, cache_len) or layer not in self._layers:
            return torch.ones(hkv, cache_len, dtype=torch.bool, device=k_cache.device)
        _, alive = self._state(layer, hkv, cache_len, k_cache.device)
        return alive[:, :cache_len].clone()

    def layer_selections(self, cache_len: int) -> torch.Tensor | None:
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


def _keep_heavy(score: torch.Tensor, alive: torch.Tensor, older: int, heavy: int) -> None:
    """Among the entries before `older` keep the `heavy` alive ones with the largest scores (last dim)."""
    cand = score[..., :older].masked_fill(~alive[..., :older], float("-inf"))
    keep = cand.topk(heavy, dim=-1).indices
    alive[..., :older] = False
    alive[..., :older].scatter_(-1, keep, True)
