"""Lookahead Decoding (decoders/lookahead.py): the block layout is exact, greedy equals vanilla greedy
at random settings (a divergence only at an audited near-tie), fixed-shape steps take one layout per
padded size, the pool holds the true generated n-grams (upstream bug 2), and sampling with gathered
checks is lossless in distribution. Greedy == vanilla at its settings, stop and length, the cache and
the plain sampling check: tests/test_every_method.py.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.attention import MaskView
from core.decode_graph import padded_rows
from core.engine import Engine
from core.models import load_model
from core.sampling import Sampler
from core.types import Counts, HarnessError
from decoders.lookahead import JacobiWindow, Lookahead, build_layout
from decoders.vanilla import Vanilla
from kv_policies.base import KVPolicy
from tests.conftest import needs_smollm
from tests.helpers import varied_prompts
from tests.lossless_check import (
    check_lossless,
    check_pool_deferral,
    chi_square_pvalue,
    exact_distribution,
    mtbench_lossless,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def refs(tiny_lm):
    eng = Engine(tiny_lm.model)
    prompts = varied_prompts(8)
    return eng, [(p, Vanilla(eng).generate(p, 40, set(), Counts())) for p in prompts]


# --- layout -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("lens,n_guess", [([5], 2), ([4, 5], 0), ([3, 4, 4], 1), ([3, 4, 4, 4], 3)])
def test_every_row_sees_a_causal_chain(tiny_lm, lens, n_guess):
    """Each block row's logits equal a plain causal forward over exactly the tokens it may see, at
    consecutive positions: the mask and the position ids are Lookahead's (Fu et al. Fig. 2b)."""
    eng = Engine(tiny_lm.model)
    k = 4
    lay = build_layout(lens, n_guess, k, eng.device)
    n = lay.block_mask.shape[0]
    assert n == 1 + sum(lens) + n_guess * k
    prompt = [5, 77, 13, 200, 9, 31]
    gen = torch.Generator().manual_seed(n)
    tokens = torch.randint(0, 256, (n,), generator=gen)
    tokens[0] = prompt[-1]
    eng.reset(len(prompt) + n + 1)
    eng.prefill(prompt[:-1])
    p = len(prompt) - 1
    mask = torch.cat([torch.ones(n, p, dtype=torch.bool, device=eng.device), lay.block_mask], dim=1)
    logits = eng.step(tokens, lay.offsets + p, MaskView(mask, eng.scale))
    for r in range(n):
        rows = lay.block_mask[r].nonzero().flatten().cpu()  # indexes the CPU tokens and the layout
        assert rows[0] == 0 and rows[-1] == r  # every row sees the root and itself
        assert torch.equal(lay.offsets[rows], torch.arange(len(rows), device=eng.device))  # p..p+len-1
        eng.reset(p + len(rows) + 1)
        ref = eng.prefill(prompt[:-1] + tokens[rows].tolist())
        torch.testing.assert_close(logits[r], ref, atol=1e-4, rtol=1e-4)


def test_window_warm_up_then_steady_shape():
    n, w = 5, 4
    win = JacobiWindow(n, w, list(range(w + n - 3)))
    for step in range(n - 2):
        assert not win.full
        top = win.lens()[-1] + (1 if len(win.lens()) == 1 else 0)
        assert win.advance(-1, list(range(100 * step, 100 * step + top))) == []
    assert win.full and win.lens() == [w - 1] + [w] * (n - 2)
    before = [list(lv) for lv in win.levels]
    grams = win.advance(99, [7, 8, 9, 10])
    assert [key for key, _ in grams] == [(99,), *((t,) for t in before[0])]  # as the pool stores them
    assert grams[2][1] == (before[1][2], before[2][2], before[3][2], 9)  # column 2, bottom to top
    assert win.levels == [before[1][1:], before[2], before[3], [7, 8, 9, 10]]


# --- greedy lossless --------------------------------------------------------------------------------


@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(
    N=st.integers(3, 6),
    W=st.integers(1, 8),
    G=st.integers(1, 8),
    seed=st.integers(0, 3),
    pool=st.booleans(),
    prompt=st.lists(st.integers(0, 259), min_size=1, max_size=40),
)
def test_greedy_equals_vanilla_random_settings(refs, N, W, G, seed, pool, prompt):
    eng, _ = refs
    ref = Vanilla(eng).generate(prompt, 24, set(), Counts())
    dec = Lookahead(eng, N=N, W=W, G=G, pool_from_prompt=pool, seed=seed)
    got = dec.generate(prompt, 24, set(), Counts())
    check_lossless(eng, prompt, ref, got)


def _layouts_by_stage(dec: Lookahead) -> dict[tuple[int, ...], set[int]]:
    stages: dict[tuple[int, ...], set[int]] = {}
    for lens, slots in dec._layouts:
        stages.setdefault(lens, set()).add(slots)
    return stages


def test_fixed_shape_steps_take_one_layout_per_padded_size(refs):
    """On fixed-shape forwards a step's layout holds as many guesses as fit in its padded block (the
    rest padding no verification reads), so a window stage takes one layout per padded size, not one
    per guess count, and its staged mask and positions stay; the tokens and the rows each step counts
    are the regular path's."""
    eng, cases = refs
    static = Engine(eng.model)
    static.use_graphs(capture=False)
    k = 4  # N - 1
    for prompt, ref in cases:
        plain_counts, fixed_counts = Counts(), Counts()
        plain = Lookahead(eng, N=5, W=7, G=7, pool_from_prompt=True)
        fixed = Lookahead(static, N=5, W=7, G=7, pool_from_prompt=True)
        assert plain.generate(prompt, 40, set(), plain_counts) == ref
        check_lossless(eng, prompt, ref, fixed.generate(prompt, 40, set(), fixed_counts))
        assert [s.block_tokens for s in fixed_counts.steps] == [s.block_tokens for s in plain_counts.steps]
        for lens, slots in _layouts_by_stage(fixed).items():
            sizes = {padded_rows(1 + sum(lens) + g * k) for g in slots}
            assert len(slots) == len(sizes), (lens, sorted(slots))
    # the regular path builds one layout per guess count: the check above tells the two apart
    assert any(len(slots) > 2 for slots in _layouts_by_stage(plain).values())


