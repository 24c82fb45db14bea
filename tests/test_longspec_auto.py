"""LongSpec `block=auto` (decoders/longspec/auto.py): the block chooser against brute force over every
subtree, the calibration's prior and updates, early stopping, losslessness (greedy against vanilla on
tiny models, sampling in distribution), and the draft seconds measured when the curve is handed over."""

from __future__ import annotations

import itertools
import random

import pytest

from core.engine import Engine
from core.sampling import Sampler
from core.types import Counts, HarnessError
from decoders.longspec.auto import DraftCalibration, best_block, deeper_pays, node_probability, survivals
from decoders.longspec.decoder import LongSpec, Tree
from decoders.vanilla import Vanilla
from tests.helpers import TREES, TargetDraft, flat, steep, varied_prompts
from tests.lossless_check import check_lossless, chi_square_pvalue, sample_generations, tiny_sampling_case

pytestmark = pytest.mark.usefixtures("one_thread")


def random_tree(rng: random.Random, n: int) -> tuple[list[float], list[int]]:
    """Cumulative log-prob scores and parents of a random tree of n rows (parents first)."""
    parent, score = [-1], [0.0]
    for row in range(1, n):
        p = rng.randrange(row)
        parent.append(p)
        score.append(score[p] + rng.uniform(-3.0, 0.0))
    return score, parent


def test_best_block_is_the_best_subtree():
    """Over every subset of rows closed under parents, none has a higher tokens-per-second ratio than
    `best_block`'s; its rows are such a subset."""
    rng = random.Random(0)
    calib = DraftCalibration()
    for _ in range(40):
        score, parent = random_tree(rng, rng.randint(1, 8))
        rates = [1.0] + [calib.rate(node_probability(score, parent, row)) for row in range(1, len(score))]
        surv = survivals(parent, rates.__getitem__)
        for curve, spent in ((flat, 0.0), (steep, 0.3), (steep, 0.0)):
            keep, rate = best_block(surv, curve, 100, spent)
            assert all(parent[r] == 0 or parent[r] in keep for r in keep)
            best = 0.0
            for size in range(len(score)):
                for rows in itertools.combinations(range(1, len(score)), size):
                    if all(parent[r] == 0 or parent[r] in rows for r in rows):
                        tokens = 1 + sum(surv[r] for r in rows)
                        best = max(best, tokens / (curve(size + 1, 100) + spent))
            assert rate == pytest.approx(best)
            own = (1 + sum(surv[r] for r in keep)) / (curve(len(keep) + 1, 100) + spent)
            assert rate == pytest.approx(own)


def test_calibration_prior_and_updates():
    calib = DraftCalibration(bins=10, prior_weight=2.0)
    assert calib.rate(0.93) == pytest.approx(0.95) and calib.rate(0.0) == pytest.approx(0.05)
    assert calib.rate(1.0) == pytest.approx(0.95) and calib.extension_rate() == 0.5
    for accepted in (True, True, False, True):
        calib.update(0.91, accepted)
    assert calib.rate(0.99) == pytest.approx((3 + 2 * 0.95) / (4 + 2))
    assert calib.rate(0.5) == pytest.approx(0.55)  # other bins keep their prior
    for extended in (True, False, False):
        calib.update_parent(extended)
    assert calib.extension_rate() == pytest.approx((1 + 1) / (3 + 2))
    with pytest.raises(ValueError):
        DraftCalibration(bins=0)


def test_deeper_pays_only_when_a_level_raises_the_rate():
    calib = DraftCalibration()
    for _ in range(50):
        calib.update_parent(True)  # a draft the target agrees with: extension rate near 1
    chain = [1.0, 0.9]
    assert deeper_pays(chain, [1], calib, flat, 100, 0.01, 0.01)  # rows are free
    assert not deeper_pays(chain, [1], calib, flat, 100, 0.01, 5.0)  # the draft forward costs 5 steps
    for _ in range(500):
        calib.update_parent(False)  # mostly rejected: the next level is not worth a 40%-of-a-step row
    assert not deeper_pays([1.0, 0.05], [1], calib, steep, 100, 0.0, 0.0)


@pytest.fixture(scope="module")
def refs(tiny_lm):
    eng = Engine(tiny_lm.model)
    return eng, [(p, Vanilla(eng).generate(p, 32, set(), Counts())) for p in varied_prompts(6, seed=5)]


def auto_decoder(eng, tree: str, draft: str, curve, draft_step: float, lm=None, **kw) -> LongSpec:
    depth, widths = TREES[tree]
    kw.update(depth=depth, widths=widths, block="auto")
    if draft == "target":
        dec = LongSpec(eng, draft_module=TargetDraft(lm.model), **kw)
    else:
        dec = LongSpec(eng, checkpoint="random", window=16, **kw)
    dec.use_cost(curve)
    assert set(dec.draft_seconds) == {1, *widths[:-1]}  # measured per beam size
    dec.draft_seconds = dict.fromkeys(dec.draft_seconds, draft_step)  # in the synthetic curve's units
    return dec


