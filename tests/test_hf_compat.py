"""Pins the one module that depends on transformers internals (core/hf_compat.py)."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

from core.engine import Engine
from core.hf_compat import extract_weights
from tests.conftest import needs_smollm


def test_transformers_pinned():
    assert importlib.metadata.version("transformers") == "5.23.0", "bump deliberately: rerun these tests"


def test_fused_weights_share_storage(tiny_lm):
    w = extract_weights(tiny_lm.model)
    attn = tiny_lm.model.model.layers[0].self_attn
    assert attn.q_proj.weight.data_ptr() == w.layers[0].wqkv.data_ptr()
    again = extract_weights(tiny_lm.model)  # a second engine on the same model does not copy
    assert again.layers[0].wqkv.data_ptr() == w.layers[0].wqkv.data_ptr()


def test_engine_logits_equal_hf(tiny_lm):
    eng = Engine(tiny_lm.model)
    ids = torch.randint(0, 256, (1, 30), generator=torch.Generator().manual_seed(3))
    eng.reset(40)
    eng.prefill(ids[0, :20].tolist())
    from core.attention import CausalView

    ours = eng.step(ids[0, 20:], torch.arange(20, 30), CausalView(eng.scale))
    ref = tiny_lm.model(ids).logits[0, 20:]
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_unsupported_arch_is_refused():
    from transformers import GPT2Config, GPT2LMHeadModel

    with pytest.raises(ValueError, match="not supported"):
        extract_weights(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2)))


@needs_smollm
def test_smollm_engine_equals_hf(smollm):
    eng = Engine(smollm.model)
    ids = smollm.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 4)
    eng.reset(len(ids) + 1)
    ours = eng.prefill(ids)
    ref = smollm.model(torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(ours, ref, atol=2e-4, rtol=1e-4)
