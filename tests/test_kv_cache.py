"""The one KV cache: what `commit` keeps, whatever rows a decoder keeps."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.kv_cache import KVCache


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_commit_keeps_exactly_the_chosen_rows_in_any_order(data):
    """Whatever rows are kept (increasing runs, overlapping moves, any order), the committed slots hold
    the staged rows' K, V and positions in the order given, and the earlier entries are untouched."""
    cache = KVCache(2, 3, 4, torch.float32, torch.device("cpu"))
    cache.reset(40)
    length = data.draw(st.integers(0, 10), label="cached")
    staged = data.draw(st.integers(1, 12), label="staged")
    cache.length = length
    cache.k.normal_()
    cache.v.normal_()
    cache.slot_pos.copy_(torch.randperm(40))
    before = (cache.k.clone(), cache.v.clone(), cache.slot_pos.clone())
    cache.staged = staged
    ordered = data.draw(st.booleans(), label="increasing")
    rows = data.draw(st.lists(st.integers(0, staged - 1), unique=True, max_size=staged), label="rows")
    rows = sorted(rows) if ordered else rows
    cache.commit(rows)
    assert cache.length == length + len(rows) and cache.staged == 0
    src = torch.tensor([length + r for r in rows], dtype=torch.long)
    new = slice(length, length + len(rows))
    for now, then in zip((cache.k, cache.v), before[:2], strict=True):
        assert torch.equal(now[:, :, :length], then[:, :, :length])
        assert torch.equal(now[:, :, new], then[:, :, src])
    assert torch.equal(cache.slot_pos[:length], before[2][:length])
    assert torch.equal(cache.slot_pos[new], before[2][src])


def test_commit_refuses_rows_outside_the_staged_block():
    cache = KVCache(1, 1, 2, torch.float32, torch.device("cpu"))
    cache.reset(8)
    cache.staged = 3
    with pytest.raises(IndexError):
        cache.commit([0, 3])


def test_commit_of_the_first_rows_keeps_them_in_place():
    """A chain's root and accepted prefix are the block's first rows: they become the next entries as
    staged, and the rows after them are dropped."""
    cache = KVCache(2, 2, 4, torch.float32, torch.device("cpu"))
    cache.reset(16)
    cache.k.normal_()
    cache.v.normal_()
    cache.slot_pos.copy_(torch.arange(16))
    before = (cache.k.clone(), cache.v.clone())
    cache.length, cache.staged = 5, 4
    cache.commit([0, 1, 2])
    assert cache.length == 8 and cache.staged == 0
    assert torch.equal(cache.k, before[0]) and torch.equal(cache.v, before[1])
    assert cache.slot_pos[:8].tolist() == list(range(8))
