"""H2O's update at fixed shapes once it evicts at every step (`FixedCommit`, `kv_policies/h2o_rule.py`),
on an engine with fixed-shape forwards: the same selections, scores and tokens as the eager commit
(which eager forwards keep; both run the one rule `h2o_commit`), one launch per step with graphs on,
and buffers kept across generations so that a captured update is replayed, not captured again."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from core.engine import Engine
from core.types import Counts
from decoders.fafo.decoder import FAFO
from decoders.vanilla import Vanilla
from kv_policies.h2o import H2O
from runners.host_syncs import HostSyncs, graph_bodies_apart


class PlainH2O(H2O):
    """H2O with the steady update turned off: every commit takes the plain update."""

    def _fixed_shape(self):
        return False


class CountedH2O(H2O):
    steady_calls = 0

    def _fixed_shape(self):  # asked only where the fixed-shape commit would otherwise apply
        taken = super()._fixed_shape()
        self.steady_calls += taken
        return taken


def _engine(tiny_lm, fixed_shape: bool) -> Engine:
    eng = Engine(tiny_lm.model)
    if fixed_shape:
        eng.use_graphs(capture=False)  # the fixed-shape forwards, eager: the CPU twin of the graphs
    return eng


DECODERS = {
    "vanilla": lambda eng, pol: Vanilla(eng, pol),
    "fafo": lambda eng, pol: FAFO(eng, pol, k=2, n=4),  # multi-row restricted blocks, 1..3 commits a step
}
PROMPT = [5, 6, 7, 5, 6, 7, 5, 6] * 3 + list(range(20, 60))


@pytest.mark.parametrize("fixed_shape", [False, True], ids=["eager", "fixed-shape"])
@pytest.mark.parametrize("decoder", sorted(DECODERS))
def test_steady_update_equals_the_plain_one(tiny_lm, decoder, fixed_shape):
    results = []
    for cls in (CountedH2O, PlainH2O):
        eng = _engine(tiny_lm, fixed_shape)
        pol = cls(budget=16, recent=4)
        counts = Counts()
        out = DECODERS[decoder](eng, pol).generate(PROMPT, 40, set(), counts)
        results.append((out, counts.forwards, pol._A[:, :, : eng.length].clone(), pol._S[:, :, : eng.length]))
        if cls is CountedH2O and fixed_shape:  # the steady state began and served most steps
            assert pol.steady_calls >= counts.forwards // 2, (pol.steady_calls, counts.forwards)
        elif cls is CountedH2O:  # eager forwards: the plain update, fewer operators where none is captured
            assert pol.steady_calls == 0
    (out, fwd, alive, score), (plain_out, plain_fwd, plain_alive, plain_score) = results
    assert out == plain_out and fwd == plain_fwd
    assert torch.equal(alive, plain_alive) and not alive.all()
    assert (alive.sum(-1) == 16).all()  # every layer and KV head keeps its budget
    torch.testing.assert_close(score, plain_score, atol=1e-5, rtol=1e-5)


def _launches_per_step(eng: Engine, pol: H2O) -> float:
    probe = HostSyncs(eng.device)
    counts = Counts(on_prefill_done=probe.mark, keep_steps=False, on_decode_done=probe.stop)
    with probe, graph_bodies_apart(probe):
        FAFO(eng, pol, k=2, n=4).generate(PROMPT, 40, set(), counts)
    return probe.launches_since_mark / counts.forwards


def test_steady_update_is_one_launch_with_graphs_on(tiny_lm):
    """What a FAFO+H2O step launches with graphs on (counted on the eager twin): the steady update is one
    replay and two staged scalars where the plain update launches each of its operators."""
    steady = _launches_per_step(_engine(tiny_lm, True), H2O(budget=16, recent=4))
    plain = _launches_per_step(_engine(tiny_lm, True), PlainH2O(budget=16, recent=4))
    assert steady <= plain - 10, (steady, plain)


def test_buffers_and_update_are_kept_across_generations(tiny_lm):
    """A second generation zeroes the scores and flags in place and reuses the update: a captured graph
    would be replayed on the same addresses, not captured again inside a timed decode."""
    eng = _engine(tiny_lm, True)
    pol = H2O(budget=16, recent=4)
    dec = FAFO(eng, pol, k=2, n=4)
    first = dec.generate(PROMPT, 40, set(), Counts())
    kept = (pol._S.data_ptr(), pol._A.data_ptr(), pol._P.data_ptr(), pol._fixed)
    assert dec.generate(PROMPT, 40, set(), Counts()) == first
    assert (pol._S.data_ptr(), pol._A.data_ptr(), pol._P.data_ptr(), pol._fixed) == kept
    assert pol._fixed.replay.captures == 0  # eager here: nothing was captured


class SelectCounter(TorchDispatchMode):
    """Counts `t[i]` views (`aten.select`): the per-layer views a host makes one by one."""

    selects = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.select.int:
            self.selects += 1
        return func(*args, **(kwargs or {}))


class WatchedH2O(H2O):
    """H2O whose commits taking the steady update count the `aten.select`s made outside the update."""

    counter: SelectCounter | None = None
    inside = at = 0

    def _fixed_shape(self):
        taken = super()._fixed_shape()
        if taken:  # the selects from here on are the fixed-shape update's
            assert self.counter is not None
            self.at = self.counter.selects
        return taken

    def _cap_counts(self):
        if self.at >= 0 and self.counter is not None:
            self.inside = self.counter.selects - self.at
        super()._cap_counts()

    def after_commit(self, engine, n_new):
        self.inside = self.at = -1
        with SelectCounter() as self.counter:
            super().after_commit(engine, n_new)
        if self.inside >= 0:  # the steady update ran
            self.outside.append(self.counter.selects - self.inside)


def test_a_steady_commit_makes_no_view_per_layer(tiny_lm):
    """A steady commit reads the observed queries as the stack `observe_layers` wrote and every layer's
    state at once: around the update it makes no view per layer (each an operator call a GPU's host
    would make on the step's critical path)."""
    eng = _engine(tiny_lm, True)
    pol = WatchedH2O(budget=16, recent=4)
    pol.outside = []
    FAFO(eng, pol, k=2, n=4).generate(PROMPT, 40, set(), Counts())
    assert eng.cache.n_layers >= 2 and len(pol.outside) > 10
    assert set(pol.outside) == {0}, pol.outside
