"""Loop training sequences: `essays_loops` (natural text up to a sentence end, then a repeated unit)
and `random_loops` (units of random tokens from the text, each repeated)."""

from __future__ import annotations

from training.longspec.loops import (
    MAX_UNIT,
    MIN_UNIT,
    RANDOM_REPEATS,
    RANDOM_UNIT,
    loop_sequences,
    random_loop_sequences,
)

SENTENCE_END_IDS = (50, 51)


class WordTokenizer:
    """Token id i is the i-th word of a fixed vocabulary."""

    def __init__(self, words: list[str]) -> None:
        self.words = words

    def decode(self, ids: list[int]) -> str:
        return "".join(self.words[i] for i in ids)


def text_ids(n_sentences: int, seed: int = 0) -> tuple[WordTokenizer, list[int]]:
    import random

    words = [f" w{i}" for i in range(50)] + [".", "?"]
    rng = random.Random(seed)
    ids: list[int] = []
    for _ in range(n_sentences):
        ids += [rng.randrange(50) for _ in range(rng.randint(3, 12))] + [50 + rng.randrange(2)]
    return WordTokenizer(words), ids


def is_loop_of(seq: list[int], window: list[int], start: int, unit: int) -> bool:
    """`seq` is `window` up to `start`, then `window[start:start + unit]` (one or two whole sentences)
    repeated."""
    ends = [i for i in range(start, min(start + unit, len(window))) if window[i] in SENTENCE_END_IDS]
    return (
        start + unit <= len(window)
        and seq[: start + unit] == window[: start + unit]
        and 1 <= len(ends) <= 2
        and ends[-1] == start + unit - 1
        and all(seq[i] == seq[i - unit] for i in range(start + unit, len(seq)))
    )


def test_each_window_becomes_its_text_then_a_loop_of_its_next_sentences():
    tok, ids = text_ids(400)
    seq_len = 128
    seqs = loop_sequences(tok, ids, seq_len, seed=3)
    assert len(seqs) >= len(ids) // seq_len - 1
    for seq in seqs:
        assert len(seq) == seq_len
        start = next(i for i in range(0, len(ids), seq_len) if ids[i : i + 8] == seq[:8])
        window = ids[start : start + seq_len]
        cuts = [i + 1 for i in range(seq_len // 8, seq_len // 2 + 13) if window[i] in SENTENCE_END_IDS]
        assert any(is_loop_of(seq, window, c, u) for c in cuts for u in range(MIN_UNIT, MAX_UNIT + 1))
    assert len({tuple(s[-40:]) for s in seqs}) == len(seqs)  # a different loop per window


def test_the_same_seed_gives_the_same_sequences_and_text_without_sentences_gives_none():
    tok, ids = text_ids(200)
    assert loop_sequences(tok, ids, 64, 1) == loop_sequences(tok, ids, 64, 1)
    assert loop_sequences(tok, ids, 64, 1) != loop_sequences(tok, ids, 64, 2)
    assert loop_sequences(tok, [0, 1, 2] * 100, 64, 1) == []


def runs_of(seq: list[int]) -> list[tuple[int, int]]:
    """`seq` (its units' tokens all distinct) read back as (unit length, times repeated) runs; the last
    run may be cut short by the sequence's end."""
    out, i = [], 0
    while i < len(seq):
        size = next((j - i for j in range(i + 1, len(seq)) if seq[j] == seq[i]), len(seq) - i)
        unit, times = seq[i : i + size], 1
        while (nxt := seq[i + times * size : i + (times + 1) * size]) and nxt == unit[: len(nxt)]:
            times += 1  # the sequence's end may cut the last repeat short
        out.append((size, times))
        i += times * size
    return out


def test_random_loops_repeat_units_drawn_from_their_own_window():
    ids = list(range(2048))  # distinct tokens: each unit's length is the distance to its repeat
    seq_len = 256
    seqs = random_loop_sequences(ids, seq_len, seed=5)
    assert len(seqs) == len(ids) // seq_len
    for n, seq in enumerate(seqs):
        assert len(seq) == seq_len
        assert set(seq) <= set(ids[n * seq_len : (n + 1) * seq_len])
        runs = runs_of(seq)
        for k, (size, times) in enumerate(runs):
            last = k == len(runs) - 1  # it may be cut short by the sequence's end
            assert RANDOM_UNIT[0] <= size <= RANDOM_UNIT[1] or last
            assert times <= RANDOM_REPEATS[1] and (times >= RANDOM_REPEATS[0] or last)
    assert max(len(runs_of(seq)) for seq in seqs) >= 3
    assert random_loop_sequences(ids, seq_len, 5) == seqs
    assert random_loop_sequences(ids, seq_len, 6) != seqs


def test_random_loops_per_window_draws_that_many_sequences_of_their_own_units():
    ids = list(range(1024))
    one = random_loop_sequences(ids, 256, seed=5)
    three = random_loop_sequences(ids, 256, seed=5, per_window=3)
    assert len(three) == 3 * len(one) and three[0] == one[0]  # the first of each window is drawn first
    for n in range(len(one)):
        window = set(ids[n * 256 : (n + 1) * 256])
        group = three[3 * n : 3 * n + 3]
        assert all(set(seq) <= window for seq in group) and len({tuple(seq) for seq in group}) == 3
