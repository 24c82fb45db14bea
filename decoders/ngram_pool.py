"""An n-gram candidate pool with per-key LRU eviction and longest-suffix-first retrieval.

The pool maps a *key* (a tuple of 1..`max_key_len` tokens) to at most `capacity` continuations
(tuples of tokens), most recently used last. Inserting a continuation that is already stored under
the key refreshes it (moves it to the most-recent end); inserting a new one beyond `capacity`
evicts the least recently used.

- Lookahead Decoding (Fu et al. 2024, Sec. 3.1 "n-gram pool"; LADE's `token_map`): keys are single
  tokens, continuations are (N-1)-grams, `capacity` = G guesses per key.
- FAFO (App. F / Alg. 2-3): keys are the 1..k most recent discarded tokens of a fumble stream,
  continuations are k-grams, `capacity` = n entries per key; retrieval backs off from the longest
  matching suffix of the decoded sequence to shorter ones until enough candidates are found.

Deferred insertion (`defer`, then `flush`): a decoder that learns its new n-grams from a step's forward
can hand them over at once and have them stored later, while the device runs the next forward, so that
the host's dictionary work does not keep the device waiting. Deferred n-grams are already visible to
`lookup` and `get`, exactly as if they had been stored: a key's entries are its `capacity` most recently
inserted distinct continuations, so the deferred ones that match a key go first and the stored ones
follow. A decoder may defer a `DeferredPairs` that makes its pairs only when they are read: a lookup
reads only the pairs whose context ends with its own last token, the flush all of them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

Gram = tuple[int, ...]
Pair = tuple[Gram, Gram]  # (context, value)


class DeferredPairs:
    """(context, value) pairs handed to `NGramPool.defer`, in insertion order."""

    def __init__(self, pairs: Iterable[Pair]) -> None:
        self._pairs = list(pairs)

    def pairs(self) -> list[Pair]:
        """Every pair, in order."""
        return self._pairs

    def ending_with(self, token: int) -> list[Pair]:
        """The pairs whose (non-empty) context ends with `token`, in order."""
        return [(ctx, v) for ctx, v in self._pairs if ctx and ctx[-1] == token]


class NGramPool:
    """Per-key LRU store of token continuations."""

    def __init__(self, capacity: int, max_key_len: int = 1) -> None:
        if capacity <= 0:
            raise ValueError(f"pool capacity per key must be positive, got {capacity}")
        if max_key_len <= 0:
            raise ValueError(f"max_key_len must be positive, got {max_key_len}")
        self.capacity = capacity
        self.max_key_len = max_key_len
        # a plain dict per key keeps insertion order, least recently used first (cheaper than OrderedDict)
        self._store: dict[Gram, dict[Gram, None]] = {}
        self._pending: list[DeferredPairs] = []  # deferred (context, value) pairs, stored under every suffix

    def __len__(self) -> int:
        """Number of keys holding at least one continuation."""
        self.flush()
        return len(self._store)

    def n_entries(self) -> int:
        self.flush()
        return sum(len(v) for v in self._store.values())

    def clear(self) -> None:
        self._store.clear()
        self._pending.clear()

    # --- insertion -------------------------------------------------------------------------------
    def add(self, key: Iterable[int], value: Iterable[int]) -> None:
        """Store `value` under `key` as the most recently used entry (LRU eviction beyond capacity)."""
        k = tuple(key)
        if not 0 < len(k) <= self.max_key_len:
            raise ValueError(f"key length {len(k)} outside 1..{self.max_key_len}")
        self.flush()
        self._put_many(((k, tuple(value)),))

    def _put_many(self, items: Iterable[Pair]) -> None:
        """`(key, value)` insertions in order, each as its key's most recent entry (a loop the host runs
        n * k times a step for FAFO, so the store and capacity are read once)."""
        store, capacity = self._store, self.capacity
        for key, value in items:
            entries = store.get(key)
            if entries is None:
                store[key] = {value: None}
                continue
            entries.pop(value, None)  # re-inserted below as the most recent
            entries[value] = None
            if len(entries) > capacity:
                del entries[next(iter(entries))]

    def add_suffix_keys(self, context: Sequence[int], value: Iterable[int]) -> None:
        """Store `value` under every suffix of `context` of length 1..max_key_len (FAFO's Alg. 2)."""
        self.add_under_suffixes([(tuple(context), tuple(value))])

    def add_under_suffixes(self, pairs: DeferredPairs | Iterable[Pair]) -> None:
        """`add_suffix_keys` for many `(context, value)` tuples, in order (every fumble stream of a step in
        one call; the suffixes are valid keys by construction, so `add`'s check is skipped)."""
        self.flush()  # deferred pairs were inserted first
        self._put_suffixes(pairs.pairs() if isinstance(pairs, DeferredPairs) else pairs)

    def _put_suffixes(self, pairs: Iterable[Pair]) -> None:
        """Each pair under its context's suffixes, in order. A pair repeated later in `pairs` is stored at
        its last occurrence only: a key holds the `capacity` values inserted most recently, in that order,
        so an insertion repeated later changes nothing (FAFO's streams often yield the same pair)."""
        most = self.max_key_len
        last = dict.fromkeys(reversed(pairs if isinstance(pairs, list) else list(pairs)))
        if most == 1:  # single-token keys (Lookahead's): each pair under its context's last token
            self._put_many((ctx[-1:], v) for ctx, v in reversed(last) if ctx)  # a 1-tuple's slice is itself
            return
        self._put_many(
            (ctx[len(ctx) - m :], v) for ctx, v in reversed(last) for m in range(1, min(most, len(ctx)) + 1)
        )

    def add_sequence(self, tokens: Sequence[int], gram_len: int, start: int = 0) -> None:
        """Insert every n-gram of `tokens` keyed by the token(s) just before it.

        Each position i >= max(start, 1) with a full continuation `tokens[i:i+gram_len]` is stored
        under the keys `tokens[i-m:i]`, m = 1..max_key_len (only m <= i). Used to seed the pool from
        the prompt (LADE's POOL_FROM_PROMPT) and to add n-grams of newly generated text.
        """
        for i in range(max(start, 1), len(tokens) - gram_len + 1):
            value = tuple(tokens[i : i + gram_len])
            for m in range(1, min(self.max_key_len, i) + 1):
                self.add(tokens[i - m : i], value)

    def defer(self, pairs: DeferredPairs | Iterable[Pair]) -> None:
        """`add_under_suffixes(pairs)` later: at the next `flush` or insertion. Lookups see them now."""
        self._pending.append(pairs if isinstance(pairs, DeferredPairs) else DeferredPairs(pairs))

    def flush(self) -> None:
        """Store the deferred pairs (a decoder calls this while the device runs its next forward)."""
        if self._pending:
            pending, self._pending = self._pending, []
            self._put_suffixes([pair for batch in pending for pair in batch.pairs()])

    # --- retrieval -------------------------------------------------------------------------------
    def get(self, key: Iterable[int]) -> list[Gram]:
        """Continuations stored under `key`, most recently used first (deferred ones included, as if
        stored)."""
        key = tuple(key)
        return self._entries(key, self._shared_suffixes(key)) if self._pending else self._stored(key)

    def _stored(self, key: Gram) -> list[Gram]:
        entries = self._store.get(key)
        return list(reversed(entries)) if entries else []

    def _entries(self, key: Gram, deferred: list[tuple[int, Gram]]) -> list[Gram]:
        """`key`'s continuations, most recently used first, as if the deferred pairs were stored:
        `deferred` holds (length of the suffix the pair's context shares with the lookup's, value)."""
        newer = [v for shared, v in reversed(deferred) if shared >= len(key)]
        if not newer:
            return self._stored(key)
        first = list(dict.fromkeys(newer))  # the latest insertion of each value first
        taken = set(first)
        return (first + [v for v in self._stored(key) if v not in taken])[: self.capacity]

    def _shared_suffixes(self, context: Sequence[int]) -> list[tuple[int, Gram]]:
        """Each deferred pair whose context ends like `context`: (common suffix length, capped at the
        longest key, value), in insertion order."""
        if not self._pending or not context:
            return []
        last, most = context[-1], min(self.max_key_len, len(context))
        out = []
        for ctx, v in (pair for batch in self._pending for pair in batch.ending_with(last)):
            cap, m = min(most, len(ctx)), 1
            while m < cap and ctx[-1 - m] == context[-1 - m]:
                m += 1
            out.append((m, v))
        return out

    def lookup(self, context: Sequence[int], limit: int) -> list[Gram]:
        """Up to `limit` distinct continuations, longest matching suffix of `context` first.

        For m = min(max_key_len, len(context)) down to 1, the entries under `context[-m:]` are
        taken most recently used first, skipping continuations already taken.
        """
        taken: dict[Gram, None] = {}  # a dict keeps the first insertion of each value, in order
        deferred = self._shared_suffixes(context)
        for m in range(min(self.max_key_len, len(context)), 0, -1):
            if len(taken) >= limit:
                break
            taken.update(dict.fromkeys(self._entries(tuple(context[len(context) - m :]), deferred)))
        return list(taken)[: max(limit, 0)]
