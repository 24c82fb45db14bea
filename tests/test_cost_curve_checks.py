"""A cost curve measured on a busy machine: priced sanely outside its grid, measured again where its
points disagree, refused (and not cached) when it stays noisy; and keyed by the CPU's ISA features."""

from __future__ import annotations

import itertools

import pytest
import torch

from core import cost_curve
from core.cost_curve import CostCurve, NoisyCurve, cache_name, cached_curve, cached_or_measured
from decoders.block_size import generator_plan
from runners.provenance import cpu_isa, device_name

KEY = {
    "device": "cpu: Some CPU [none] x2 threads",
    "model": "m",
    "dtype": "float32",
    "linear": "aten",
    "threads": 2,
}


def steep() -> CostCurve:
    """A line through its first two contexts that dives below zero just under the grid."""
    return CostCurve(KEY, rows=[1, 2, 8], contexts=[256, 1024], seconds=[[0.2, 0.25, 0.4], [2.0, 2.1, 2.5]])


def test_outside_the_grid_the_nearest_measured_point_is_used():
    c = steep()
    assert c(1, 16) == pytest.approx(0.2) and c(8, 16) == pytest.approx(0.4)  # below the smallest context
    assert c(1, 10_000) == pytest.approx(2.0)  # beyond the largest
    assert c(64, 256) == pytest.approx(0.4)  # beyond the most rows
    assert c(2, 640) == pytest.approx(0.25 + (2.1 - 0.25) * (640 - 256) / 768)  # inside: interpolated
    assert all(c(r, x) > 0 for r in (1, 2, 5, 8, 100) for x in (0, 1, 16, 255, 256, 5000))


def test_a_block_plan_below_the_grid_never_divides_by_zero():
    size, period = generator_plan([1, 2, 4], lambda s: s, steep(), ctx=16, share=0.1)
    assert size in (1, 2, 4) and period >= 1
    assert generator_plan([1, 2], lambda s: s, lambda rows, ctx: 0.0, ctx=16, share=0.1) == (2, 1)


def test_a_curve_with_a_forward_priced_at_zero_is_not_a_curve(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="positive"):
        CostCurve(KEY, rows=[1, 2], contexts=[256], seconds=[[0.0, 0.1]])
    monkeypatch.setenv("HARNESS_COST_CACHE", str(tmp_path))
    (tmp_path / cache_name(KEY)).write_text(steep().to_json().replace("0.2,", "-0.1,", 1))
    assert cached_curve(KEY) is None  # a broken cache file is measured again, not used


class FakeEngine:
    """What measure_grid touches of an Engine; its step times come from `times` (one list per call)."""

    max_positions = 8192
    model = type("M", (), {"config": type("C", (), {"vocab_size": 100})()})()

    def reset(self, capacity: int) -> None:
        pass

    def prefill(self, ids) -> None:
        pass


def fake_times(monkeypatch, seconds_of) -> list[tuple[int, int]]:
    """Patch step_times: `seconds_of(ctx, rows, call)` -> the repeats of that call. Returns the calls."""
    calls: list[tuple[int, int]] = []
    counter = itertools.count()

    def step_times(eng, context, rows, reps):
        calls.append((context, rows))
        return seconds_of(context, rows, next(counter), reps)

    monkeypatch.setattr(cost_curve, "step_times", step_times)
    return calls


def test_noise_that_stays_is_refused_and_nothing_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_COST_CACHE", str(tmp_path))
    noisy = {1: 0.46, 2: 0.25, 4: 2.94, 8: 0.99}  # more rows, less time: a busy machine
    fake_times(monkeypatch, lambda ctx, rows, call, reps: [noisy[rows] * (1 + 0.01 * i) for i in range(reps)])
    with pytest.raises(NoisyCurve, match="stays noisy.*decoder.block=fixed"):
        cached_or_measured(FakeEngine(), KEY, 8)
    assert not list(tmp_path.iterdir())


def test_disagreeing_points_are_measured_again_and_a_sane_curve_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_COST_CACHE", str(tmp_path))

    def seconds(ctx, rows, call, reps):
        base = 0.01 * ctx / 256 * (1 + 0.1 * rows)
        if call == 5:  # 2 rows in the kept pass at 256 entries hit a busy moment: repeats 1x to 5x apart
            return [base * (1 + i) for i in range(reps)]
        return [base * (1 + 0.01 * i) for i in range(reps)]

    calls = fake_times(monkeypatch, seconds)
    curve, measured = cached_or_measured(FakeEngine(), KEY, 8)
    assert measured and cached_curve(KEY) == curve
    assert calls.count((256, 2)) == 3  # warm-up pass, kept pass, and once more for its noisy repeats
    for line in curve.seconds:
        assert line == sorted(line)


def test_a_block_auto_run_on_a_machine_too_busy_refuses_before_writing(tmp_path, monkeypatch):
    from runners.runner import Runner
    from tests.helpers import make_cfg

    monkeypatch.setenv("HARNESS_COST_CACHE", str(tmp_path / "cache"))
    fake_times(
        monkeypatch,
        lambda ctx, rows, call, reps: [(0.5 if rows == 1 else 0.1) + 0.001 * i for i in range(reps)],
    )
    runner = Runner(make_cfg(tmp_path / "out", "decoder=pld_auto", "+task.n=1"))
    with pytest.raises(NoisyCurve):
        runner.run()
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_the_device_name_carries_the_isa_features_the_code_branches_on():
    avx2 = "model name\t: AMD EPYC\nflags\t\t: fpu sse avx avx2 fma\n"
    bf16 = "model name\t: AMD EPYC\nflags\t\t: fpu sse avx avx2 fma avx512f avx512_bf16\n"
    assert cpu_isa(avx2) == "none" and cpu_isa(bf16) == "avx512_bf16"
    cpu = torch.device("cpu")
    a, b = device_name(cpu, avx2), device_name(cpu, bf16)
    assert a != b and "AMD EPYC" in a and "[avx512_bf16]" in b
    assert cache_name({**KEY, "device": a}) != cache_name({**KEY, "device": b})  # curves apart


def test_a_runs_identity_and_record_name_the_isa(tmp_path):
    from runners.runner import Runner
    from tests.helpers import make_cfg

    runner = Runner(make_cfg(tmp_path, "+task.n=1"))
    assert f"[{cpu_isa()}]" in runner.identity["device_name"]
    assert f"[{cpu_isa()}]" in runner._provenance()["device_name"]