def test_pool_holds_the_true_generated_ngrams(refs):
    """Upstream bug 2 fixed: with pool_from_prompt, every n-gram of prompt + output is in the pool
    under the token before it (upstream recorded wrong ids whenever > 1 token was accepted)."""
    eng, cases = refs
    N = 3
    for prompt, ref in cases[:4]:
        dec = Lookahead(eng, N=N, W=3, G=400, pool_from_prompt=True)
        counts = Counts()
        out = dec.generate(prompt, 40, set(), counts)
        assert out == ref
        seq = prompt + out
        for i in range(1, len(seq) - (N - 1) + 1):
            assert tuple(seq[i : i + N - 1]) in dec.pool.get((seq[i - 1],))
    assert any(s.accepted > 1 for s in counts.steps)


def test_window_grams_are_stored_while_the_next_forward_runs(refs, monkeypatch):
    """The window's n-grams of a forward are stored after the next forward's launch, and every step finds
    the same guesses as when they are stored at once."""
    eng, cases = refs
    prompt, ref = cases[1]
    check_pool_deferral(monkeypatch, eng, lambda: Lookahead(eng, N=4, W=4, G=4), prompt, ref, 40)


class RecentOnly(KVPolicy):
    """Test policy: only the last 4 cached positions (lossy)."""

    def visible(self, layer, q, k_cache, cache_len):
        pos = self.engine.cache.slot_pos[:cache_len]
        return (pos >= cache_len - 4).unsqueeze(0).expand(k_cache.shape[0], -1)


def test_lossy_kv_policy_restricts_every_row(refs):
    eng, cases = refs
    prompt, _ = cases[0]
    dec = Lookahead(eng, N=4, W=3, G=3, kv=RecentOnly())
    counts = Counts()
    out = dec.generate(prompt, 20, set(), counts)
    assert not dec.lossless and Lookahead(eng).lossless
    assert len(out) == 20 and counts.kv_attended <= 4 * counts.forwards


def test_bad_parameters():
    eng = Engine(load_model("tiny", "tiny", dtype="float32", device="cpu").model)
    for field, bad in (("N", 2), ("W", 0), ("G", 0), ("generator_share", 0.0), ("pool_from_prompt", "maybe")):
        with pytest.raises(HarnessError, match=f"^decoder.{field} must be"):
            Lookahead(eng, **{field: bad})


# --- sampling: lossless in distribution ---------------------------------------------------------------
def test_sampling_is_lossless_in_distribution_with_gathered_checks(monkeypatch):
    """First 3 sampled tokens (temperature, top-k and top-p all active, vocab 16): sampled
    Lookahead's empirical joint distribution fits the exact vanilla-sampling distribution
    (enumerated), and so does vanilla's own (sanity of the enumeration). Candidates come from the
    prompt's n-grams, so many are accepted. The test's power is shown in tests/test_verify.py. The
    checks' values gathered first (`sampled_verify.gathers`), as on a GPU; computed as the walk reads
    them, and vanilla's own: tests/test_every_method.py."""
    from decoders import sampled_verify

    monkeypatch.setattr(sampled_verify, "GATHER_ON_CPU", True)
    sampler_kw = dict(temperature=1.0, top_p=0.95, top_k=6)
    lm = load_model(
        "tiny", "tiny", arch="llama", dtype="float32", device="cpu", seed=4, tiny=dict(vocab_size=16)
    )
    eng = Engine(lm.model)
    prompt = [1, 2, 3] + Vanilla(eng).generate([1, 2, 3], 24, set(), Counts())  # its n-grams are likely
    exact = exact_distribution(eng, prompt, 3, Sampler(**sampler_kw))
    la = Lookahead(eng, N=3, W=3, G=4, pool_from_prompt=True, sampler=Sampler(seed=1, **sampler_kw))
    samples, accepted = [], 0
    for _ in range(1000):
        counts = Counts(keep_steps=False)
        samples.append(tuple(la.generate(prompt, 3, set(), counts)))
        accepted += counts.accepted
    assert accepted > 400  # candidates are really accepted under sampling
    assert chi_square_pvalue(samples, exact) > 1e-3


# --- the packaged SmolLM2 on MT-Bench -----------------------------------------------------------------
@pytest.mark.smollm
@needs_smollm
def test_smollm_mtbench_fast(smollm):
    """Two MT-Bench questions (turn 1), 32 tokens, the paper setting with the prompt pool."""
    taus = mtbench_lossless(
        smollm, [("lookahead", lambda e: Lookahead(e, N=5, W=7, G=7, pool_from_prompt=True))], 2, 1, 32
    )
    assert max(taus) > 1.0


@pytest.mark.slow
@pytest.mark.smollm
@needs_smollm
def test_smollm_mtbench_full(smollm):
    """Every MT-Bench question, both turns, 256 new tokens, Lookahead's README setting (5, 7, 7)."""
    taus = mtbench_lossless(smollm, [("lookahead", lambda e: Lookahead(e, N=5, W=7, G=7))], None, 2, 256)
    assert sum(taus) / len(taus) > 1.0
