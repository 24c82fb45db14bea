"""Greedy and sampling verification of equal-length candidates (decoders/verify.py)."""

from __future__ import annotations

import random

import pytest
import torch
from lossless_check import chi_square_pvalue

from core.sampling import Sampler
from decoders import sampled_verify
from decoders.sampled_verify import CandidateCheck
from decoders.verify import (
    Verdict,
    candidate_slices,
    greedy_chain,
    greedy_verify,
    greedy_verify_flat,
    verify_logits,
)


def _t(rows: list[list[int]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.long).reshape(len(rows), -1 if rows else 0)


# --- greedy ---------------------------------------------------------------------------------------
def test_greedy_no_candidates_gives_the_root_prediction() -> None:
    v = greedy_verify(torch.empty(0, 3, dtype=torch.long), 7, torch.empty(0, 3, dtype=torch.long))
    assert v == Verdict(-1, 0, [7])
    assert v.flat_rows(0, 5, 3) == [0]


def test_greedy_rejects_everything_when_first_tokens_differ() -> None:
    v = greedy_verify(_t([[1, 2], [3, 4]]), 9, _t([[2, 5], [4, 6]]))
    assert v == Verdict(-1, 0, [9])


def test_greedy_longest_prefix_and_bonus() -> None:
    # root predicts 1. Candidate 0 = (1, 5, 6): after 1 the model predicts 2, not 5 -> 1 accepted.
    # Candidate 1 = (1, 2, 3): after 1 it predicts 2, after 2 it predicts 8 (not 3) -> 2 accepted + bonus 8.
    cands = _t([[1, 5, 6], [1, 2, 3]])
    preds = _t([[2, 0, 0], [2, 8, 4]])
    v = greedy_verify(cands, 1, preds)
    assert v == Verdict(1, 2, [1, 2, 8])
    assert v.flat_rows(0, 10, 3) == [0, 13, 14]
    assert v.commit_rows(0, [[10, 11, 12], [13, 14, 15]]) == [0, 13, 14]


def test_greedy_full_match_keeps_the_bonus_token() -> None:
    """Upstream LADE dropped the bonus token when a whole n-gram matched (anchors Sec. 2.3 step 6)."""
    v = greedy_verify(_t([[4, 5, 6]]), 4, _t([[5, 6, 7]]))
    assert v.tokens == [4, 5, 6, 7] and v.accepted == 3


def test_greedy_first_longest_wins_on_ties() -> None:
    v = greedy_verify(_t([[1, 2], [1, 3], [1, 2]]), 1, _t([[9, 0], [9, 0], [9, 0]]))
    assert v.candidate == 0 and v.tokens == [1, 9]


def test_greedy_matches_a_reference_walk_on_random_inputs() -> None:
    rng = random.Random(0)
    for _ in range(300):
        g, k, vocab = rng.randint(1, 5), rng.randint(1, 4), 3
        cands = [[rng.randrange(vocab) for _ in range(k)] for _ in range(g)]
        preds = [[rng.randrange(vocab) for _ in range(k)] for _ in range(g)]
        root = rng.randrange(vocab)
        best = [root]
        for c, p in zip(cands, preds):
            acc, prev = [], root
            for t in range(k):
                if c[t] != prev:
                    break
                acc.append(c[t])
                prev = p[t]
            if len(acc) + 1 > len(best):
                best = [*acc, prev]
        assert greedy_verify(_t(cands), root, _t(preds)).tokens == best


def test_greedy_verify_over_flat_rows_gives_greedy_verify_s_verdict() -> None:
    """The flat-layout walk reads only the rows of candidates the root's argmax agrees with; its verdict
    (candidate, accepted, tokens) is greedy_verify's over the sliced rows, ties and full matches included."""
    rng = random.Random(1)
    agreed = 0
    for _ in range(500):
        g, k, vocab, first = rng.randint(0, 6), rng.randint(1, 4), 3, rng.randint(1, 4)
        cands = [tuple(rng.randrange(vocab) for _ in range(k)) for _ in range(g)]
        picked = [rng.randrange(vocab) for _ in range(first + g * k + rng.randint(0, 3))]
        want = greedy_verify(cands, picked[0], candidate_slices(picked, first, g, k))
        assert greedy_verify_flat(cands, picked, first, k) == want
        agreed += want.accepted > 0
    assert agreed > 100  # the walk accepted tokens often, not only rejected everything


def test_verify_logits_uses_argmax_rows() -> None:
    logits = torch.full((5, 6), -1.0)
    for row, tok in enumerate([2, 3, 5, 1, 1]):  # root -> 2, after 2 -> 3, after 3 -> 5; candidate 1 -> 1, 1
        logits[row, tok] = 1.0
    v = verify_logits(logits, _t([[2, 3], [4, 4]]), first=1)
    assert v.tokens == [2, 3, 5] and v.flat_rows(0, 1, 2) == [0, 1, 2]


# --- sampling: the output distribution is exactly the autoregressive one --------------------------
def sample_verify(cands, root: torch.Tensor, cand_probs, sampler: Sampler) -> Verdict:
    """`CandidateCheck` over explicit distributions: row 0 the root's, row 1 + j*k + t that of
    candidate j's token t."""
    table = cands.tolist() if isinstance(cands, torch.Tensor) else cands
    k = len(table[0]) if table else 0
    rows = torch.stack([root] + [cand_probs(j, t) for j in range(len(table)) for t in range(k)])
    stage = lambda v: torch.tensor(list(v), dtype=torch.long)  # noqa: E731
    cpu = torch.device("cpu")
    return CandidateCheck(table, lambda j, t: 1 + j * k + t, lambda r: rows[r], sampler, stage, cpu).run()


VOCAB, K = 5, 2
CANDS = [[0, 1], [0, 2], [3, 3], [0, 1], [1, 4]]  # shared prefixes and a duplicate


def _dist(prefix: tuple[int, ...], temperature: float = 1.0) -> torch.Tensor:
    seed = 1000 + 31 * len(prefix) + sum((i + 1) * 7 * t for i, t in enumerate(prefix))
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(VOCAB, generator=g) * 1.2 / temperature, dim=-1)


