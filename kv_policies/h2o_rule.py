"""H2O's update after a commit ("H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large
Language Models", arXiv 2306.14048): ONE rule over fixed-capacity device tensors, which every commit
runs, eagerly or replayed as a CUDA graph.

`h2o_commit` marks the committed entries alive with a zero score, adds the attention mass the observed
queries pay the candidates (the entries alive before the commit plus the new ones), and, over budget,
keeps the `heavy` older candidates with the largest scores plus the recent window. Its callers differ
only in how they lay out the candidates and the eviction:

- eager commits (the host knows the length): the new entries marked by slices; scored over every
  position below the length, the dead ones masked out of the softmax, while most are alive
  (`cand=None`), and once evictions leave a minority alive over the alive positions only (found by
  sorting the alive flags, `cand=count`); evicted over every position before the window (`older` an
  int): the window stays alive as it is, the flags before it are rewritten from the kept ones. No
  position list is built, sorted or kept (the fewest operators: each is a launch on a GPU);
- `FixedCommit` (an engine with fixed-shape forwards, once H2O evicts at every step): the alive
  positions kept in a buffer of `budget` per layer and KV head, then the new entries padded to a power
  of two (pads masked, their mass exactly zero), with the length and the count as device scalars
  (`older` one too): one shape per pad, so one graph replay where the forwards are captured
  (`Engine.replayable`); the alive flags are rebuilt from the kept positions, which it keeps.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from kv_policies.attention_mass import attention_mass_layers

if TYPE_CHECKING:
    from core.kv_cache import KVCache
    from kv_policies.h2o import H2O
    from kv_policies.layout import SlotMap


def h2o_commit(
    S: torch.Tensor,
    A: torch.Tensor,
    new: slice | torch.Tensor,
    cand: torch.Tensor | int | None,
    visible: torch.Tensor | None,
    queries: torch.Tensor | None,
    keys: torch.Tensor | Callable[[torch.Tensor], torch.Tensor] | None,
    scale: float,
    evict: tuple[Any, int, torch.Tensor | None] | None,
) -> torch.Tensor | None:
    """Score and evict for one commit, in place on `S` (scores) and `A` (alive flags), both
    `[layers, n_kv_heads, capacity]`.

    new: the committed positions, `slice(start, length)` or long `[layers, n_kv_heads, n]` (pads repeat
      a real one).
    cand: the positions scored: None, positions `0..m-1` (slot == position, `m = keys.shape[2]`); an int
      `count`, the `count` alive positions once the new ones are marked (`new` a slice); or long
      `[layers, n_kv_heads, m]`, increasing over the visible ones.
    visible: bool `[layers, n_kv_heads, m]` the candidates the queries see (None: all; a view of `A` is
      read after the new entries are marked).
    queries `[layers, n_heads, r, head_dim]`, or None: nothing observed, no score added. keys `[layers,
      n_kv_heads, m, head_dim]`: the keys at the candidates, or (`cand` a count) a function of their
      positions that gathers them.
    evict: None (within budget), or (older, heavy, window): keep the `heavy` alive candidates before
      `older` with the largest scores and the window from `older` on. `older` an int: over every position
      before it (the window is alive already; `window` unused); a device scalar: over the candidates,
      the alive flags rebuilt from the kept ones and the window's positions `older + window` (`[recent]`).
    Returns the alive positions after an eviction over the candidates, increasing, `[layers, n_kv_heads,
    heavy + recent]`; else None.
    """
    over_cand = evict is not None and not isinstance(evict[0], int)  # then the alive flags are rebuilt
    if isinstance(new, slice):
        S[..., new].fill_(0.0)
        A[..., new].fill_(True)
    else:
        S.scatter_(2, new, 0.0)
        if not over_cand:
            A.scatter_(2, new, True)
    if queries is not None:
        if isinstance(cand, int):  # the alive positions, the new ones among them
            assert isinstance(new, slice) and callable(keys), "a count of alive candidates reads the length"
            cand = alive_positions(A, new.stop, cand)
            keys = keys(cand)
        mass = attention_mass_layers(queries, keys, scale, visible)  # type: ignore[arg-type]
        if cand is None:
            S[..., : mass.shape[2]] += mass
        else:
            S.scatter_add_(2, cand, mass)  # type: ignore[arg-type]
    if evict is None:
        return None
    older, heavy, window = evict
    if not over_cand:  # every position before `older`: position == index
        score, ok = S[..., :older], A[..., :older]
    else:
        assert isinstance(cand, torch.Tensor) and window is not None, "a device `older` evicts the candidates"
        score, ok = S.gather(2, cand), cand < older if visible is None else visible & (cand < older)
    top = score.masked_fill(~ok, float("-inf")).topk(heavy, dim=-1).indices
    if not over_cand:
        A[..., :older].fill_(False)
        A[..., :older].scatter_(2, top, True)
        return None
    keep = cand.gather(2, top).sort(dim=-1).values
    alive = torch.cat([keep, (older + window).expand(*keep.shape[:2], -1)], dim=2)
    A.zero_()
    A.scatter_(2, alive, True)
    return alive


def alive_positions(alive: torch.Tensor, length: int, count: int) -> torch.Tensor:
    """long `[..., n_kv_heads, count]`: the alive logical positions in increasing order (every KV head
    keeps `count`), found by a stable sort rather than `nonzero`, whose size the host would wait for."""
    order = torch.sort(alive[..., :length].to(torch.uint8), dim=-1, descending=True, stable=True)
    return order.indices[..., :count]


class FixedCommit:
    """`h2o_commit` at fixed shapes for commits of up to `pad` entries (a power of two), once `policy`
    (an `H2O`) evicts at every step. It reads the policy's buffers where they are at each call: scores
    `_S` and alive flags `_A` `[layers, n_kv_heads, capacity]`, the alive positions `_P`
    `[layers, n_kv_heads, budget]` (kept here), and the observed queries `[layers, n_heads, r, d]`.
    Run eagerly (the fixed-shape forwards' CPU twin) it drops the pads, whose columns cost their
    arithmetic there."""

    def __init__(self, policy: H2O, pad: int) -> None:
        self.policy, self.pad = policy, pad
        engine = policy.engine
        dev = engine.cache.k.device
        self.meta = torch.zeros(2, dtype=torch.long, device=dev)  # [cache length before the commit, n]
        self.new_rows = torch.arange(pad, device=dev)
        self.window = torch.arange(policy.recent, device=dev)
        self.alive_cols = torch.ones(policy.budget, dtype=torch.bool, device=dev)
        self.queries: torch.Tensor | None = None
        self.n_new = 0
        self.engine = engine
        self.replay = engine.replayable(self.run)

    @staticmethod
    def commit(
        policy: H2O, fixed: FixedCommit | None, length: int, n_new: int, queries: torch.Tensor
    ) -> FixedCommit:
        """Run `policy`'s commit at fixed shapes with `fixed` (or a new update where it does not fit);
        returns the update used."""
        cache = policy.engine.cache
        shape = (cache.n_layers, cache.n_kv_heads, policy.budget)
        if policy._P is None or tuple(policy._P.shape) != shape:
            policy._P = torch.zeros(shape, dtype=torch.long, device=cache.device)
            policy._P_valid = False
        if not policy._P_valid:  # the alive positions, found once when the steady state begins
            policy._P.copy_(alive_positions(policy._A[: shape[0]], length - n_new, policy.budget))
            policy._P_valid = True
        if fixed is None or not fixed.fits(n_new):
            fixed = FixedCommit(policy, max(policy.engine.rows_run(n_new), fixed.pad if fixed else 1))
        fixed(length, n_new, queries)
        return fixed

    def fits(self, n_new: int) -> bool:
        """Whether this update serves a commit of `n_new` entries now (else the policy makes a new one):
        the same engine, graphs and budget, and room for the entries."""
        pol = self.policy
        return (
            pol.engine is self.engine
            and n_new <= self.pad
            and self.replay.capture == pol.engine.captured
            and pol.budget == self.alive_cols.numel()
            and pol.recent == self.window.numel()
        )

    def __call__(self, length: int, n_new: int, queries: torch.Tensor) -> None:
        """Score and evict for a commit that took the cache from `length - n_new` to `length` entries."""
        pol, cache = self.policy, self.policy.engine.cache
        self.queries = queries
        # what a warm-up before a capture updates in place (reallocated buffers: a new key, a new capture)
        self.replay.state = (pol._S, pol._A, pol._P)
        self.meta[0].fill_(length - n_new)
        self.meta[1].fill_(n_new)
        self.n_new = n_new
        ptrs = (queries, pol._S, pol._A, pol._P, cache.k)
        self.replay((*(t.data_ptr() for t in ptrs), tuple(queries.shape), cache.capacity))

    def run(self) -> None:
        pol = self.policy
        P = pol._P  # [layers, hkv, budget]: the alive positions before this commit, in increasing order
        n_layers, hkv, _ = P.shape
        start, n = self.meta[0], self.meta[1]
        rows = self.new_rows if self.replay.capture else self.new_rows[: self.n_new]
        real = rows < n  # [pad]
        new = (start + torch.where(real, rows, 0)).expand(n_layers, hkv, -1)  # pads: the first new entry
        cand = torch.cat([P, new], dim=2)  # [layers, hkv, budget + pad], increasing over the real ones
        visible = torch.cat([self.alive_cols, real]).expand(n_layers, hkv, -1)
        keys = pol._keys.at(pol.engine.cache, cand)
        evict = (start + n - pol.recent, pol.heavy, self.window)
        alive = h2o_commit(pol._S[:n_layers], pol._A[:n_layers], new, cand, visible, self.queries, keys,
                           pol._scale(keys.shape[-1]), evict)  # fmt: skip
        P.copy_(alive)


class KeyRows:
    """Cached keys at given slots, whole key rows by one index_select over the cache flattened to rows
    (a gather over an index expanded along head_dim addresses each element)."""

    def __init__(self) -> None:
        self.key: tuple | None = None
        self.starts = torch.empty(0, dtype=torch.long)

    def at(self, cache: KVCache, slots: torch.Tensor, first_layer: int = 0) -> torch.Tensor:
        """Keys `[n_layers, n_kv_heads, m, head_dim]` at `slots` `[n_layers, n_kv_heads, m]` of layers
        `first_layer...`."""
        d = cache.k.shape[-1]
        key = (cache.n_layers, cache.n_kv_heads, cache.capacity, cache.k.device)
        if self.key != key:  # where each layer's and KV head's slots start (once per allocation)
            rows = torch.arange(cache.n_layers * cache.n_kv_heads, device=cache.k.device) * cache.capacity
            self.key, self.starts = key, rows.view(cache.n_layers, -1, 1)
        flat = (slots + self.starts[first_layer : first_layer + slots.shape[0]]).view(-1)
        return cache.k.view(-1, d).index_select(0, flat).view(*slots.shape, d)

    def by_position(self, slots: SlotMap, first_layer: int, positions: torch.Tensor) -> torch.Tensor:
        """The keys at logical `positions` `[n_layers, n_kv_heads, m]` of layers `first_layer...`, found
        by `slots` (a `kv_policies.layout.SlotMap`): one map for every layer (in order: the positions
        themselves), or a compressed region's own per layer."""
        hkv = positions.shape[1]
        if slots.region is None:
            return self.at(slots.engine.cache, slots.physical(first_layer, positions, hkv), first_layer)
        each = [slots.physical(first_layer + i, p, hkv) for i, p in enumerate(positions)]
        return self.at(slots.engine.cache, torch.stack(each), first_layer)
