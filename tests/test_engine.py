"""The shared primitive: a block with a tree mask + commit == decoding the kept tokens one by one."""

from __future__ import annotations

import pytest
import torch

from core.attention import CausalView, MaskView
from core.engine import Engine


def _sequential(engine: Engine, prompt: list[int], tokens: list[int]):
    engine.reset(64)
    engine.prefill(prompt)
    rows = []
    for t in tokens:
        pos = torch.tensor([engine.length])
        rows.append(engine.step(torch.tensor([t]), pos, CausalView(engine.scale))[0])
        engine.commit([0])
    return torch.stack(rows)


def test_prefill_matches_hf_forward(tiny_lm):
    eng = Engine(tiny_lm.model)
    ids = torch.randint(0, 256, (37,), generator=torch.Generator().manual_seed(0))
    eng.reset(64)
    ours = eng.prefill(ids.tolist())
    ref = tiny_lm.model(ids[None].to(eng.device)).logits[0, -1]
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_tree_block_then_commit_equals_sequential(tiny_lm):
    eng = Engine(tiny_lm.model)
    prompt = torch.randint(0, 256, (23,), generator=torch.Generator().manual_seed(1)).tolist()
    t0, a1, a2, b1, b2, b3 = 11, 40, 41, 50, 51, 52
    # block rows: 0=t0, 1=a1, 2=a2, 3=b1, 4=b2, 5=b3 ; branches a and b both continue t0
    parents = [-1, 0, 1, 0, 3, 4]
    depth = [0, 1, 2, 1, 2, 3]
    n, L = 6, len(prompt)
    mask = torch.zeros(n, L + n, dtype=torch.bool)
    mask[:, :L] = True
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, L + j] = True
            j = parents[j]
    eng.reset(64)
    eng.prefill(prompt)
    pos = torch.tensor([L + d for d in depth])
    logits = eng.step(torch.tensor([t0, a1, a2, b1, b2, b3]), pos, MaskView(mask, eng.scale))
    eng.commit([0, 3, 4])
    k_block, v_block = eng.cache.k[:, :, : L + 3].clone(), eng.cache.v[:, :, : L + 3].clone()
    pos_block = eng.cache.slot_pos[: L + 3].clone()
    nxt = eng.step(torch.tensor([b3]), torch.tensor([L + 3]), CausalView(eng.scale))[0]

    ref_rows = _sequential(eng, prompt, [t0, b1, b2, b3])
    torch.testing.assert_close(logits[[0, 3, 4, 5]], ref_rows, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(nxt, ref_rows[3], atol=1e-5, rtol=1e-5)
    # the sequential path staged b3 last; compare the committed prefix only
    torch.testing.assert_close(k_block, eng.cache.k[:, :, : L + 3], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(v_block, eng.cache.v[:, :, : L + 3], atol=1e-6, rtol=1e-6)
    assert torch.equal(pos_block, eng.cache.slot_pos[: L + 3])
    # the other branch's logits equal decoding it sequentially too
    ref_a = _sequential(eng, prompt, [t0, a1, a2])
    torch.testing.assert_close(logits[[0, 1, 2]], ref_a, atol=1e-5, rtol=1e-5)


def test_chunked_prefill_equals_one_shot(tiny_lm):
    ids = torch.randint(0, 256, (50,), generator=torch.Generator().manual_seed(2)).tolist()
    one = Engine(tiny_lm.model, prefill_chunk=1024)
    one.reset(64)
    a = one.prefill(ids)
    chunked = Engine(tiny_lm.model, prefill_chunk=16)
    chunked.reset(64)
    b = chunked.prefill(ids)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(one.cache.k[:, :, :50], chunked.cache.k[:, :, :50], atol=1e-5, rtol=1e-5)


def test_crop_and_overflow(tiny_lm):
    eng = Engine(tiny_lm.model)
    eng.reset(8)
    eng.prefill([1, 2, 3, 4, 5])
    eng.crop(3)
    assert eng.length == 3
    try:
        eng.step(torch.arange(6), torch.arange(3, 9), CausalView(eng.scale))
    except RuntimeError as exc:
        assert "overflow" in str(exc)
    else:
        raise AssertionError("overflow not detected")


@pytest.mark.parametrize("length", [2048, 2500, 4096])
@pytest.mark.parametrize("heads", [(4, 4), (6, 2), (9, 3)])
def test_split_decode_attention_equals_sdpa(length, heads):
    """The CPU float32 one-row path (query heads of a group in one pass, the value sum split into
    chunks, a remainder chunk when the length is not a multiple) equals SDPA to float32 rounding."""
    from core.attention import decode_attention, sdpa, split_applies

    torch.manual_seed(length)
    h, hkv = heads
    q, k, v = torch.randn(1, h, 1, 64), torch.randn(1, hkv, length, 64), torch.randn(1, hkv, length, 64)
    assert split_applies(q, k)
    out, ref = decode_attention(q, k, v, 0.125), sdpa(q, k, v, None, 0.125)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("heads", [(4, 4), (9, 3)])
def test_one_row_over_two_slices_equals_sdpa_over_their_valid_keys(heads):
    """`one_row_two_slices`: a ragged first slice (valid length per KV head) and a second slice, one
    softmax over both, equals SDPA over each head's valid keys concatenated."""
    from core.attention import one_row_two_slices, sdpa

    torch.manual_seed(heads[0])
    h, hkv = heads
    q = torch.randn(1, h, 1, 16)
    k1, v1 = torch.randn(1, hkv, 40, 16), torch.randn(1, hkv, 40, 16)
    k2, v2 = torch.randn(1, hkv, 7, 16), torch.randn(1, hkv, 7, 16)
    for lens in ([40] * hkv, [40, 33, 5, 1][:hkv] if hkv > 3 else [40, 33, 5]):
        len1 = torch.tensor(lens)
        out = one_row_two_slices(q, k1, v1, len1, k2, v2, 0.25)
        g = h // hkv
        for kh in range(hkv):
            keys = torch.cat([k1[:, kh : kh + 1, : lens[kh]], k2[:, kh : kh + 1]], dim=2)
            vals = torch.cat([v1[:, kh : kh + 1, : lens[kh]], v2[:, kh : kh + 1]], dim=2)
            ref = sdpa(q[:, kh * g : (kh + 1) * g], keys, vals, None, 0.25)
            torch.testing.assert_close(out[:, kh * g : (kh + 1) * g], ref, atol=1e-6, rtol=1e-5)


def test_split_decode_attention_applies_only_where_it_gains():
    from core.attention import SPLIT_MIN_KEYS, split_applies

    q, k = torch.randn(1, 4, 1, 8), torch.randn(1, 2, SPLIT_MIN_KEYS, 8)
    assert split_applies(q, k)
    assert not split_applies(q, k[:, :, :-1])  # a short cache: SDPA
    assert not split_applies(torch.randn(1, 4, 2, 8), k)  # a block of rows
    assert not split_applies(q.bfloat16(), k.bfloat16())  # bf16 keeps SDPA's float32 accumulation


def test_positions_are_views_of_one_arange_and_a_chain_steps_like_fresh_tensors(tiny_lm):
    """`Engine.positions` slices one kept `arange` (no copy, no launch a step), growing it on demand;
    `Engine.chain` stages a chain's ids with them, and a step over them equals one over fresh tensors."""
    eng = Engine(tiny_lm.model)
    first = eng.positions(5, 3)
    assert first.tolist() == [5, 6, 7] and first.dtype == torch.long
    assert eng.positions(7, 2).untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
    far = eng.positions(3000, 4)
    assert far.tolist() == [3000, 3001, 3002, 3003]
    assert first.tolist() == [5, 6, 7]  # an earlier slice keeps its values when the arange grows
    prompt = list(range(1, 30))
    eng.reset(64)
    eng.prefill(prompt)
    ids, pos = eng.chain([40, 41, 42], eng.length)
    assert ids.tolist() == [40, 41, 42] and pos.tolist() == [29, 30, 31]
    ours = eng.step(ids, pos, CausalView(eng.scale))
    fresh = eng.step(torch.tensor([40, 41, 42]), torch.arange(29, 32), CausalView(eng.scale))
    torch.testing.assert_close(ours, fresh, atol=0, rtol=0)


def test_staged_values_keep_their_values_dtype_and_memory(tiny_lm):
    """`Engine.stage` of Python values: integers packed by `struct` and wrapped by `frombuffer`, other
    dtypes and empty blocks through `torch.tensor`; each tensor owns what it reads after its source list
    is gone."""
    import gc

    eng = Engine(tiny_lm.model)
    staged = [eng.stage(list(range(3, 9))), eng.stage(range(4), torch.int32), eng.stage([], torch.long)]
    staged.append(eng.stage([True, False, True], torch.bool))
    gc.collect()
    assert staged[0].tolist() == [3, 4, 5, 6, 7, 8] and staged[0].dtype == torch.long
    assert staged[1].tolist() == [0, 1, 2, 3] and staged[1].dtype == torch.int32
    assert staged[2].numel() == 0 and staged[2].dtype == torch.long
    assert staged[3].tolist() == [True, False, True]
    assert eng.stage([2**40, -5]).tolist() == [2**40, -5]


def test_staging_what_is_already_on_the_device_makes_no_copy(tiny_lm):
    """A step stages its block on every call: a tensor already on the engine's device in the asked dtype
    comes back as the same object, one in another dtype is converted, and on a CPU a host list becomes
    the tensor the step reads (no further `.to`)."""
    eng = Engine(tiny_lm.model)
    ids = torch.arange(5, device=eng.device)
    assert eng.stage(ids) is ids
    as_int = eng.stage(ids, torch.int32)
    assert as_int.dtype == torch.int32 and as_int.tolist() == ids.tolist()
    staged = eng.stage([7, 8, 9])
    assert staged.device == eng.device and staged.tolist() == [7, 8, 9]
