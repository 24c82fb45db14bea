"""`decoder.block=auto`: the acceptance model and the chooser against brute force, the
cost-curve hand-over by the runner, and losslessness of auto-sized blocks on tiny models and SmolLM2."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from core.engine import Engine
from core.types import Counts, HarnessError
from decoders.block_size import (
    AcceptanceStats,
    PrefixGain,
    best_option,
    best_prefix,
    expected_longest,
    generator_plan,
)
from decoders.fafo.decoder import FAFO, FAFO2Forward
from decoders.lookahead import Lookahead
from decoders.pld import PromptLookup
from decoders.vanilla import Vanilla
from tests.conftest import needs_smollm
from tests.helpers import flat, steep, varied_prompts
from tests.lossless_check import check_lossless, mtbench_lossless

pytestmark = pytest.mark.usefixtures("one_thread")


def test_acceptance_stats_count_reached_positions():
    st = AcceptanceStats(prior_mean=0.5, prior_weight=2.0)
    assert st.rate("k", 0) == 0.5 and st.survival("k", 2) == [0.5, 0.25]
    st.update("k", drafted=4, accepted=1)  # token 0 accepted, token 1 rejected, 2-3 never reached
    assert st.reached["k"] == [1, 1, 0, 0] and st.passed["k"] == [1, 0, 0, 0]
    st.update("k", drafted=2, accepted=2)
    assert st.rate("k", 0) == pytest.approx(3 / 4) and st.rate("k", 1) == pytest.approx(2 / 4)
    assert st.rate("k", 2) == 0.5 and st.rate("other", 0) == 0.5  # unseen: the prior
    with pytest.raises(ValueError):
        AcceptanceStats(prior_mean=1.0)


def test_expected_longest_matches_enumeration():
    rng = random.Random(0)
    for _ in range(50):
        drafts = []
        for _ in range(rng.randint(1, 3)):
            rates = [rng.random() for _ in range(rng.randint(1, 4))]
            drafts.append(rates)
        survivals = [
            [1.0] * 0 + [float(__import__("math").prod(r[: i + 1])) for i in range(len(r))] for r in drafts
        ]
        # brute force: every draft's accepted length is its first rejected position
        outcomes = [range(len(r) + 1) for r in drafts]
        want = 0.0
        for lengths in itertools.product(*outcomes):
            p = 1.0
            for r, n in zip(drafts, lengths):
                p *= math.prod(r[:n]) * (1 - r[n] if n < len(r) else 1.0)
            want += p * max(lengths)
        assert expected_longest(survivals) == pytest.approx(want)
    assert expected_longest([]) == 0.0


def test_best_option_follows_the_curve():
    options = [(1, 1.0), (3, 1.8), (6, 2.2), (11, 2.4)]
    assert best_option(options, flat, 100) == 3  # rows are free: the longest draft
    assert best_option(options, steep, 100) == 0  # 1.8 / 1.8 ties 1.0 / 1: the smaller block
    assert best_option([(1, 1.0), (2, 1.9)], steep, 100) == 1
    sizes = [1, 2, 4, 8, 40]
    assert generator_plan(sizes, lambda s: 6 * s, flat, 100, 0.1) == (40, 1)  # every step, full size
    # steep: 6 rows add 2.4 steps; run the smallest every 24th step (2.4 / 24 = 0.1 per step)
    assert generator_plan(sizes, lambda s: 6 * s, steep, 100, 0.1) == (1, 24)
    assert generator_plan(sizes, lambda s: s, steep, 100, 0.8) == (2, 1)
    with pytest.raises(ValueError):
        generator_plan(sizes, lambda s: s, steep, 100, 0.0)


@pytest.fixture(scope="module")
def refs(tiny_lm):
    eng = Engine(tiny_lm.model)
    return eng, [(p, Vanilla(eng).generate(p, 40, set(), Counts())) for p in varied_prompts(8, seed=3)]


def fixed_and_auto(refs, make, curve) -> tuple[dict[str, int], dict[str, int], object]:
    """Every reference prompt through `make(engine, block)` for block fixed and auto on `curve`, each
    output checked against vanilla's. Returns drafted tokens and block rows summed per block mode, and
    the last auto decoder (its `plan`)."""
    eng, cases = refs
    drafted, rows = {}, {}
    for block in ("fixed", "auto"):
        drafted[block] = rows[block] = 0
        for prompt, ref in cases:
            dec = make(eng, block)
            dec.use_cost(curve)
            counts = Counts()
            got = dec.generate(prompt, 40, set(), counts)
            check_lossless(eng, prompt, ref, got)
            assert counts.committed == len(got) - 1
            drafted[block] += counts.drafted
            rows[block] += sum(s.block_tokens for s in counts.steps)
    return drafted, rows, dec


@pytest.mark.parametrize("curve", [flat, steep], ids=["flat", "steep"])
def test_pld_auto_is_lossless_and_follows_the_curve(refs, curve):
    drafted, _, _ = fixed_and_auto(refs, lambda e, b: PromptLookup(e, num_tokens=8, block=b), curve)
    if curve is flat:
        assert drafted["auto"] == drafted["fixed"]  # free rows: always the whole draft
    else:
        assert 0 < drafted["auto"] < drafted["fixed"]  # expensive rows: drafts cut where they fail


def test_block_auto_needs_a_curve_and_a_known_mode(refs):
    eng, cases = refs
    with pytest.raises(HarnessError, match="cost curve"):
        PromptLookup(eng, block="auto").generate(cases[0][0], 8, set(), Counts())
    with pytest.raises(HarnessError, match="decoder.block must be one of fixed, auto; got 'big'"):
        PromptLookup(eng, block="big")


@pytest.mark.smollm
@needs_smollm
def test_smollm_block_auto_lossless(smollm):
    def auto(make):
        def build(e):
            dec = make(e)
            dec.use_cost(steep)
            return dec

        return build

    makers = [
        ("pld_auto", auto(lambda e: PromptLookup(e, block="auto"))),
        ("lookahead_auto", auto(lambda e: Lookahead(e, pool_from_prompt=True, block="auto"))),
        ("fafo_auto", auto(lambda e: FAFO(e, k=3, n=4, tree=True, pool_from_prompt=True, block="auto"))),
    ]
    taus = mtbench_lossless(smollm, makers, 2, 1, 32)
    assert max(taus) > 1.0


def test_best_prefix_equals_options_built_by_hand():
    rng = random.Random(1)
    for _ in range(30):
        survivals = [sorted((rng.random() for _ in range(3)), reverse=True) for _ in range(rng.randint(0, 6))]
        rows = [1 + 3 * g for g in range(len(survivals) + 1)]
        for curve in (flat, steep):
            options = [(rows[g], 1.0 + expected_longest(survivals[:g])) for g in range(len(survivals) + 1)]
            assert best_prefix(survivals, rows, curve, 50) == best_option(options, curve, 50)
    assert best_prefix([[0.9, 0.9], [0.9, 0.9]], [1, 3, 5], flat, 50) == 2
    assert best_prefix([[0.1, 0.0], [0.1, 0.0]], [1, 3, 5], steep, 50) == 0


@pytest.mark.parametrize("curve", [flat, steep], ids=["flat", "steep"])
def test_lookahead_auto_is_lossless_and_follows_the_curve(refs, curve):
    def make(e, b):
        return Lookahead(e, N=4, W=5, G=5, pool_from_prompt=True, block=b)

    _, rows, dec = fixed_and_auto(refs, make, curve)
    if curve is flat:
        assert dec.plan == (5, 1) and rows["auto"] == rows["fixed"]  # the whole window, every step
    else:
        assert dec.plan[0] == 1 and dec.plan[1] > 1 and rows["auto"] < rows["fixed"] / 2


@pytest.mark.parametrize("curve", [flat, steep], ids=["flat", "steep"])
@pytest.mark.parametrize("tree", [False, True], ids=["flat_cands", "tree"])
def test_fafo_auto_is_lossless_and_follows_the_curve(refs, curve, tree):
    def make(e, b):
        return FAFO(e, k=3, n=6, m=6, tree=tree, pool_from_prompt=True, pool_capacity=8, block=b)

    _, rows, dec = fixed_and_auto(refs, make, curve)
    if curve is flat:
        assert dec.plan == (6, 1) and rows["auto"] == rows["fixed"]  # every stream and candidate
    else:
        assert dec.plan[0] == 1 and dec.plan[1] > 1 and rows["auto"] < rows["fixed"] / 2


def test_fafo_auto_refuses_static_shapes(refs):
    eng, _ = refs
    with pytest.raises(HarnessError, match="pad_candidates"):
        FAFO(eng, k=2, n=2, pad_candidates=True, block="auto")
    with pytest.raises(HarnessError, match="no block=auto"):
        FAFO2Forward(eng, k=2, n=2, block="auto")


def test_observed_prefix_gains_override_the_independence_model():
    """Candidates that never add to the first one's accepted length stop being verified on a cheap
    curve, whatever the per-candidate rates say; unobserved ranks fall back to the model."""
    gains = PrefixGain(weight=2.0)
    for _ in range(20):
        gains.update([2, 2, 0])  # the second shares the first's prefix, the third misses: no gain
    assert gains.total == [40.0, 0.0, 0.0] and gains.count == [20, 20, 20]
    assert gains.blend(1, 1.0) == pytest.approx(42 / 22) and gains.blend(2, 0.5) == pytest.approx(1 / 22)
    assert gains.blend(4, 0.3) == pytest.approx(0.3)  # never observed: the model
    survivals = [[0.5, 0.25]] * 3
    rows = [1, 3, 5, 7]
    cheap = lambda r, c: 1.0 + 0.05 * (r - 1)  # noqa: E731
    assert best_prefix(survivals, rows, cheap, 50) == 3  # the model: every candidate pays
    assert best_prefix(survivals, rows, cheap, 50, gains) == 1  # observed: only the first does
    assert best_prefix(survivals, rows, flat, 50, gains) == 3  # free rows: verify them all anyway
