"""H2O's update after a commit, once it evicts at every step: fixed shapes, one graph on a GPU.

Once the cache is over budget, every commit of `n` entries makes H2O score the restricted rows'
queries against its `budget` alive entries plus the `n` new ones and evict `n` of the older ones. The
plain update (`H2O.after_commit`) finds the alive entries by sorting the alive flags up to the cache
length and evicts by a top-k over that length: shapes that change at every step, ~21 operators a GPU's
host launches one by one. Here the alive positions are kept, in increasing order, in a buffer of
`budget` per layer and KV head, the new entries are padded to a power of two `M` (pads masked out of
the softmax, their mass exactly zero) and the top-k runs over those `budget + M` candidates; the cache
length and the entry count reach it as device scalars. So the update has one shape per `M` and runs
as one CUDA graph replay where the engine's forwards are captured (`core.decode_graph.Replay`). The
fixed-shape forwards' eager twin (`capture=False`, a CPU) runs the same operators without the pads,
whose columns would cost their arithmetic there; eager forwards keep the plain update. It chooses
what the plain update chooses (the same candidates in the same order; the softmax rows only carry the
masked pads).
"""

from __future__ import annotations

from typing import Any

import torch

from core.decode_graph import Replay
from kv_policies.attention_mass import attention_mass_layers


class SteadyUpdate:
    """The fixed-shape update of `policy` (an `H2O`) for commits of up to `pad` entries (a power of two).
    It reads the policy's buffers where they are at each call: scores `_S` and alive flags `_A`
    `[layers, n_kv_heads, capacity]`, the alive positions `_P` `[layers, n_kv_heads, budget]`, and the
    observed queries `[layers, n_heads, rows, head_dim]`."""

    def __init__(self, policy: Any, pad: int) -> None:
        self.policy, self.pad = policy, pad
        engine = policy.engine
        dev = engine.cache.k.device
        self.meta = torch.zeros(2, dtype=torch.long, device=dev)  # [cache length before the commit, n]
        self.new_rows = torch.arange(pad, device=dev)
        self.recent_rows = torch.arange(policy.recent, device=dev)
        self.alive_cols = torch.ones(policy.budget, dtype=torch.bool, device=dev)
        self.queries: torch.Tensor | None = None
        self.n_new = 0
        self.engine = engine
        self.capture = captures(engine)
        self.replay = Replay(self.run, self.capture, dev)

    def fits(self, n_new: int) -> bool:
        """Whether this update serves a commit of `n_new` entries now (else the policy makes a new one):
        the same engine, graphs and budget, and room for the entries."""
        pol = self.policy
        return (
            pol.engine is self.engine
            and n_new <= self.pad
            and self.capture == captures(pol.engine)
            and pol.budget == self.alive_cols.numel()
            and pol.recent == self.recent_rows.numel()
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
        key = (
            queries.data_ptr(),
            tuple(queries.shape),
            pol._S.data_ptr(),
            pol._A.data_ptr(),
            pol._P.data_ptr(),
            cache.k.data_ptr(),
            cache.capacity,
        )
        self.replay(key)

    def run(self) -> None:
        pol, cache, queries = self.policy, self.policy.engine.cache, self.queries
        assert queries is not None and pol._S is not None and pol._A is not None and pol._P is not None
        P = pol._P  # [layers, hkv, budget]: the alive positions before this commit, in increasing order
        n_layers, hkv, budget = P.shape
        S, A = pol._S[:n_layers], pol._A[:n_layers]
        start, n = self.meta[0], self.meta[1]
        # run eagerly the host knows the count: no pads, whose columns would cost their arithmetic there
        rows = self.new_rows if self.capture else self.new_rows[: self.n_new]
        real = rows < n  # [pad]
        new = (start + torch.where(real, rows, 0)).expand(n_layers, hkv, -1)  # pads: the first new entry
        cand = torch.cat([P, new], dim=2)  # [layers, hkv, budget + pad], increasing over the real ones
        visible = torch.cat([self.alive_cols, real]).expand(n_layers, hkv, -1)
        S.scatter_(2, new, 0.0)
        scale = pol._scale(cache.k.shape[-1])
        S.scatter_add_(2, cand, attention_mass_layers(queries, pol._keys_at(cand), scale, visible))
        older = start + n - pol.recent  # the recent window starts here
        score = S.gather(2, cand).masked_fill(~(visible & (cand < older)), float("-inf"))
        heavy = cand.gather(2, score.topk(pol.heavy, dim=-1).indices).sort(dim=-1).values
        recent = (older + self.recent_rows).expand(n_layers, hkv, -1)
        P.copy_(torch.cat([heavy, recent], dim=2))
        A.zero_()
        A.scatter_(2, P, True)


def captures(engine: Any) -> bool:
    """Whether `engine`'s fixed-shape forwards are captured as CUDA graphs (so is the update then)."""
    graphs = getattr(engine, "graphs", None)
    return graphs is not None and graphs.capture
