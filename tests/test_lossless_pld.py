"""Prompt-lookup decoding (decoders/pld.py): the draft equals HF's PromptLookupCandidateGenerator's, the
incremental index answers like the scan, a block is the root and its draft. Greedy == vanilla at its
settings, stop and length, the cache and sampling in distribution: tests/test_every_method.py."""

from __future__ import annotations

import random

import pytest
import torch

from core.engine import Engine
from core.types import Counts, HarnessError
from decoders.pld import NGramIndex, PromptLookup, find_candidate, match_candidate
from decoders.vanilla import Vanilla
from tests.conftest import needs_smollm
from tests.helpers import varied_prompts
from tests.lossless_check import (
    mtbench_lossless,
)

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def refs(tiny_lm):
    eng = Engine(tiny_lm.model)
    return eng, [(p, Vanilla(eng).generate(p, 40, set(), Counts())) for p in varied_prompts(8, seed=1)]


def test_draft_equals_hf_prompt_lookup():
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    rng = random.Random(0)
    for _ in range(300):
        seq = [rng.randrange(4) for _ in range(rng.randint(1, 30))]
        ngram, k = rng.randint(1, 4), rng.randint(1, 8)
        hf = PromptLookupCandidateGenerator(
            num_output_tokens=k, max_matching_ngram_size=ngram, max_length=10_000
        )
        ids, _ = hf.get_candidates(torch.tensor([seq]))
        assert find_candidate(seq, ngram, k) == ids[0, len(seq) :].tolist(), (seq, ngram, k)


def test_incremental_index_answers_like_the_scan():
    """The decoder's `NGramIndex`, grown token by token (and by blocks), gives `match_candidate`'s
    (matched n, draft) at every prefix of random sequences over small vocabularies (many repeats)."""
    rng = random.Random(1)
    for _ in range(200):
        ngram, k, vocab = rng.randint(1, 4), rng.randint(1, 8), rng.randint(2, 6)
        seq = [rng.randrange(vocab) for _ in range(rng.randint(1, 40))]
        first = rng.randint(1, len(seq))
        index = NGramIndex(ngram, seq[:first])
        at = first
        while True:
            assert index.seq == seq[:at]
            assert index.match(k) == match_candidate(seq[:at], ngram, k), (seq[:at], ngram, k)
            if at == len(seq):
                break
            step = rng.randint(1, 3)
            index.extend(seq[at : at + step])
            at = min(at + step, len(seq))


def test_draft_examples():
    assert find_candidate([5, 6, 7, 8, 5, 6], 2, 3) == [7, 8, 5]  # trailing (5, 6) seen at 0
    assert find_candidate([5, 6, 7, 9, 6], 2, 3) == [7, 9, 6]  # back-off to the 1-gram (6,)
    assert find_candidate([1, 2, 3], 2, 3) == []  # no earlier occurrence
    assert find_candidate([4], 2, 3) == []


def test_each_block_is_the_root_and_its_draft(refs):
    """A verification block is the last token and a draft of at most `num_tokens`; drafts are accepted
    and rejected. (Greedy == vanilla for every setting: tests/test_every_method.py.)"""
    eng, cases = refs
    taus, drafted, accepted = [], 0, 0
    for prompt, ref in cases:
        counts = Counts()
        assert (
            PromptLookup(eng, max_matching_ngram_size=4, num_tokens=20).generate(prompt, 40, set(), counts)
            == ref
        )
        assert all(s.block_tokens == s.drafted + 1 <= 21 for s in counts.steps)
        taus.append(counts.tau)
        drafted, accepted = drafted + counts.drafted, accepted + counts.accepted
    assert max(taus) > 1.3 and accepted < drafted


def test_bad_parameters(refs):
    eng, _ = refs
    with pytest.raises(HarnessError, match=r"^decoder.num_tokens must be an integer >= 1, got 0$"):
        PromptLookup(eng, num_tokens=0)
    with pytest.raises(HarnessError, match=r"^decoder.max_matching_ngram_size must be an integer >= 1"):
        PromptLookup(eng, max_matching_ngram_size=0)
    with pytest.raises(HarnessError, match=r"^decoder.num_tokens must be an integer >= 1, got True$"):
        PromptLookup(eng, num_tokens=True)


@pytest.mark.smollm
@needs_smollm
def test_smollm_mtbench_fast(smollm):
    """Two MT-Bench questions (turn 1), 32 tokens, HF's default PLD setting."""
    taus = mtbench_lossless(smollm, [("pld", lambda e: PromptLookup(e))], 2, 1, 32)
    assert max(taus) > 1.0


@pytest.mark.slow
@pytest.mark.smollm
@needs_smollm
def test_smollm_mtbench_full(smollm):
    """Every MT-Bench question, both turns, 256 new tokens."""
    taus = mtbench_lossless(smollm, [("pld", lambda e: PromptLookup(e))], None, 2, 256)
    assert sum(taus) / len(taus) > 1.0
