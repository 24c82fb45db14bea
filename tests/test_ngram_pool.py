"""The n-gram pool (decoders/ngram_pool.py): per-key LRU, back-off retrieval."""

from __future__ import annotations

import pytest

from decoders.ngram_pool import NGramPool


def test_lru_eviction_and_refresh() -> None:
    pool = NGramPool(capacity=2)
    pool.add((1,), (10, 11))
    pool.add((1,), (20, 21))
    assert pool.get((1,)) == [(20, 21), (10, 11)]  # most recently used first
    pool.add((1,), (10, 11))  # refresh: now most recent
    pool.add((1,), (30, 31))  # evicts the least recently used, (20, 21)
    assert pool.get((1,)) == [(30, 31), (10, 11)]
    assert pool.n_entries() == 2 and len(pool) == 1
    assert pool.get((2,)) == []


def test_key_length_is_checked() -> None:
    pool = NGramPool(capacity=1, max_key_len=2)
    with pytest.raises(ValueError):
        pool.add((1, 2, 3), (4,))
    with pytest.raises(ValueError):
        pool.add((), (4,))
    with pytest.raises(ValueError):
        NGramPool(capacity=0)


def test_lookup_backs_off_longest_suffix_first_without_duplicates() -> None:
    pool = NGramPool(capacity=3, max_key_len=3)
    pool.add((7,), (1, 1))
    pool.add((7,), (2, 2))
    pool.add((5, 7), (3, 3))
    pool.add((5, 7), (2, 2))
    pool.add((4, 5, 7), (9, 9))
    pool.add((6, 5, 7), (8, 8))  # different 3-token key: not retrieved for context ending 4 5 7
    assert pool.lookup([0, 4, 5, 7], limit=10) == [(9, 9), (2, 2), (3, 3), (1, 1)]
    assert pool.lookup([0, 4, 5, 7], limit=2) == [(9, 9), (2, 2)]
    assert pool.lookup([7], limit=10) == [(2, 2), (1, 1)]  # short context: only the 1-token key
    assert pool.lookup([3], limit=10) == []


def test_add_suffix_keys_stores_under_every_suffix() -> None:
    pool = NGramPool(capacity=4, max_key_len=3)
    pool.add_suffix_keys([1, 2, 3, 4], (8, 9))
    assert pool.get((4,)) == pool.get((3, 4)) == pool.get((2, 3, 4)) == [(8, 9)]
    assert pool.get((1, 2, 3, 4)) == [] and pool.n_entries() == 3


def test_add_sequence_keys_each_gram_by_its_predecessors() -> None:
    pool = NGramPool(capacity=8, max_key_len=2)
    pool.add_sequence([1, 2, 3, 4, 5], gram_len=2)
    assert pool.get((1,)) == [(2, 3)]
    assert pool.get((1, 2)) == [(3, 4)] and pool.get((2,)) == [(3, 4)]
    assert pool.get((3, 4)) == [] and pool.get((4,)) == []  # no full 2-gram after 4
    pool2 = NGramPool(capacity=8)
    pool2.add_sequence([1, 2, 3, 4, 5], gram_len=2, start=3)  # only grams starting at index >= 3
    assert pool2.get((3,)) == [(4, 5)] and pool2.n_entries() == 1


def test_add_under_suffixes_equals_add_suffix_keys_in_order() -> None:
    """The batched insertion (every fumble stream of a step in one call) leaves the pool exactly as one
    `add_suffix_keys` per pair would, LRU order and evictions included."""
    import random

    rng = random.Random(0)
    pairs = [
        (tuple(rng.randrange(4) for _ in range(rng.randint(1, 4))), tuple(rng.randrange(3) for _ in range(2)))
        for _ in range(200)
    ]
    one, many = NGramPool(capacity=3, max_key_len=3), NGramPool(capacity=3, max_key_len=3)
    for ctx, value in pairs:
        one.add_suffix_keys(ctx, value)
    many.add_under_suffixes(iter(pairs))
    assert many._store == one._store
    assert all(list(many._store[key]) == list(one._store[key]) for key in one._store)  # LRU order
    assert max(len(v) for v in one._store.values()) == 3  # evictions happened


def backed_off(pool: NGramPool, context: list[int], limit: int) -> list[tuple[int, ...]]:
    """`lookup` by its definition: each suffix's entries (`get`), longest suffix first, no repeats."""
    out: list[tuple[int, ...]] = []
    for m in range(min(pool.max_key_len, len(context)), 0, -1):
        out += [v for v in pool.get(context[len(context) - m :]) if v not in out]
    return out[:limit]


def test_deferred_pairs_are_looked_up_as_if_stored() -> None:
    """`defer` then `flush` (FAFO and Lookahead store a step's n-grams while the device runs the next
    forward): every lookup and get in between returns what it would after storing them at once, LRU
    order and evictions included, and the flushed pool equals the one that stored them at once."""
    import random

    rng = random.Random(1)
    now, later = NGramPool(capacity=3, max_key_len=3), NGramPool(capacity=3, max_key_len=3)
    for _ in range(300):
        pairs = [
            (
                tuple(rng.randrange(4) for _ in range(rng.randint(0, 4))),
                tuple(rng.randrange(3) for _ in range(2)),
            )
            for _ in range(rng.randint(0, 6))
        ]
        now.add_under_suffixes(pairs)
        later.defer(pairs)
        for _ in range(3):
            context = [rng.randrange(4) for _ in range(rng.randint(0, 5))]
            limit = rng.randint(1, 8)
            found = later.lookup(context, limit)
            assert found == now.lookup(context, limit) == backed_off(now, context, limit)
            assert later.get(context[-3:]) == now.get(context[-3:])
        assert later._pending or not pairs
        if rng.random() < 0.5:
            later.flush()
            assert not later._pending
    later.flush()
    assert later._store == now._store
    assert all(list(later._store[key]) == list(now._store[key]) for key in now._store)  # LRU order
    assert max(len(v) for v in now._store.values()) == 3  # evictions happened


def test_insertions_and_reads_store_the_deferred_pairs_first() -> None:
    pool = NGramPool(capacity=2, max_key_len=2)
    pool.defer([((1, 2), (5,))])
    pool.add((2,), (6,))  # stored after the deferred pair: the most recent under (2,)
    assert pool.get((2,)) == [(6,), (5,)] and pool.get((1, 2)) == [(5,)]
    pool.defer([((2,), (7,))])
    assert len(pool) == 2 and pool.n_entries() == 3 and pool.get((2,)) == [(7,), (6,)]