def _exact_outcomes() -> dict[tuple[int, ...], float]:
    """Distribution of (accepted tokens + bonus) when the true process samples autoregressively:
    the longest sampled prefix inside the candidate trie (depth <= K) plus the next sampled token."""
    out: dict[tuple[int, ...], float] = {}

    def walk(prefix: tuple[int, ...], mass: float) -> None:
        depth = len(prefix)
        children = {c[depth] for c in CANDS if tuple(c[:depth]) == prefix} if depth < K else set()
        for y, py in enumerate(_dist(prefix).tolist()):
            if y in children:
                walk((*prefix, y), mass * py)
            else:
                out[(*prefix, y)] = out.get((*prefix, y), 0.0) + mass * py

    walk((), 1.0)
    return out


def _draw(n: int, root_temperature: float = 1.0) -> list[tuple[int, ...]]:
    sampler = Sampler(temperature=1.0, seed=123)
    cands = _t(CANDS)
    root = _dist((), root_temperature)
    rows = {(j, t): _dist(tuple(CANDS[j][: t + 1])) for j in range(len(CANDS)) for t in range(K)}
    return [tuple(sample_verify(cands, root, lambda j, t: rows[(j, t)], sampler).tokens) for _ in range(n)]


@pytest.fixture(params=[False, True], ids=["on-demand", "gathered"])
def gathered(request, monkeypatch) -> bool:
    """Both ways a check gets its values: computed as the walk reads them (a CPU's), gathered first (a
    GPU's)."""
    monkeypatch.setattr(sampled_verify, "GATHER_ON_CPU", request.param)
    return request.param


@pytest.mark.usefixtures("gathered")
def test_sampling_verification_reproduces_the_target_distribution() -> None:
    exact = _exact_outcomes()
    assert abs(sum(exact.values()) - 1) < 1e-6
    samples = _draw(12000)
    assert sum(len(s) > 1 for s in samples) > 2000  # acceptance really happens
    assert chi_square_pvalue(samples, exact) > 1e-3


@pytest.mark.usefixtures("gathered")
def test_chi_square_detects_a_slightly_wrong_distribution() -> None:
    """Negative control: the same test fails when the root distribution is tempered by 15 %."""
    assert chi_square_pvalue(_draw(12000, root_temperature=1.15), _exact_outcomes()) < 1e-3


@pytest.mark.usefixtures("gathered")
def test_sampling_with_no_candidates_samples_the_root() -> None:
    sampler = Sampler(temperature=1.0, seed=0)
    p = torch.tensor([0.0, 1.0, 0.0])
    v = sample_verify(torch.empty(0, 2, dtype=torch.long), p, lambda j, t: p, sampler)
    assert v == Verdict(-1, 0, [1])


@pytest.mark.usefixtures("gathered")
@pytest.mark.parametrize("mass", [1.0, 0.0])
def test_sampling_certain_and_impossible_tokens(mass: float) -> None:
    sampler = Sampler(temperature=1.0, seed=0)
    root = torch.tensor([mass, 1 - mass, 0.0])
    after = torch.tensor([0.0, 0.0, 1.0])
    v = sample_verify(_t([[0, 2]]), root, lambda j, t: after, sampler)
    if mass == 1.0:  # token 0 certain: accepted, then 2 certain: accepted, bonus from `after`
        assert v.tokens == [0, 2, 2] and v.accepted == 2
    else:  # token 0 impossible: rejected, bonus from the residual = token 1
        assert v.tokens == [1] and v.accepted == 0


@pytest.mark.parametrize(
    ("chain", "preds", "accepted", "tokens"),
    [
        ([5, 6, 7, 8], [6, 7, 9, 1], 2, [6, 7, 9]),  # d1, d2 match; d3 = 8 is not the argmax 9
        ([5, 6, 7], [6, 7, 3], 2, [6, 7, 3]),  # all accepted, then the bonus
        ([5, 6], [4, 2], 0, [4]),  # the first draft rejected: the correction alone
        ([5], [4], 0, [4]),  # no drafts: one token
    ],
)
def test_greedy_chain_reads_once_and_verifies_like_greedy_verify(chain, preds, accepted, tokens):
    drafts, verdict = greedy_chain(torch.tensor(chain), torch.tensor(preds))
    assert drafts == chain[1:]
    assert (verdict.accepted, verdict.tokens) == (accepted, tokens)
    k = len(chain) - 1
    ref = greedy_verify([chain[1:]] if k else [], preds[0], [preds[1:]] if k else [])
    assert (verdict.candidate, verdict.accepted, verdict.tokens) == (ref.candidate, ref.accepted, ref.tokens)
