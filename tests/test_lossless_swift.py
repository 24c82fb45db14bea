"""SWIFT (decoders/swift.py) and the engine's layer-skipping forward (`Engine.step(skip=...)`): a skipped
sublayer is really left out and a skipped attention leaves the cache alone; greedy equals vanilla
greedy (fp32) for its options on tiny random models with interior layers and on SmolLM2; the skip-set
search runs, is reproducible under its seed and independent of earlier generations; bad input is one
clear error. Stop and length, the cache and sampling in distribution: tests/test_every_method.py."""

from __future__ import annotations

import pytest
import torch

from core.attention import CausalView
from core.engine import Engine
from core.sampling import Sampler
from core.types import Counts, HarnessError, LayerSkip
from decoders.swift import Swift
from decoders.vanilla import Vanilla
from kv_policies.registry import build_policy
from tests.conftest import TEST_DEVICE, needs_smollm
from tests.helpers import varied_prompts
from tests.lossless_check import (
    check_lossless,
    mtbench_lossless,
)

pytestmark = pytest.mark.usefixtures("one_thread")
N_NEW = 40


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def deep_lm(request):
    """A tiny random model with 6 layers: 4 interior ones whose 8 sublayers the draft may skip."""
    from core.models import load_model

    return load_model(
        "tiny", "tiny", arch=request.param, dtype="float32", device=TEST_DEVICE, seed=1, tiny={"layers": 6}
    )


@pytest.fixture(scope="module")
def refs(deep_lm):
    eng = Engine(deep_lm.model)
    return eng, [(p, Vanilla(eng).generate(p, N_NEW, set(), Counts())) for p in varied_prompts(5, seed=3)]


# --- the engine's layer-skipping forward -------------------------------------------------------------
def test_skipping_every_sublayer_is_the_embedding_through_the_head(deep_lm):
    """All attention and MLP sublayers skipped: the logits are final_norm(embed(x)) through the LM head,
    and the cache rows of the step are not written."""
    eng = Engine(deep_lm.model)
    eng.reset(16)
    eng.prefill([5, 6, 7])
    eng.cache.k[:, :, 3].fill_(7.0)
    every = frozenset(range(eng.w.n_layers))
    tokens, positions = eng.chain([9], 3)
    logits = eng.step(tokens, positions, CausalView(eng.scale), skip=LayerSkip(every, every))
    with torch.inference_mode():
        want = eng.lm_logits(eng.w.final_norm(eng.w.embed(tokens)))
    torch.testing.assert_close(logits, want, rtol=0, atol=0)
    assert bool((eng.cache.k[:, :, 3] == 7.0).all())  # no layer attended, so none wrote its KV


def test_a_skipped_attention_writes_no_kv_and_the_rest_match_a_full_forward(deep_lm):
    """Skipping only the last layer's MLP changes nothing before it: every layer's KV equals a full
    forward's; skipping layer 2's attention leaves that layer's cache row untouched."""
    eng = Engine(deep_lm.model)
    eng.reset(16)
    eng.prefill([5, 6, 7])
    tokens, positions = eng.chain([9], 3)
    view = CausalView(eng.scale)
    last = eng.w.n_layers - 1
    full = eng.step(tokens, positions, view)
    k_full = eng.cache.k[:, :, 3].clone()
    eng.commit([])
    eng.step(tokens, positions, view, skip=LayerSkip(mlp=frozenset({last})))
    torch.testing.assert_close(eng.cache.k[:, :, 3], k_full, rtol=0, atol=0)
    eng.commit([])
    eng.cache.k[2, :, 3].fill_(7.0)
    skipped = eng.step(tokens, positions, view, skip=LayerSkip(attn=frozenset({2})))
    assert bool((eng.cache.k[2, :, 3] == 7.0).all())
    torch.testing.assert_close(eng.cache.k[:2, :, 3], k_full[:2], rtol=0, atol=0)  # layers before it
    assert not torch.equal(skipped, full)
    eng.commit([])
    empty = eng.step(tokens, positions, view, skip=LayerSkip())
    torch.testing.assert_close(empty, full, rtol=0, atol=0)  # skipping nothing is the full forward


