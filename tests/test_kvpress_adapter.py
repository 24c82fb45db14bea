"""kv=kvpress: NVIDIA kvpress presses as KV policies (one adapter), and our own kv=snapkv / kv=streaming
cross-checked against kvpress's selections on the same prompt cache."""

from __future__ import annotations

import math

import pytest
import torch

from core.engine import Engine
from core.types import Counts, HarnessError
from decoders.vanilla import Vanilla
from kv_policies.registry import build_policy
from tests.conftest import prefill_under

pytest.importorskip("kvpress", reason="kvpress not installed (scripts/install.sh installs it)")
pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = [(7 * i + 3) % 250 for i in range(300)]
PRESSES = [
    ("SnapKVPress", {}),
    ("StreamingLLMPress", {}),
    ("TOVAPress", {}),
    ("KnormPress", {}),
    ("LagKVPress", {}),
    ("PyramidKVPress", {}),
    ("ChunkKVPress", {"press": "SnapKVPress", "chunk_length": 20}),
]


def prefilled(eng: Engine, policy) -> int:
    prefill_under(eng, policy, PROMPT, 8)
    return eng.length


def kept(policy, eng: Engine, layer: int, n: int) -> list[set[int]]:
    sel = policy.visible(layer, torch.zeros(eng.w.n_heads, 1, eng.w.head_dim), eng.cache.k[layer, :, :n], n)
    return [set(row.nonzero().squeeze(1).tolist()) for row in sel]


@pytest.mark.parametrize(("press", "kwargs"), PRESSES, ids=[p for p, _ in PRESSES])
def test_every_press_runs_as_a_policy(tiny_lm, press, kwargs):
    eng = Engine(tiny_lm.model)
    kv = build_policy("kvpress", press=press, compression_ratio=0.5, press_kwargs=kwargs)
    counts = Counts()
    Vanilla(eng, kv=kv).generate(PROMPT, 12, set(), counts)
    assert counts.kv_activity.restricted_frac == 1.0
    n = len(PROMPT)
    for layer, keep in kv._keep.items():
        per_head = keep[:, :n].sum(1)
        if press == "PyramidKVPress":  # per-layer budgets, the same number for every head
            assert per_head.min() == per_head.max() and 0 < per_head[0] < n
        elif press == "ChunkKVPress":  # whole chunks of 20 (the same for every head)
            assert torch.equal(keep[0, :n], keep[-1, :n]) and int(per_head[0]) % 20 == 0
        else:
            assert (per_head == math.floor(n * 0.5)).all(), (layer, per_head)


def test_snapkv_matches_kvpress(tiny_lm):
    """Our SnapKV with kvpress's settings (window 16, average pooling over 5) keeps the same entries as
    kvpress's SnapKVPress: kvpress averages over the window and the group's heads where we sum (the same
    ranking) and keeps the window by giving it the top score, as we do."""
    eng = Engine(tiny_lm.model)
    n_kept = math.floor(len(PROMPT) * 0.5)
    press = build_policy(
        "kvpress",
        press="SnapKVPress",
        compression_ratio=0.5,
        press_kwargs={"window_size": 16, "kernel_size": 5},
    )
    n = prefilled(eng, press)
    ours = build_policy("snapkv", budget=n_kept, window=16, kernel=5, pooling="avg")
    prefilled(eng, ours)
    for layer in range(eng.cache.n_layers):
        assert kept(ours, eng, layer, n) == kept(press, eng, layer, n)


def test_streaming_matches_kvpress_at_the_end_of_the_prefill(tiny_lm):
    """kvpress's StreamingLLMPress keeps the n_sink first and the most recent prompt entries once; ours
    keeps the same set at the end of the prefill (and then slides it while decoding, where kvpress keeps
    the compressed prompt and appends every new token)."""
    eng = Engine(tiny_lm.model)
    n_kept = math.floor(len(PROMPT) * 0.5)
    press = build_policy(
        "kvpress", press="StreamingLLMPress", compression_ratio=0.5, press_kwargs={"n_sink": 4}
    )
    n = prefilled(eng, press)
    ours = build_policy("streaming", budget=n_kept, sinks=4)
    prefilled(eng, ours)
    for layer in range(eng.cache.n_layers):
        assert kept(ours, eng, layer, n) == kept(press, eng, layer, n)


def test_bad_press_input_is_one_clear_error():
    with pytest.raises(HarnessError, match="ThinK prunes key channels"):
        build_policy("kvpress", press="ThinKPress")
    with pytest.raises(HarnessError, match="no press 'NopePress' in kvpress; presses: .*SnapKVPress"):
        build_policy("kvpress", press="NopePress")
    with pytest.raises(HarnessError, match="compression_ratio must be in \\[0, 1\\)"):
        build_policy("kvpress", compression_ratio=1.0)
    with pytest.raises(HarnessError, match="cannot wrap LagKVPress"):
        build_policy("kvpress", press="ChunkKVPress", press_kwargs={"press": "LagKVPress"})
    with pytest.raises(HarnessError, match=r"context_rows \(64\) must exceed the press.s observation"):
        build_policy("kvpress", press="SnapKVPress", context_rows=64)


@pytest.mark.parametrize(
    ("press", "kwargs"), [("SnapKVPress", {}), ("ChunkKVPress", {"press": "SnapKVPress", "chunk_length": 4})]
)
def test_prompt_within_the_observation_window_is_kept_whole(tiny_lm, press, kwargs):
    """SnapKV scores with its last 64 prompt queries: a prompt of <= 64 tokens cannot be scored, so it is
    kept whole and the run says the policy restricted nothing (kvpress itself asserts)."""
    eng = Engine(tiny_lm.model)
    kv = build_policy("kvpress", press=press, press_kwargs=kwargs)
    assert kv.window == 64 and not kv.can_restrict(64, 80) and kv.can_restrict(65, 80)
    counts = Counts()
    out = Vanilla(eng, kv=kv).generate(PROMPT[:64], 8, set(), counts)
    assert out == Vanilla(eng).generate(PROMPT[:64], 8, set(), Counts())
    assert counts.kv_activity.restricted_frac == 0.0 and not kv._keep
