"""H2O's and SFI's eager path and their fixed-shape path (the forwards CUDA graphs capture, run eagerly
here: `use_graphs(capture=False)`) choose the same entries step after step and so the same tokens, on
prompts no other test uses (#96: one rule per policy, `h2o_commit` and `gather_evidence`, whatever
the path; a layout of its inputs that differs between the paths shows up here)."""

from __future__ import annotations

import pytest
import torch

from core.engine import Engine
from core.types import Counts
from decoders.fafo.decoder import FAFO
from decoders.selfspec import SelfSpeculative
from decoders.sfi import SlowFast
from decoders.vanilla import Vanilla
from kv_policies.h2o import H2O
from kv_policies.h2o_rule import FixedCommit
from kv_policies.sfi import SFI


def _prompts() -> list[list[int]]:
    gen = torch.Generator().manual_seed(4242)
    return [torch.randint(3, 250, (n,), generator=gen).tolist() for n in (53,)]


class TracedH2O(H2O):
    """H2O that keeps its alive flags and scores after every commit, and counts the fixed-shape commits
    (on tiny random models the prefill's mass decides what is kept: the scores show a divergence)."""

    def reset(self, prompt_len, context_len=None):
        super().reset(prompt_len, context_len)
        self.trace, self.fixed_commits = [], 0

    def after_commit(self, engine, n_new):
        self._ran = False  # set by `FixedCommit` (`_count_fixed`)
        super().after_commit(engine, n_new)
        self.fixed_commits += self._ran
        n = engine.length
        self.trace.append((self._A[:, :, :n].clone(), self._S[:, :, :n].clone()))


@pytest.fixture(autouse=True)
def _count_fixed(monkeypatch):
    """Marks the policy whose `FixedCommit` ran (`_ran`)."""
    real = FixedCommit.__call__

    def call(self, length, n_new, queries):
        self.policy._ran = True
        return real(self, length, n_new, queries)

    monkeypatch.setattr(FixedCommit, "__call__", call)


H2O_DECODERS = {
    "vanilla": lambda eng, kv: Vanilla(eng, kv),
    "fafo": lambda eng, kv: FAFO(eng, kv, k=2, n=4),
    "selfspec": lambda eng, kv: SelfSpeculative(eng, kv, gamma=3),
}


def _generate(tiny_lm, fixed_shape: bool, make, prompt: list[int], n_new: int = 32):
    eng = Engine(tiny_lm.model)
    if fixed_shape:
        eng.use_graphs(capture=False)
    out, kv = make(eng)
    return out(prompt, n_new), kv


@pytest.mark.parametrize("decoder", sorted(H2O_DECODERS))
def test_h2o_eager_and_fixed_shape_commits_keep_the_same_entries(tiny_lm, decoder):
    for prompt in _prompts():
        runs = []
        for fixed_shape in (False, True):

            def make(eng):
                kv = TracedH2O(budget=14, recent=5)
                dec = H2O_DECODERS[decoder](eng, kv)
                return (lambda p, n: dec.generate(p, n, set(), Counts())), kv

            runs.append(_generate(tiny_lm, fixed_shape, make, prompt))
        (eager_ids, eager), (fixed_ids, fixed) = runs
        assert eager.fixed_commits == 0 and fixed.fixed_commits >= len(fixed.trace) // 2, (
            eager.fixed_commits,
            fixed.fixed_commits,
            len(fixed.trace),
        )
        assert eager_ids == fixed_ids
        assert len(eager.trace) == len(fixed.trace)
        for step, ((a, s), (b, t)) in enumerate(zip(eager.trace, fixed.trace, strict=True)):
            assert torch.equal(a, b), f"{decoder}: the alive entries differ after commit {step}"
            # the same sums in another order (every slot masked vs the alive ones gathered)
            torch.testing.assert_close(s, t, atol=1e-5, rtol=1e-5, msg=f"{decoder}: scores, commit {step}")


class TracedSFI(SFI):
    """SFI that keeps every Selector pass's choice and the layer runs its evidence was gathered in."""

    def reset(self, prompt_len, context_len=None):
        super().reset(prompt_len, context_len)
        self.trace, self.runs = [], []

    def gather_evidence(self, first, q, length, logits=None):
        self.runs.append(q.shape[0])
        super().gather_evidence(first, q, length, logits)

    def _select_pending(self):
        super()._select_pending()
        self.trace.append({layer: sel.clone() for layer, sel in self._sel.items()})


@pytest.mark.parametrize("backend", ["dense", "sliced"])
def test_sfi_eager_and_fixed_shape_slow_steps_choose_the_same_sets(tiny_lm, backend):
    for prompt in _prompts():
        runs = []
        for fixed_shape in (False, True):

            def make(eng):
                kv = TracedSFI(k=5, sinks=2, recent=4, window=3, backend=backend)
                dec = SlowFast(eng, kv=kv, t_max=3, trigger_token_ids=frozenset({7, 77}))
                return (lambda p, n: dec.generate(p, n, set(), Counts())), kv

            runs.append(_generate(tiny_lm, fixed_shape, make, prompt))
        (eager_ids, eager), (fixed_ids, fixed) = runs
        n_layers = tiny_lm.model.config.num_hidden_layers
        assert set(eager.runs) == {1}  # eager forwards: a layer at a time
        if backend == "dense":  # the fixed-shape forward shows every layer's queries at once
            assert n_layers in fixed.runs, fixed.runs
        assert eager_ids == fixed_ids
        assert len(eager.trace) == len(fixed.trace) > 3
        for step, (a, b) in enumerate(zip(eager.trace, fixed.trace, strict=True)):
            assert a.keys() == b.keys()
            for layer in a:
                assert torch.equal(a[layer], b[layer]), f"pass {step}, layer {layer}"