# --- greedy: lossless ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("max_draft", "confidence", "tree"), [(1, 0.8, True), (4, 0.0, False), (25, 0.5, True), (25, 0.5, False)]
)
def test_greedy_equals_vanilla_tiny(refs, max_draft, confidence, tree):
    eng, cases = refs
    drafted = accepted = searched = 0
    for prompt, ref in cases:
        counts = Counts()
        dec = Swift(
            eng,
            skip_ratio=0.45,
            max_draft=max_draft,
            confidence=confidence,
            context_window=4,
            max_score=1.0,
            tree=tree,
        )
        got = dec.generate(prompt, N_NEW, set(), counts)
        check_lossless(eng, prompt, ref, got)
        assert counts.committed == len(got) - 1 and counts.forwards <= len(got) - 1
        chain = sum(1 for s in counts.steps if s.draft and s.block_tokens == 1)
        assert counts.draft_forwards == chain + dec.search.tried  # the search forwards are drafts too
        if not tree:
            assert counts.drafted == chain  # one forward per drafted token
        drafted, accepted, searched = (
            drafted + counts.drafted,
            accepted + counts.accepted,
            searched + dec.search.tried,
        )
    assert 0 < accepted < drafted  # acceptance and rejection both exercised
    assert searched > len(cases)  # candidates beyond the incumbents were scored


def test_the_tree_commits_more_per_verification_than_the_chain(refs):
    """With the same skip set, the siblings of each drafted position catch tokens the chain misses."""
    eng, cases = refs
    forwards = {}
    for tree in (True, False):
        counts = Counts()
        for prompt, ref in cases:
            assert Swift(eng, search_steps=0, tree=tree).generate(prompt, N_NEW, set(), counts) == ref
        forwards[tree] = counts.forwards
        if tree:
            assert max(s.block_tokens for s in counts.steps if not s.draft) > 3  # siblings verified
    assert forwards[True] < forwards[False]


# --- the search ------------------------------------------------------------------------------------------
def test_search_keeps_the_best_set_and_is_reproducible(refs):
    """The same seed gives the same search and counts whatever ran before, another seed other
    candidates; search_steps=0 keeps the reference's starting set."""
    eng, cases = refs
    prompt, _ = cases[2]

    def run(seed: int, steps: int = 1000) -> tuple[Swift, Counts]:
        dec = Swift(
            eng, skip_ratio=0.45, context_window=4, max_score=1.0, seed=seed, search_steps=steps, tree=False
        )
        counts = Counts()
        dec.generate(prompt, N_NEW, set(), counts)
        return dec, counts

    first, c1 = run(0)
    run(5)  # a generation in between
    again, c2 = run(0)
    assert first.search == again.search and c1.steps == c2.steps
    assert first.search.tried > 2 and first.search.skip.size in (first.n_skip, 2 * len(first.start_skip.attn))
    other, _ = run(1)
    assert other.search.tried > 2 and (other.search != first.search)
    fixed, counts = run(0, steps=0)
    assert fixed.search.skip == fixed.start_skip == LayerSkip(frozenset({1, 3}), frozenset({1, 3}))
    assert fixed.search.tried == 0 and counts.draft_forwards == counts.drafted


@pytest.mark.parametrize(
    ("scores", "max_score", "steps", "tried", "best"),
    [
        ([0.5, 0.4, 0.7, 0.7, 0.2, 0.0], 1.0, 1000, 6, 2),  # patience
        ([0.5, 0.95], 0.9, 1000, 2, 1),  # max_score
        ([0.3, 0.2, 0.1, 0.4], 1.0, 3, 4, 3),  # search_steps
    ],
)
def test_search_keeps_the_higher_score_and_stops(refs, monkeypatch, scores, max_score, steps, tried, best):
    """The incumbent is scored first; only a higher matchness replaces it; the search stops after
    `patience` (3) candidates without a gain, above `max_score`, or after `search_steps` candidates."""
    eng, cases = refs
    prompt, ref = cases[0]
    script, seen = iter(scores), []

    def scripted(self, skip, window, prompt_len, counts):
        seen.append(skip)
        return next(script)

    monkeypatch.setattr(Swift, "_matchness", scripted)
    dec = Swift(eng, context_window=4, max_score=max_score, patience=3, search_steps=steps)
    assert dec.generate(prompt, N_NEW, set(), Counts()) == ref
    assert seen[0] == dec.start_skip and len(seen) == tried == dec.search.tried and not dec.search.active
    assert dec.search.skip == seen[best] and dec.search.score == scores[best]


