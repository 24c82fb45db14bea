"""FAFO's fumble streams (§4.2, Eq. 1) and the k-grams they hand to the n-gram pool (Alg. 2)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from decoders.ngram_pool import DeferredPairs, Gram, Pair


class FumbleStreams:
    """n sliding windows of k tokens, each with its last k discarded tokens, kept as ONE Python list of
    columns in the block's order (App. E: token r of every stream, then token r + 1): the held discarded
    columns (up to k), then the window's k columns. The block's stream rows are the list's tail, and a
    step's advance appends the new column (dropping the oldest once k columns are discarded), so the
    host makes no per-stream list or tuple before the next forward."""

    def __init__(self, init: torch.Tensor | Sequence[Sequence[int]]) -> None:
        rows = init.tolist() if isinstance(init, torch.Tensor) else [list(r) for r in init]
        self.n = len(rows)
        self.k = len(rows[0]) if rows else 0
        self.cols: list[int] = [w[r] for r in range(self.k) for w in rows]

    def flat_columns(self) -> list[int]:
        """The windows column-wise: token r of every stream, then token r + 1, ... (App. E)."""
        return self.cols[len(self.cols) - self.k * self.n :]

    def advance(self, new_tokens: Sequence[int] | torch.Tensor) -> StreamGrams:
        """Append each stream's new token (Python ints, or a tensor), drop its oldest; the streams'
        (discard buffer, new k-gram) pairs, made when read."""
        new = new_tokens.tolist() if isinstance(new_tokens, torch.Tensor) else list(new_tokens)
        if len(new) != self.n:
            raise ValueError(f"{len(new)} new tokens for {self.n} streams")
        cols = self.cols
        if len(cols) >= 2 * self.k * self.n:  # k discarded columns held: the oldest goes
            cols = cols[self.n :]
        self.cols = cols + new  # a new list: the pairs handed out read the old one
        return StreamGrams(self.cols, self.n, self.k)


class StreamGrams(DeferredPairs):
    """One advance's pair of every stream, in stream order: its discard buffer (its last k discarded
    tokens, oldest first) and its new k-gram. The tuples are made from the column list only when read: a
    lookup reads the streams whose last discarded token ends its context, the pool's flush all of them
    (while the device runs the next forward)."""

    def __init__(self, cols: list[int], n: int, k: int) -> None:
        self.cols, self.n, self.window = cols, n, len(cols) - k * n

    def pair(self, i: int) -> tuple[Gram, Gram]:
        c, n, w = self.cols, self.n, self.window
        return tuple(c[i:w:n]), tuple(c[w + i :: n])

    def pairs(self) -> list[Pair]:
        return [self.pair(i) for i in range(self.n)]

    def ending_with(self, token: int) -> list[Pair]:
        last = self.cols[self.window - self.n : self.window]  # every stream's last discarded token
        return [self.pair(i) for i, t in enumerate(last) if t == token]
