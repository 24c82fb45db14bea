"""Every sparse path equals the dense masked reference (SDPA with an explicit boolean mask).

Tolerances: fp32 max abs error <= 1e-5 on unit-scale random inputs; bf16 (compiled flex) <= 3e-2.
Shapes: MHA and GQA, 1..40 query rows, restricted / unrestricted / mixed rows, arbitrary block
visibility, per-head region lengths, KV lengths that are not multiples of the 128 block.
Tests that need a compile of their own are `slow`; the fast set compiles the flex kernel for one
fp32 head layout (about 15-40 s cold on 2 cores, seconds with a warm inductor cache).
Eager flex only applies the mask_mod (it ignores the block table), so the block table is checked
separately against the element mask, and the compiled kernel (which skips unlisted blocks) is run on a
few shapes.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from core.attention import CausalView
from core.compressed_region import CompressedRegion
from core.engine import Engine
from core.policy_views import draft_view, restricted_view
from core.sparse_attention import (
    KV_BLOCK,
    RegionBlockMask,
    attention_with_lse,
    flash_region_attend,
    merge_lse,
    sliced_attend,
)
from core.types import Counts, HarnessError
from decoders.vanilla import Vanilla
from kv_policies.layer_selection import LayerSelectionView
from kv_policies.registry import build_policy
from kv_policies.shared_selection import SelectionView
from kv_policies.view import RestrictedView


def case(
    seed: int,
    h: int,
    hkv: int,
    d: int,
    n: int,
    cache_len: int,
    kv_len: int,
    mixed: bool,
    dtype: torch.dtype = torch.float32,
):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, h, n, d, generator=g).to(dtype)
    k = torch.randn(1, hkv, kv_len, d, generator=g).to(dtype)
    v = torch.randn(1, hkv, kv_len, d, generator=g).to(dtype)
    region_len = torch.randint(1, min(cache_len, 300) + 1, (hkv,), generator=g)
    restricted = torch.rand(n, generator=g) < 0.5 if mixed else torch.ones(n, dtype=torch.bool)
    block_vis = (torch.rand(n, n, generator=g) < 0.5) | torch.eye(n, dtype=torch.bool)
    return q, k, v, region_len, restricted, block_vis


def reference(q, k, v, cache_len, region_len, restricted, block_vis, scale):
    h, n, hkv = q.shape[1], q.shape[2], k.shape[1]
    mask = torch.zeros(h, n, cache_len + n, dtype=torch.bool)
    for head in range(h):
        for r in range(n):
            mask[head, r, : region_len[head // (h // hkv)] if restricted[r] else cache_len] = True
    mask[:, :, cache_len:] = block_vis
    kk, vv = k[:, :, : cache_len + n].float(), v[:, :, : cache_len + n].float()
    return F.scaled_dot_product_attention(
        q.float(), kk, vv, attn_mask=mask[None], scale=scale, enable_gqa=h != hkv
    ), mask


SHAPES = [  # h, hkv, d, n, cache_len, kv_len, mixed
    (4, 4, 16, 1, 300, 400, False),
    (4, 2, 16, 1, 700, 701, False),
    (6, 2, 8, 5, 129, 200, False),
    (4, 2, 16, 7, 513, 777, True),
    (2, 1, 32, 40, 1000, 1100, True),
    (8, 2, 16, 3, 64, 300, True),
    (4, 1, 8, 16, 256, 272, False),
    (3, 3, 8, 2, 1, 10, False),
]


@pytest.mark.parametrize("shape", SHAPES)
def test_block_table_covers_exactly_the_visible_blocks(shape):
    h, hkv, d, n, cache_len, kv_len, mixed = shape
    for seed in range(4):
        q, k, v, region_len, restricted, block_vis = case(seed, *shape)
        m = RegionBlockMask(n, kv_len, h, hkv, restricted, block_vis, q_block=None if seed % 2 else 4)
        m.update(cache_len, region_len)
        _, mask = reference(q, k, v, cache_len, region_len, restricted, block_vis, 1.0)
        el = torch.zeros(h, m.n_qb * m.q_block, m.n_kb * KV_BLOCK, dtype=torch.bool)
        el[:, :n, : cache_len + n] = mask
        blocks = el.view(h, m.n_qb, m.q_block, m.n_kb, KV_BLOCK).any(dim=(0, 2, 4))  # [qb, kb] needed
        listed = torch.zeros(m.n_qb, m.n_kb, dtype=torch.bool)
        full = torch.zeros_like(listed)
        for qb in range(m.n_qb):
            listed[qb, m._idx[0, 0, qb, : m._num[0, 0, qb]].long()] = True
            full[qb, m._full_idx[0, 0, qb, : m._full_num[0, 0, qb]].long()] = True
        assert not (listed & full).any()
        assert torch.equal(blocks & ~full, blocks & listed)  # every needed block is loaded
        assert not (listed & ~blocks).any()  # nothing loaded that no row needs
        for qb, kb in full.nonzero().tolist():  # full blocks skip the mask: must be all visible
            rows = slice(qb * m.q_block, min(n, (qb + 1) * m.q_block))
            assert el[:, rows, kb * KV_BLOCK : (kb + 1) * KV_BLOCK].all()


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("shape", SHAPES)
def test_eager_flex_mask_mod_equals_dense_reference(shape):
    h, hkv, d, n, cache_len, kv_len, mixed = shape
    q, k, v, region_len, restricted, block_vis = case(11, *shape)
    m = RegionBlockMask(n, kv_len, h, hkv, restricted, block_vis)
    m.update(cache_len, region_len)
    out = m.attend(q, k, v, d**-0.5, compiled=False)
    ref, _ = reference(q, k, v, cache_len, region_len, restricted, block_vis, d**-0.5)
    assert (out - ref).abs().max() <= 1e-5


@pytest.mark.parametrize(
    "shape,dtype",
    [
        ((4, 2, 16, 1, 700, 701, False), torch.float32),
        ((4, 2, 16, 7, 513, 777, True), torch.float32),
        pytest.param(
            (4, 2, 16, 3, 300, 701, False), torch.bfloat16, marks=pytest.mark.slow
        ),  # its own compile
    ],
)
def test_compiled_flex_equals_dense_reference(shape, dtype):
    h, hkv, d, n, cache_len, kv_len, mixed = shape
    q, k, v, region_len, restricted, block_vis = case(5, *shape, dtype=dtype)
    m = RegionBlockMask(n, kv_len, h, hkv, restricted, block_vis)
    with torch.inference_mode():
        for step in range(3):  # the same mask object follows a growing cache and changing regions
            cl = cache_len - 37 * (2 - step)
            rl = (region_len + step).clamp(max=cl)
            m.update(cl, rl)
            out = m.attend(q, k, v, d**-0.5).float()
            ref, _ = reference(q, k, v, cl, rl, restricted, block_vis, d**-0.5)
            assert (out - ref).abs().max() <= (1e-5 if dtype == torch.float32 else 3e-2)
    assert m.blocks_read() < m.n_qb * m.n_kb  # it skips blocks


@pytest.mark.parametrize("shape", [s for s in SHAPES if not s[-1]])
def test_sliced_and_flash_plumbing_equal_dense_reference(shape):
    h, hkv, d, n, cache_len, kv_len, _ = shape
    q, k, v, region_len, restricted, block_vis = case(7, *shape)
    scale = d**-0.5
    ref, _ = reference(q, k, v, cache_len, region_len, restricted, block_vis, scale)
    top = int(region_len.max())
    args = (
        k[:, :, :top],
        v[:, :, :top],
        region_len,
        k[:, :, cache_len : cache_len + n],
        v[:, :, cache_len : cache_len + n],
        block_vis,
        scale,
    )
    assert (sliced_attend(q, *args) - ref).abs().max() <= 1e-5
    assert (flash_region_attend(q, *args, varlen=reference_varlen) - ref).abs().max() <= 1e-5


def reference_varlen(q, k, v, cu_q, cu_k, max_q, max_k, softmax_scale, causal, return_attn_probs):
    """flash_attn_varlen_func's contract in plain torch (non-causal):
    out [total_q, nh, d], lse [nh, total_q]."""
    assert not causal and return_attn_probs
    outs, lses = [], []
    for i in range(cu_q.numel() - 1):
        qi, ki, vi = q[cu_q[i] : cu_q[i + 1]], k[cu_k[i] : cu_k[i + 1]], v[cu_k[i] : cu_k[i + 1]]
        s = torch.einsum("qhd,khd->hqk", qi.float(), ki.float()) * softmax_scale
        lse = torch.logsumexp(s, -1)
        outs.append(torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), vi.float()))
        lses.append(lse)
    return torch.cat(outs), torch.cat(lses, dim=1), None


def test_merge_lse_equals_softmax_over_the_union():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 8, generator=g) for _ in range(3))
    k, v = torch.randn(1, 2, 20, 8, generator=g), torch.randn(1, 2, 20, 8, generator=g)
    o1, l1 = attention_with_lse(q, k[:, :, :12], v[:, :, :12], None, 0.3)
    o2, l2 = attention_with_lse(q, k[:, :, 12:], v[:, :, 12:], None, 0.3)
    ref = F.scaled_dot_product_attention(q, k, v, scale=0.3)
    assert (merge_lse(o1, l1, o2, l2) - ref).abs().max() <= 1e-5


# --- through the engine ---------------------------------------------------------------------------
POLICIES = {
    "streaming": {"budget": 40, "sinks": 4},
    "snapkv": {"budget": 40, "window": 8},
    "quest": {"budget": 48, "page_size": 8, "dense_layers": 1},
    "h2o": {"budget": 40, "recent": 16},
}


@pytest.mark.parametrize("backend", ["sliced", "flex"])
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_region_view_equals_restricted_view_on_a_mixed_block(tiny_lm, name, backend):
    """A FAFO-like block (first rows see the full cache, the rest the policy's selection) through the
    engine: the compressed-region view gives the dense reference's logits; after commit the next step
    agrees too (the region swaps in the new entries)."""
    eng = Engine(tiny_lm.model)
    prompt = torch.randint(0, 256, (150,), generator=torch.Generator().manual_seed(2)).tolist()
    n = 6
    g = torch.Generator().manual_seed(4)
    block = ((torch.rand(n, n, generator=g) < 0.5).tril() | torch.eye(n, dtype=torch.bool)).to(eng.device)
    restricted = torch.tensor([False, False, True, True, True, True], device=eng.device)
    results = {}
    for be in ("dense", backend):
        pol = build_policy(name, backend=be, **POLICIES[name])
        pol.attach(eng)
        eng.reset(200)
        pol.reset(len(prompt))
        eng.prefill(prompt, hooks=pol.prefill_hooks())
        pol.after_prefill(eng)
        logits = []
        for step in range(3):
            base = eng.length
            toks = torch.tensor([7 + step, 8, 9, 10, 11, 12], device=eng.device)
            pos = torch.tensor([base, base + 1, base + 1, base + 2, base + 3, base + 4], device=eng.device)
            view = restricted_view(pol, eng, block, restricted)
            dense_view = {"streaming": SelectionView, "quest": RestrictedView}.get(name, LayerSelectionView)
            assert isinstance(view, dense_view) == (be == "dense")
            logits.append(eng.step(toks, pos, view))
            eng.commit([0, 1])
            pol.after_commit(eng, 2)
        results[be] = torch.stack(logits)
    assert (results["dense"] - results[backend]).abs().max() <= 1e-4


@pytest.mark.slow
def test_vanilla_with_compiled_flex_region_equals_dense(tiny_lm):
    eng = Engine(tiny_lm.model)
    prompt = torch.randint(0, 256, (300,), generator=torch.Generator().manual_seed(8)).tolist()
    outs = {}
    for be in ("dense", "flex"):
        pol = build_policy("streaming", budget=100, sinks=4, backend=be)
        outs[be] = Vanilla(eng, pol).generate(prompt, 30, set(), Counts())
    assert outs["dense"] == outs["flex"]
    assert pol.slots.region is not None and pol.slots.region.swaps >= 29


def test_flash_backend_needs_cuda_and_flash_attn(tiny_lm):
    eng = Engine(tiny_lm.model)
    pol = build_policy("streaming", budget=40, backend="flash")
    pol.attach(eng)
    eng.reset(100)
    pol.reset(60)
    eng.prefill(list(range(60)))
    if eng.device.type != "cuda":
        with pytest.raises(HarnessError, match="flash-attn"):
            CompressedRegion(pol, eng, backend="flash")


@pytest.mark.parametrize("region", [40, 2100])
def test_sliced_decode_row_over_a_full_region_takes_the_unmasked_path(region):
    """One decode row whose region is full in every head (SFI's fast steps): no mask, SDPA or the
    split decode attention, equal to the dense reference over [region | block]."""
    from core.attention import sdpa

    torch.manual_seed(region)
    h, hkv, d = 6, 2, 16
    q = torch.randn(1, h, 1, d)
    k, v = torch.randn(1, hkv, region + 1, d), torch.randn(1, hkv, region + 1, d)
    rl = torch.full((hkv,), region)
    vis = torch.ones(1, 1, dtype=torch.bool)
    kr, vr, kb, vb = k[:, :, :region], v[:, :, :region], k[:, :, region:], v[:, :, region:]
    out = sliced_attend(q, kr, vr, rl, kb, vb, vis, 0.25)
    torch.testing.assert_close(out, sdpa(q, k, v, None, 0.25), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("hole", [True, False])
def test_one_row_draft_masks_are_prefixes_of_one_buffer_equal_to_the_built_masks(tiny_lm, hole):
    """A self-speculative draft's rows (one row each, the same selection, a growing fresh tail) take
    their visibility as prefixes of one buffer written once per draft: each equals the mask built from
    scratch, and a new selection (the next draft, after a commit) writes a new buffer. StreamingLLM's
    window is written as a hole over slots that hold their positions (`hole`), else from its selection
    tensor."""
    from kv_policies.shared_selection import _selection_mask
    from kv_policies.view import causal_block
    from tests.conftest import prefill_under

    eng = Engine(tiny_lm.model)
    pol = build_policy("streaming", budget=24, sinks=4)
    if not hole:
        pol.fixed_hole = lambda cache_len: None
    prefill_under(eng, pol, list(range(1, 61)), 20)
    tril, every = causal_block(1, eng.device)
    buffers = set()
    for _draft in range(2):
        length = eng.length
        for i in range(4):  # draft rows: each commits its entry, the next sees it in the tail
            view = draft_view(pol, eng, length)
            assert isinstance(view, SelectionView)
            assert (pol.fixed_hole(length) is not None) == hole
            selection, _ = pol.fixed_selection(length)
            built = _selection_mask(eng, tril, every, slice(None), selection, length, eng.length)
            assert torch.equal(view.mask, built)
            buffers.add(view.mask.untyped_storage().data_ptr())
            eng.step(torch.tensor([5 + i]), torch.tensor([eng.length]), view)
            eng.commit([0])
        eng.crop(length)
        eng.step(torch.tensor([9]), torch.tensor([length]), CausalView(eng.scale))
        eng.commit([0])  # the verification keeps one token: the next draft selects over one more entry
        pol.after_commit(eng, 1)
    assert len(buffers) == 2  # one buffer per draft, none per row
