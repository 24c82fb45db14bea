"""Hybrid Tree Attention (core/tree_attention.py): attention over the cache and over the tree computed
apart and merged through their log-sum-exps equals one masked attention over [cache | tree], alone
(random inputs, GQA, random trees, an empty cache) and inside the engine's forward on the tiny models."""

from __future__ import annotations

import random

import pytest
import torch

from core.attention import MaskView
from core.engine import Engine
from core.tree_attention import BACKENDS, HybridTreeView, attention_lse

pytestmark = pytest.mark.usefixtures("one_thread")


def random_tree_mask(n: int, rng: random.Random) -> torch.Tensor:
    """Ancestor mask of a random tree over n nodes (node 0 the root, parents before children)."""
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        if i:
            mask[i] = mask[rng.randrange(i)]
        mask[i, i] = True
    return mask


def full_mask(tree: torch.Tensor, cache_len: int) -> torch.Tensor:
    n = tree.shape[0]
    return torch.cat([torch.ones(n, cache_len, dtype=torch.bool), tree], dim=1)


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (8, 2), (6, 1)])
@pytest.mark.parametrize("cache_len", [0, 1, 37, 300])
def test_hybrid_equals_masked_attention(heads, kv_heads, cache_len):
    rng = random.Random(heads * 1000 + cache_len)
    gen = torch.Generator().manual_seed(cache_len + kv_heads)
    for n in (1, 5, 23):
        tree = random_tree_mask(n, rng)
        d = 16
        q = torch.randn(1, heads, n, d, generator=gen) * 3  # large scores: the merge must be stable
        k = torch.randn(1, kv_heads, cache_len + n, d, generator=gen) * 3
        v = torch.randn(1, kv_heads, cache_len + n, d, generator=gen)
        scale = d**-0.5
        want = MaskView(full_mask(tree, cache_len), scale).attend(0, q, k, v)
        for backend in BACKENDS:  # the paper's split and the one-SDPA form compute the same attention
            got = HybridTreeView(tree, scale, backend).attend(0, q, k, v)
            assert got.shape == want.shape and got.dtype == q.dtype
            torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


def test_hybrid_casts_back_and_computes_in_fp32():
    gen = torch.Generator().manual_seed(0)
    tree = random_tree_mask(9, random.Random(0))
    q = torch.randn(1, 4, 9, 32, generator=gen)
    k = torch.randn(1, 2, 50 + 9, 32, generator=gen)
    v = torch.randn(1, 2, 50 + 9, 32, generator=gen)
    ref = MaskView(full_mask(tree, 50), 32**-0.5).attend(0, q.double(), k.double(), v.double())
    got = HybridTreeView(tree, 32**-0.5).attend(0, q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), ref, atol=3e-2, rtol=3e-2)


def test_lse_is_the_log_sum_exp_of_the_visible_scores():
    gen = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(4, 3, 8, generator=gen), torch.randn(2, 7, 8, generator=gen), torch.randn(2, 7, 8)
    mask = torch.rand(3, 7, generator=gen) > 0.4
    mask[:, 0] = True
    out, lse = attention_lse(q, k, v, 0.5, mask)
    for h in range(4):
        s = (q[h] @ k[h // 2].T) * 0.5
        s = s.masked_fill(~mask, float("-inf"))
        torch.testing.assert_close(lse[h], torch.logsumexp(s, -1))
        torch.testing.assert_close(out[h], torch.softmax(s, -1) @ v[h // 2])


def test_bad_tree_mask_is_refused():
    with pytest.raises(ValueError, match="see itself"):
        HybridTreeView(torch.zeros(3, 3, dtype=torch.bool), 1.0)
    with pytest.raises(ValueError, match="square"):
        HybridTreeView(torch.ones(3, 4, dtype=torch.bool), 1.0)


def test_engine_step_logits_equal_mask_view(tiny_lm):
    """One tree block through `Engine.step` over a cached prompt: the logits and the staged KV are the
    same with HybridTreeView as with MaskView over [cache | tree]."""
    eng = Engine(tiny_lm.model)
    rng = random.Random(3)
    for prompt_len, n in ((1, 1), (12, 9), (70, 31)):
        prompt = [rng.randrange(256) for _ in range(prompt_len)]
        tree = random_tree_mask(n, rng)
        tokens = torch.tensor([rng.randrange(256) for _ in range(n)])
        depth = tree.sum(dim=1) - 1
        positions = prompt_len + depth
        results = []
        for view in (HybridTreeView(tree, eng.scale), MaskView(full_mask(tree, prompt_len), eng.scale)):
            eng.reset(prompt_len + n)
            eng.prefill(prompt)
            logits = eng.step(tokens, positions, view)
            results.append((logits, eng.cache.k[:, :, : prompt_len + n].clone()))
        torch.testing.assert_close(results[0][0], results[1][0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(results[0][1], results[1][1], atol=1e-6, rtol=1e-5)
        assert HybridTreeView(tree, eng.scale).kv_read(prompt_len) == prompt_len


def test_a_one_node_tree_takes_the_decode_step_attention(monkeypatch):
    """The root alone (a LongSpec step whose draft was cut away) over a long CPU cache: the masked
    backend takes vanilla's one-row attention, equal to masked attention over [cache | root]."""
    from core import attention, tree_attention

    calls = []
    real = attention.one_row_attention
    monkeypatch.setattr(tree_attention, "one_row_attention", lambda *a: calls.append(1) or real(*a))
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 9, 1, 64, generator=gen)
    k = torch.randn(1, 3, 4097, 64, generator=gen)
    v = torch.randn(1, 3, 4097, 64, generator=gen)
    root = torch.ones(1, 1, dtype=torch.bool)
    want = MaskView(full_mask(root, 4096), 0.125).attend(0, q, k, v)
    got = HybridTreeView(root, 0.125, "masked").attend(0, q, k, v)
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)
    assert calls == [1]
