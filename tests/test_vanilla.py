"""Vanilla greedy equals `model.generate(do_sample=False)`; sampling is seeded and well-formed."""

from __future__ import annotations

import pytest
import torch

from core.engine import Engine
from core.sampling import Sampler
from core.types import Counts, HarnessError
from decoders.vanilla import Vanilla
from tasks.base import chat_ids
from tests.conftest import needs_smollm


def _hf_greedy(model, prompt: list[int], n: int, eos: int | None) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]),
        max_new_tokens=n,
        do_sample=False,
        eos_token_id=eos,
        pad_token_id=0,
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
    )
    return out[0, len(prompt) :].tolist()


@pytest.mark.parametrize("seed", range(6))
def test_greedy_equals_hf_generate_tiny(tiny_lm, seed):
    g = torch.Generator().manual_seed(seed)
    prompt = torch.randint(0, 256, (int(torch.randint(3, 40, (1,), generator=g)),), generator=g).tolist()
    counts = Counts()
    ours = Vanilla(Engine(tiny_lm.model)).generate(prompt, 24, set(), counts)
    assert ours == _hf_greedy(tiny_lm.model, prompt, 24, None)
    assert counts.forwards == 23 and counts.committed == 23 and counts.tau == 1.0


def test_stop_token_is_kept_and_ends(tiny_lm):
    prompt = [5, 6, 7, 8]
    full = Vanilla(Engine(tiny_lm.model)).generate(prompt, 20, set(), Counts())
    stop = full[5]
    out = Vanilla(Engine(tiny_lm.model)).generate(prompt, 20, {stop}, Counts())
    assert out == full[: full.index(stop) + 1]


def test_bad_lengths(tiny_lm):
    dec = Vanilla(Engine(tiny_lm.model))
    with pytest.raises(HarnessError, match="max_new_tokens"):
        dec.generate([1, 2], 0, set(), Counts())
    with pytest.raises(HarnessError, match="context"):
        dec.generate(list(range(100)) * 41, 8, set(), Counts())


def test_sampling_is_seeded_and_respects_top_k(tiny_lm):
    def run(seed):
        s = Sampler(temperature=1.0, top_k=3, seed=seed)
        return Vanilla(Engine(tiny_lm.model), sampler=s).generate([1, 2, 3], 16, set(), Counts())

    assert run(0) == run(0)
    assert run(0) != run(1)
    s = Sampler(temperature=0.7, top_p=0.9, top_k=5)
    p = s.probs(torch.randn(2, 50))
    assert torch.allclose(p.sum(-1), torch.ones(2)) and ((p > 0).sum(-1) <= 5).all()


@pytest.mark.smollm
@needs_smollm
def test_greedy_equals_hf_generate_smollm(smollm):
    tok = smollm.tokenizer
    dec = Vanilla(Engine(smollm.model))
    prompt = chat_ids(tok, [{"role": "user", "content": "Write a haiku about autumn leaves."}])
    ours = dec.generate(prompt, 24, {tok.eos_token_id}, Counts())
    assert ours == _hf_greedy(smollm.model, prompt, 24, tok.eos_token_id)


@pytest.mark.slow
@pytest.mark.smollm
@needs_smollm
def test_greedy_equals_hf_generate_smollm_longer(smollm):
    tok = smollm.tokenizer
    dec = Vanilla(Engine(smollm.model))
    for q in ["What is the capital of France?", "Write a haiku about autumn leaves."]:
        prompt = chat_ids(tok, [{"role": "user", "content": q}])
        ours = dec.generate(prompt, 64, {tok.eos_token_id}, Counts())
        assert ours == _hf_greedy(smollm.model, prompt, 64, tok.eos_token_id)
