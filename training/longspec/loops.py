"""Training sequences in which the text falls into a loop, as the 135M target's own greedy
continuations do (sources `essays_loops` and `random_loops` of `training.longspec.data`; ours, not the
paper's).

A draft that is to keep up with a looping target must copy: find the earlier occurrence of its token
in the target's cache and read what followed it. A few hundred of the target's own continuations,
passed over several times, can be learnt by heart instead; loop sequences ask for the copy on fresh
text each time: natural text cut at a sentence end, then the one or two sentences that follow it in
the text, repeated to the sequence's end. The labels come from the target as for any other sequence
(soft labels: the target's own confidence in the repeat).

Natural loops can still be guessed in part from the language alone. `random_loops` leaves nothing
but the copy: units of tokens drawn at random from a window of the text, each repeated a few times,
so that the target (whose induction heads copy them from the second time on) is confident where the
language says nothing.
"""

from __future__ import annotations

import random
from typing import Any

SENTENCE_ENDS = (".", "?", "!")
MAX_UNIT = 96  # longest repeated unit, tokens
MIN_UNIT = 4
RANDOM_UNIT = (8, 64)  # random loops: unit length range, tokens
RANDOM_REPEATS = (2, 8)  # random loops: times each unit is repeated


def sentence_end_ids(tokenizer: Any, ids: list[int]) -> set[int]:
    """The token ids among `ids` whose text ends a sentence (stripped of trailing spaces and quotes)."""
    out = set()
    for tok in set(ids):
        text = tokenizer.decode([tok]).rstrip().rstrip("\"')")
        if text.endswith(SENTENCE_ENDS):
            out.add(tok)
    return out


def loop_sequences(tokenizer: Any, ids: list[int], seq_len: int, seed: int) -> list[list[int]]:
    """One `seq_len`-token loop sequence per disjoint `seq_len` window of `ids`: the window's text up to
    a sentence end at a random point of its first half (at least `seq_len // 8` tokens), then the next
    one or two sentences repeated until `seq_len` tokens. Windows without such sentences give none."""
    ends = sentence_end_ids(tokenizer, ids)
    rng = random.Random(seed)
    out = []
    for start in range(0, len(ids) - seq_len + 1, seq_len):
        window = ids[start : start + seq_len]
        cut = _next_end(window, rng.randint(seq_len // 8, seq_len // 2), ends)
        if cut is None:
            continue
        unit_end = cut
        for _ in range(rng.choice((1, 1, 2))):
            nxt = _next_end(window, unit_end + 1, ends)
            unit_end = nxt if nxt is not None else unit_end
        unit = window[cut + 1 : unit_end + 1]
        if not MIN_UNIT <= len(unit) <= MAX_UNIT:
            continue
        seq = window[: cut + 1]
        while len(seq) < seq_len:
            seq += unit
        out.append(seq[:seq_len])
    return out


def _next_end(window: list[int], frm: int, ends: set[int]) -> int | None:
    """The index of the first sentence-ending token at or after `frm` (None: none)."""
    for i in range(frm, len(window)):
        if window[i] in ends:
            return i
    return None


def random_loop_sequences(ids: list[int], seq_len: int, seed: int, per_window: int = 1) -> list[list[int]]:
    """`per_window` `seq_len`-token sequences per disjoint `seq_len` window of `ids`: units of
    `RANDOM_UNIT` tokens drawn at random from the window, each repeated `RANDOM_REPEATS` times, one after
    another (each sequence draws its own units)."""
    rng = random.Random(seed)
    out = []
    for start in range(0, len(ids) - seq_len + 1, seq_len):
        window = ids[start : start + seq_len]
        for _ in range(per_window):
            seq: list[int] = []
            while len(seq) < seq_len:
                unit = rng.sample(window, min(rng.randint(*RANDOM_UNIT), seq_len))
                seq += unit * rng.randint(*RANDOM_REPEATS)
            out.append(seq[:seq_len])
    return out