def test_matchness_is_the_share_of_the_window_predicted(refs):
    """Skipping nothing drafts as the target: on vanilla's own output the matchness is 1; skipping
    every interior sublayer predicts less of it. The search forward commits nothing."""
    eng, cases = refs
    prompt, ref = cases[0]
    Vanilla(eng).generate(prompt, N_NEW, set(), Counts())
    n, dec, counts = eng.length, Swift(eng), Counts()
    assert dec._matchness(LayerSkip(), ref[:9], len(prompt), counts) == 1.0
    interior = frozenset(range(1, eng.w.n_layers - 1))
    assert dec._matchness(LayerSkip(interior, interior), ref[:9], len(prompt), counts) < 1.0
    assert eng.length == n and counts.draft_forwards == 2 and counts.forwards == 0
    assert [s.block_tokens for s in counts.steps] == [9, 9]


def test_draft_records_show_the_skipped_share(refs):
    """Draft steps are recorded as draft forwards reading the cache of the attention layers they run."""
    eng, cases = refs
    prompt, _ = cases[0]
    counts = Counts()
    dec = Swift(eng, search_steps=0, confidence=0.0, max_draft=3)
    dec.generate(prompt, 8, set(), counts)
    drafts = [s for s in counts.steps if s.draft]
    verifies = [s for s in counts.steps if not s.draft]
    assert drafts and verifies and len(verifies) == counts.forwards
    kept = eng.w.n_layers - len(dec.start_skip.attn)
    assert drafts[0].kv_attended == len(prompt) * kept // eng.w.n_layers and verifies[0].kv_attended == len(
        prompt
    )


# --- bad input -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "bad", "message"),
    [
        ("skip_ratio", 1.0, "decoder.skip_ratio must be"),
        ("skip_ratio", -0.1, "decoder.skip_ratio must be"),
        ("max_draft", 0, "decoder.max_draft must be an integer >= 1"),
        ("confidence", 1.5, "decoder.confidence must be"),
        ("context_window", 0, "decoder.context_window must be an integer >= 1"),
        ("search_steps", -1, "decoder.search_steps must be an integer >= 0"),
        ("patience", 0, "decoder.patience must be an integer >= 1"),
        ("max_score", 2, "decoder.max_score must be"),
        ("seed", "x", "decoder.seed must be an integer"),
        ("tree", "yes", "decoder.tree must be true or false"),
    ],
)
def test_bad_options(refs, field, bad, message):
    with pytest.raises(HarnessError, match=f"^{message}"):
        Swift(refs[0], **{field: bad})


def test_a_restricting_kv_policy_is_refused(refs):
    with pytest.raises(HarnessError, match="^decoder=swift drafts by skipping layers .* use kv=full"):
        Swift(refs[0], kv=build_policy("streaming", budget=24, sinks=4))


# --- sampling ----------------------------------------------------------------------------------------------


# --- sampling (in distribution: tests/test_every_method.py) ---------------------------------------------
def test_tree_verification_refuses_sampling(refs):
    with pytest.raises(HarnessError, match="^decoder=swift: the tree verification .* is greedy only"):
        Swift(refs[0], sampler=Sampler(seed=1, temperature=1.0))


# --- SmolLM2 ----------------------------------------------------------------------------------------
@pytest.mark.smollm
@needs_smollm
def test_smollm_mtbench(smollm):
    """One MT-Bench question (turn 1), 32 new tokens, on the packaged SmolLM2 in fp32, with the search on."""
    taus = mtbench_lossless(smollm, [("swift", lambda e: Swift(e, context_window=8))], 1, 1, 32)
    assert min(taus) > 1.0