@pytest.mark.parametrize("curve", [flat, steep], ids=["flat", "steep"])
@pytest.mark.parametrize("draft", ["random", "target"])
@pytest.mark.parametrize("tree", ["chain", "small", "paper"])
def test_auto_greedy_equals_vanilla_and_follows_the_curve(refs, tiny_lm, tree, draft, curve):
    eng, cases = refs
    dec = auto_decoder(eng, tree, draft, curve, 0.02, tiny_lm)
    total = Counts(keep_steps=False)
    rows = drafts = 0
    for prompt, ref in cases:
        counts = Counts()
        got = dec.generate(prompt, 32, set(), counts)
        check_lossless(eng, prompt, ref, got)
        assert counts.committed == len(got) - 1
        rows += sum(s.block_tokens for s in counts.steps if not s.draft)
        drafts += counts.draft_model_forwards
        total.forwards += counts.forwards
        total.committed += counts.committed
    full_rows = 1 + sum(TREES[tree][1])
    if draft == "target" and curve is flat:  # a draft that is always right, on free rows: deep blocks
        assert total.tau > 0.6 * (TREES[tree][0] + 1)
    if draft == "random" and curve is steep:  # a draft that is never right, rows at 40% of a step:
        assert rows < 1.5 * total.forwards  # blocks shrink to about the root alone
        assert drafts < 1.5 * total.forwards  # and drafting stops after the first level
    assert rows < full_rows * total.forwards or curve is flat


def test_auto_cuts_trees_into_subtrees(tiny_lm):
    """`_cut` keeps the chosen rows with their parents, in order, and their scores."""
    eng = Engine(tiny_lm.model)
    dec = LongSpec(eng, depth=2, widths=[2, 2], checkpoint="random", block="auto")
    tree = Tree([7])
    a = tree.add(3, 0, -0.05)
    tree.add(4, 0, -3.0)
    tree.add(5, a, -0.1)
    tree.add(6, a, -4.0)
    cut = dec._cut(tree, 100, 0.0, steep)
    assert cut.tokens[0] == 7 and set(cut.tokens) <= {7, 3, 4, 5, 6}
    assert all(cut.parent[r] < r for r in range(1, len(cut.tokens)))
    for r in range(1, len(cut.tokens)):
        original = tree.tokens.index(cut.tokens[r])
        assert cut.score[r] == tree.score[original]
        assert cut.tokens[cut.parent[r]] == tree.tokens[tree.parent[original]]
    assert len(dec._cut(tree, 100, 0.0, flat).tokens) == len(tree.tokens)  # free rows: all of it


@pytest.mark.parametrize("draft", ["target", "random"])
def test_auto_sampling_is_lossless_in_distribution(draft):
    sampler_kw = dict(temperature=1.0, top_p=0.95, top_k=6)
    eng, prompt, exact = tiny_sampling_case(3, sampler_kw)
    sampler = Sampler(seed=1, **sampler_kw)
    module = {"draft_module": TargetDraft(eng.model)} if draft == "target" else {"checkpoint": "random"}
    dec = LongSpec(eng, depth=2, widths=[3, 3], sampler=sampler, block="auto", **module)
    dec.use_cost(steep)
    dec.draft_seconds = dict.fromkeys(dec.draft_seconds, 0.02)
    samples, _ = sample_generations(dec, prompt, 3, 800)
    assert chi_square_pvalue(samples, exact) > 1e-3


def test_auto_needs_a_curve_and_a_known_mode(refs):
    eng, cases = refs
    with pytest.raises(HarnessError, match="cost curve"):
        LongSpec(eng, depth=2, widths=[1, 1], checkpoint="random", block="auto").generate(
            cases[0][0], 8, set(), Counts()
        )
    with pytest.raises(HarnessError, match="block must be one of fixed, auto"):
        LongSpec(eng, depth=2, widths=[1, 1], checkpoint="random", block="big")


def test_runner_hands_the_curve_and_the_draft_is_timed_before(tmp_path, monkeypatch):
    """decoder=longspec_chain decoder.block=auto through the runner: a cost curve is measured, the
    draft's forward seconds too (one beam size: 1 row), the outputs match vanilla; block=fixed keeps
    the run id of a config without the field."""
    import pandas as pd

    from runners.runner import Runner
    from tests.helpers import make_cfg

    monkeypatch.setenv("HARNESS_COST_CACHE", str(tmp_path / "curves"))
    base = ("decoder=longspec_chain", "decoder.checkpoint=random", "decoder.draft_vocab=null")
    fixed = Runner(make_cfg(tmp_path, *base))
    assert "block" not in fixed.identity["decoder_params"]
    auto = Runner(make_cfg(tmp_path, *base, "decoder.block=auto"))
    assert auto.run_id != fixed.run_id
    runs = pd.read_parquet(auto.run() / "runs.parquet")
    assert runs.loc[0, "cost_curve"]
    assert set(auto.decoder.draft_seconds) == {1} and auto.decoder.draft_seconds[1] > 0
    assert pd.read_parquet(auto.rundir.path / "samples.parquet")["matches_vanilla"].all()
