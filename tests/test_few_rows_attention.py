"""`core.attention.few_rows_attention`: the CPU float32 path for a small verification block over a long
cache equals masked SDPA, and the views route to it only where it applies."""

from __future__ import annotations

import pytest
import torch

from core.attention import (
    FEW_ROWS_MAX,
    SPLIT_MIN_KEYS,
    CausalView,
    causal_block_mask,
    few_rows_applies,
    few_rows_attention,
    sdpa,
)
from core.tree_attention import HybridTreeView


def _tree_mask(parents: list[int]) -> torch.Tensor:
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(parents):
        if p >= 0:
            mask[i] = mask[p]
        mask[i, i] = True
    return mask


def _full_mask(block: torch.Tensor, cache_len: int) -> torch.Tensor:
    n = block.shape[0]
    mask = torch.ones(n, cache_len + n, dtype=torch.bool)
    mask[:, cache_len:] = block
    return mask


@pytest.mark.parametrize("heads", [(9, 3), (4, 4), (8, 2)])
@pytest.mark.parametrize("cache_len", [SPLIT_MIN_KEYS, 3001])
def test_few_rows_equals_masked_sdpa_for_chains_and_trees(heads, cache_len):
    h, hkv = heads
    torch.manual_seed(cache_len + h)
    blocks = {
        "chain": torch.ones(5, 5, dtype=torch.bool).tril(),
        "tree": _tree_mask([-1, 0, 0, 1, 1, 2, 3, 3, 5]),  # the root, two children, grandchildren
        "one row per head, widest": _tree_mask([-1] + [0] * (FEW_ROWS_MAX - 1)),
    }
    for name, block in blocks.items():
        n = block.shape[0]
        q = torch.randn(1, h, n, 64)
        k, v = torch.randn(1, hkv, cache_len + n, 64), torch.randn(1, hkv, cache_len + n, 64)
        assert few_rows_applies(q, k), name
        out = few_rows_attention(q, k, v, block, 0.125)
        ref = sdpa(q, k, v, _full_mask(block, cache_len), 0.125)
        torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5, msg=name)


def test_few_rows_applies_only_to_small_float32_cpu_blocks_over_a_long_cache():
    k = torch.randn(1, 3, SPLIT_MIN_KEYS + 5, 16)
    assert few_rows_applies(torch.randn(1, 9, 5, 16), k)
    assert not few_rows_applies(torch.randn(1, 9, 1, 16), k)  # one row: decode_attention's case
    assert not few_rows_applies(torch.randn(1, 9, FEW_ROWS_MAX + 1, 16), torch.randn(1, 3, 9000, 16))
    assert not few_rows_applies(torch.randn(1, 9, 6, 16), k)  # the cache is SPLIT_MIN_KEYS - 1 long
    assert not few_rows_applies(torch.randn(1, 9, 5, 16).bfloat16(), k.bfloat16())


def test_views_route_small_blocks_over_long_caches_and_keep_their_function():
    """CausalView and HybridTreeView's masked backend give SDPA's answer whichever path serves them."""
    torch.manual_seed(0)
    for cache_len in (64, SPLIT_MIN_KEYS + 3):
        n = 6
        q = torch.randn(1, 9, n, 32)
        k, v = torch.randn(1, 3, cache_len + n, 32), torch.randn(1, 3, cache_len + n, 32)
        causal = CausalView(0.2).attend(0, q, k, v)
        torch.testing.assert_close(causal, sdpa(q, k, v, causal_block_mask(n, cache_len), 0.2))
        block = _tree_mask([-1, 0, 0, 1, 2, 2])
        tree = HybridTreeView(block, 0.2, "masked").attend(0, q, k, v)
        torch.testing.assert_close(tree, sdpa(q, k, v, _full_mask(block, cache_len), 0.2))
        hybrid = HybridTreeView(block, 0.2, "hybrid").attend(0, q, k, v)
        torch.testing.assert_close(tree, hybrid, atol=1e-5, rtol=1e-5)


def test_views_take_the_few_rows_path_only_over_a_long_cache(monkeypatch):
    import core.attention
    import core.tree_attention

    calls = []

    def counted(*args):
        calls.append(args[0].shape[2])
        return few_rows_attention(*args)

    monkeypatch.setattr(core.attention, "few_rows_attention", counted)
    monkeypatch.setattr(core.tree_attention, "few_rows_attention", counted)
    block = _tree_mask([-1, 0, 1])
    for cache_len, expected in ((100, []), (SPLIT_MIN_KEYS, [3, 3])):
        calls.clear()
        q = torch.randn(1, 4, 3, 8)
        k, v = torch.randn(1, 2, cache_len + 3, 8), torch.randn(1, 2, cache_len + 3, 8)
        CausalView(0.3).attend(0, q, k, v)
        HybridTreeView(block, 0.3, "masked").attend(0, q, k, v)
        assert calls == expected


def test_benchmark_switch_turns_the_path_off_and_back_on():
    from benchmarks.bench_block_cost import few_rows_path_off

    q, k = torch.randn(1, 9, 5, 16), torch.randn(1, 3, SPLIT_MIN_KEYS + 5, 16)
    with few_rows_path_off():
        assert not few_rows_applies(q, k)
    assert few_rows_applies(q, k)
