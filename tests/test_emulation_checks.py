"""What the CPU suite's capture emulation (`runners.emulated_graphs`) catches besides a host value baked into
a captured run (tests/test_captured_graphs.py): each check beside a capture bug planted for it to find.

- bf16: the replayed forwards in bf16 give the eager twin's tokens and cache (with the checks below on).
- poisoned temporaries: what a recorded run allocated for itself is poisoned after the capture, as later
  replays overwrite a CUDA graph's private pool; code that reads one outside the graph fails.
- precision: a float buffer of another dtype than the model's read by a captured run (an fp32 buffer in a
  bf16 run, which PyTorch and a CUDA graph cast silently) fails the capture.
- one device: `one_device` fails code that mixes a host tensor into a device operator, as CUDA does, on
  the eager paths too (the earlier GPU windows' CUDA-only failures)."""

from __future__ import annotations

import pytest
import torch

from core import decode_graph
from core.replay import Replay
from runners.emulated_graphs import emulated_capture, one_device
from tests.conftest import TEST_DEVICE
from tests.graph_cases import generate, same_cache

# one case in `make test`, the others in `make test-long` (each generates three times under the emulation)
BF16_CASES = [
    "fafo+quest",
    *(
        pytest.param(c, marks=pytest.mark.slow)
        for c in ("vanilla", "fafo+h2o", "selfspec+retrieval/sliced", "longspec")
    ),
]
ONE_DEVICE_CASES = [
    "vanilla",
    "fafo+quest",
    *(pytest.param(c, marks=pytest.mark.slow) for c in ("selfspec+retrieval/sliced", "triforce+retrieval")),
]


@pytest.fixture(scope="module")
def tiny_bf16():
    from core.models import load_model

    return load_model("tiny", "tiny", arch="llama", dtype="bfloat16", device=TEST_DEVICE, seed=1)


@pytest.mark.parametrize("case", BF16_CASES)
def test_replayed_bf16_forwards_give_the_eager_twin(tiny_bf16, case):
    want, twin, _ = generate(tiny_bf16.model, case, False)
    with emulated_capture():
        got, eng, _ = generate(tiny_bf16.model, case, True)
    assert got == want and same_cache(eng, twin) and eng.graphs.captures > 0


def test_a_capture_time_temporary_read_outside_the_graph_is_poisoned():
    """A run that keeps one of its temporaries for the host to read later (the planted bug): on a GPU the
    memory belongs to the graph's pool; here the read gets NaN, not the capture's plausible value."""
    x = torch.zeros(4)
    kept: dict[str, torch.Tensor] = {}

    def run() -> torch.Tensor:
        doubled = x * 2
        kept["doubled"] = doubled  # the bug: a temporary escapes the graph
        return doubled + 1

    replay = Replay(run, capture=True, device=torch.device("cpu"))
    with emulated_capture():
        x.fill_(1.0)
        out = replay(("shape",))
        assert torch.equal(out, torch.full((4,), 3.0))  # the graph's output buffer is right
        assert torch.isnan(kept["doubled"]).all()  # the escaped temporary is poison
        x.fill_(2.0)
        assert torch.equal(replay(("shape",)), torch.full((4,), 5.0))


def test_an_fp32_buffer_in_a_bf16_captured_run_fails():
    """The planted bug: a staged buffer made fp32 (`torch.zeros(n)`, no dtype) in a bf16 run; the
    replay adds it to the bf16 weights' product, and PyTorch promotes the result to fp32 without a word.
    The same buffer made in the model's dtype captures."""
    weight = torch.randn(64, 8, dtype=torch.bfloat16)
    x = torch.randn(8, dtype=torch.bfloat16)

    def replay_with(bias: torch.Tensor) -> torch.Tensor:
        replay = Replay(lambda: weight @ x + bias, capture=True, device=torch.device("cpu"))
        with emulated_capture():
            return replay(("shape",))

    with pytest.raises(AssertionError, match="float32 buffer in a torch.bfloat16 run"):
        replay_with(torch.zeros(64))  # the bug: no dtype, so fp32
    assert replay_with(torch.zeros(64, dtype=torch.bfloat16)).dtype == torch.bfloat16


def test_a_bf16_cast_inside_the_run_is_the_runs_own():
    """Upcasts a run makes itself (a norm's or a softmax's `x.float()`) are no planted buffer."""
    weight = torch.randn(64, 8, dtype=torch.bfloat16)
    x = torch.randn(8, dtype=torch.bfloat16)
    scale = torch.ones(64, dtype=torch.bfloat16)

    def run() -> torch.Tensor:
        h = (weight @ x).float()
        return (h * torch.rsqrt(h.pow(2).mean() + 1e-6)).to(torch.bfloat16) * scale

    replay = Replay(run, capture=True, device=torch.device("cpu"))
    with emulated_capture():
        assert replay(("shape",)).dtype == torch.bfloat16


@pytest.mark.parametrize("case", ONE_DEVICE_CASES)
def test_the_experiments_keep_host_tensors_out_of_device_operators(tiny_lm, case):
    """The eager twin and the replayed forwards of the experiments' pairs under `one_device`."""
    with one_device(tiny_lm.device):
        generate(tiny_lm.model, case, False)
        with emulated_capture():
            generate(tiny_lm.model, case, True)


def test_a_host_tensor_mixed_into_a_device_operator_fails_on_a_cpu_too(tiny_lm, monkeypatch):
    """The planted bug: the block's row offsets made without a device (a host tensor on a GPU) and added
    to the device's cache length, on the eager twin, where no capture looks."""
    forward = decode_graph.StaticForward.forward

    def host_rows(self):
        self.row = torch.arange(self.rows)  # no device
        return forward(self)

    monkeypatch.setattr(decode_graph.StaticForward, "forward", host_rows)
    refusal, says = AssertionError, "host tensors mixed into device operators"
    if tiny_lm.device.type == "cuda":
        refusal, says = RuntimeError, "same device"
    with pytest.raises(refusal, match=says), one_device(tiny_lm.device):
        generate(tiny_lm.model, "vanilla", False)


def test_poisoning_passes_over_tensors_without_a_storage():
    """oneDNN's packed weights (`run.linear=onednn`, fp32 runs on x86) have no storage to poison or keep."""
    from runners.emulated_graphs import poison_temporaries

    if not torch.backends.mkldnn.is_available():
        pytest.skip("no oneDNN")
    packed = torch.ops.mkldnn._reorder_linear_weight(torch.randn(8, 8), 32)
    x = torch.randn(2, 8)
    doubled = x * 2
    out = doubled + 1
    ops = [
        (torch.ops.aten.mul.Tensor, (x, 2), {}, doubled),
        (torch.ops.aten.add.Tensor, (doubled, packed), {}, out),
    ]
    assert poison_temporaries(ops, out) == 1 and torch.isnan(doubled).all() and not torch.isnan(x).any()
