"""The runner: records schema, resume without loss or duplicates, failing samples, bad input."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from core.attention import CausalView
from core.types import HarnessError
from runners.records import SAMPLE_COLUMNS, SCORE_COLUMNS, STEP_COLUMNS, RunDir
from runners.runner import Runner
from tests.helpers import make_cfg

REPO = Path(__file__).resolve().parents[1]


def test_records_schema(tmp_path):
    path = Runner(make_cfg(tmp_path)).run()
    assert (path / "COMPLETE").exists()
    samples = pd.read_parquet(path / "samples.parquet")
    assert list(samples.columns[: len(SAMPLE_COLUMNS)]) == list(SAMPLE_COLUMNS)
    assert len(samples) == 6 and samples["error"].isna().all()
    assert (samples["new_tokens"] == 6).all() and (samples["tau"] == 1.0).all()
    assert (samples["forwards"] == 5).all() and samples["matches_vanilla"].all()
    assert (samples["prefill_s"] > 0).all() and (samples["decode_s"] > 0).all()
    # the decode forwards' own seconds: part of the decode time, the rest is the decoder's work
    assert ((samples["forward_s"] > 0) & (samples["forward_s"] < samples["decode_s"])).all()
    steps = pd.read_parquet(path / "steps.parquet")
    assert list(steps.columns) == list(STEP_COLUMNS) and len(steps) == 6 * 5
    scores = pd.read_parquet(path / "scores.parquet")
    assert list(scores.columns) == list(SCORE_COLUMNS) and set(scores["metric"]) == {"length"}
    runs = pd.read_parquet(path / "runs.parquet")
    assert runs.loc[0, "status"] == "complete" and runs.loc[0, "git_sha"]
    assert runs.loc[0, "decoder"] == "vanilla" and "transformers" in runs.loc[0, "versions"]


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [(("run.limit=4",), 4), (("run.limit=4", "task.limit=2"), 2), (("run.limit=null", "task.limit=3"), 3)],
)
def test_task_limit_wins_over_run_limit(tmp_path, overrides, expected):
    path = Runner(make_cfg(tmp_path, "+task.n=5", *overrides)).run()
    assert pd.read_parquet(path / "samples.parquet")["sample_id"].nunique() == expected
    assert pd.read_parquet(path / "runs.parquet").loc[0, "limit"] == expected


def test_rerun_skips_complete_and_resume_adds_only_missing(tmp_path, monkeypatch):
    path = Runner(make_cfg(tmp_path)).run()
    before = pd.read_parquet(path / "samples.parquet")
    assert not (path / "parts").exists()  # complete: each sample is stored once, in the merged tables
    assert Runner(make_cfg(tmp_path)).run() == path  # complete: nothing redone
    for f in path.iterdir():
        f.unlink()
    write = RunDir.write_sample

    def crash_after_two(self, sample_id, *rest):  # a kill after the first two samples
        if sample_id == "s2":
            raise KeyboardInterrupt
        write(self, sample_id, *rest)

    monkeypatch.setattr(RunDir, "write_sample", crash_after_two)
    with pytest.raises(KeyboardInterrupt):
        Runner(make_cfg(tmp_path)).run()
    parts = sorted((path / "parts").glob("*.samples.parquet"))
    kept = {p.name: p.stat().st_mtime_ns for p in parts}
    assert len(kept) == 2
    ran = []
    monkeypatch.setattr(
        RunDir, "write_sample", lambda self, sid, *rest: ran.append(sid) or write(self, sid, *rest)
    )
    Runner(make_cfg(tmp_path)).run()
    after = pd.read_parquet(path / "samples.parquet")
    assert ran == ["s2"]  # finished samples were not recomputed
    assert len(after) == len(before) and not after.duplicated(["sample_id", "turn"]).any()
    assert after["output_digest"].tolist() == before["output_digest"].tolist()


def test_crash_mid_run_then_resume(tmp_path, monkeypatch):
    calls = {"n": 0}
    orig = Runner._generate

    def crashing(self, prompt):
        calls["n"] += 1
        if calls["n"] == 4:  # second sample, second turn
            raise KeyboardInterrupt
        return orig(self, prompt)

    monkeypatch.setattr(Runner, "_generate", crashing)
    with pytest.raises(KeyboardInterrupt):
        Runner(make_cfg(tmp_path)).run()
    monkeypatch.setattr(Runner, "_generate", orig)
    path = Runner(make_cfg(tmp_path)).run()
    samples = pd.read_parquet(path / "samples.parquet")
    assert sorted(samples["sample_id"].unique()) == ["s0", "s1", "s2"]
    assert len(samples) == 6 and not samples.duplicated(["sample_id", "turn"]).any()


def test_failing_sample_is_recorded_and_run_goes_on(tmp_path):
    runner = Runner(make_cfg(tmp_path, "+task.broken=s1"))
    with pytest.raises(HarnessError, match="1 of 3 samples"):
        runner.run()
    path = runner.rundir.path
    assert not (path / "COMPLETE").exists()
    assert pd.read_parquet(path / "runs.parquet").loc[0, "status"] == "failed"
    samples = pd.read_parquet(path / "samples.parquet")
    bad = samples[samples["error"].notna()]
    assert list(bad["sample_id"]) == ["s1"] and "broken sample" in bad["error"].iloc[0]
    assert set(samples[samples["error"].isna()]["sample_id"]) == {"s0", "s1", "s2"}  # s1 turn 1 kept
    scores = pd.read_parquet(path / "scores.parquet")
    assert set(scores["sample_id"]) == {"s0", "s2"}


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "run.py"), f"run.out_dir={tmp_path}", *args],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["decoder=nope"], "unknown decoder 'nope'"),
        (["model=hf", "model.name=/nonexistent/model"], "not found: give an existing folder"),
        (["model=tiny_llama", "run.max_new_tokens=5000"], "exceeds the model context"),
        (["model=tiny_llama", "run.max_new_tokens=0"], "run.max_new_tokens must be an integer >= 1"),
        (["model=tiny_llama", "task.data_path=/nonexistent/q.jsonl"], "not found"),
    ],
)
def test_bad_input_gives_one_clear_line(tmp_path, args, message):
    res = _cli(tmp_path, *args)
    assert res.returncode != 0
    last = res.stderr.strip().splitlines()[-1]
    assert message in last and last.startswith("error:")
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_engine_linear_choice(tmp_path):
    """run.linear=auto takes the prepacked oneDNN GEMMs for fp32 on x86 CPUs and aten elsewhere; the
    choice is recorded and keys the vanilla reference cache; a bad value is one clear error."""
    import platform

    import torch

    from core.types import HarnessError

    auto = Runner(make_cfg(tmp_path, "model.dtype=float32"))
    x86 = platform.machine().lower() in ("x86_64", "amd64") and torch.backends.mkldnn.is_available()
    assert auto.engine.linear == ("onednn" if x86 else "aten")
    assert Runner(make_cfg(tmp_path, "model.dtype=bfloat16")).engine.linear == "aten"
    aten = Runner(make_cfg(tmp_path, "model.dtype=float32", "run.linear=aten"))
    assert aten.engine.linear == "aten" and aten.run_id != auto.run_id
    path = aten.run()
    assert pd.read_parquet(path / "runs.parquet")["linear"].iloc[0] == "aten"
    with pytest.raises(HarnessError, match="run.linear must be"):
        Runner(make_cfg(tmp_path, "run.linear=fast"))
    with pytest.raises(HarnessError, match="needs an fp32 model"):
        Runner(make_cfg(tmp_path, "model.dtype=bfloat16", "run.linear=onednn"))


def test_cuda_graphs_choice_keeps_run_ids_and_is_refused_off_cuda(tmp_path):
    """run.cuda_graphs=auto (the default) is off for a CPU model: it keeps earlier runs' ids, as false
    does, and records False; true on a CPU model is one clear error; auto is on for a CUDA model."""
    from types import SimpleNamespace

    from core.types import HarnessError
    from runners.config import resolve_cuda_graphs

    plain = Runner(make_cfg(tmp_path, "model.dtype=float32"))
    assert plain.engine.graphs is None and "cuda_graphs" not in plain.identity
    for choice in ("false", "auto", "null"):
        same = Runner(make_cfg(tmp_path, "model.dtype=float32", f"run.cuda_graphs={choice}"))
        assert same.run_id == plain.run_id
    assert bool(pd.read_parquet(plain.run() / "runs.parquet")["cuda_graphs"].iloc[0]) is False
    with pytest.raises(HarnessError, match="run.cuda_graphs=true needs a CUDA device"):
        Runner(make_cfg(tmp_path, "model.dtype=float32", "run.cuda_graphs=true"))
    with pytest.raises(HarnessError, match="must be true, false, auto or emulate"):
        Runner(make_cfg(tmp_path, "run.cuda_graphs=maybe"))
    on_cuda = SimpleNamespace(device=torch.device("cuda", 0))
    assert resolve_cuda_graphs("auto", on_cuda) and not resolve_cuda_graphs(False, on_cuda)


def test_warmup_repeats_until_its_seconds_have_passed(tmp_path):
    """One untimed warm-up generation on a CPU by default; run.warmup_s=S repeats it until S seconds
    have passed (the GPU default, before clocks settle); neither changes the run's id."""
    from core.types import HarnessError

    runner = Runner(make_cfg(tmp_path))
    sample = runner.task.load()[0]
    assert runner.warmup_s == 0.0 and runner._warmup(sample) == 1
    longer = Runner(make_cfg(tmp_path, "run.warmup_s=0.5"))
    # a generation of fixed length (a real one can take longer than 0.5 s on a busy machine)
    longer.decoder.generate = lambda *args: time.sleep(0.05) or [0]
    assert longer.run_id == runner.run_id and longer._warmup(sample) > 1
    for bad in ("-1", "soon"):
        with pytest.raises(HarnessError, match="run.warmup_s must be"):
            Runner(make_cfg(tmp_path, f"run.warmup_s={bad}"))
    # with CUDA graphs (captured per block size) the warm-up runs the task's whole length
    from core.decode_graph import StaticForwards

    lengths = []
    long = Runner(make_cfg(tmp_path, "run.max_new_tokens=40"))  # longer than the usual warm-up
    long.decoder.generate = lambda ids, n, *rest: lengths.append(n) or [0]
    long._warmup(sample)
    long.engine.graphs = StaticForwards(long.engine, capture=False)
    long._warmup(sample)
    assert lengths == [16, 40]


def test_scale_cpu_run_is_its_own_run_and_labelled(tmp_path):
    """A scale=cpu run records scale=cpu, resolves the preset's KV budget fraction into its identity
    and takes its samples round-robin over categories: never the same run id as the paper protocol."""
    common = ("+task.n=4", "run.limit=2", "kv=streaming", "kv.budget=8")
    paper = Runner(make_cfg(tmp_path, *common))
    cpu = Runner(make_cfg(tmp_path, "scale=cpu", *common))
    assert paper.run_id != cpu.run_id and cpu.identity["stratify"] and "stratify" not in paper.identity
    assert paper.identity["kv_params"]["budget_frac"] is None
    assert cpu.identity["kv_params"]["budget_frac"] == 0.1
    runs = pd.read_parquet(cpu.run() / "runs.parquet")
    assert runs.loc[0, "scale"] == "cpu" and runs.loc[0, "dtype"] == "float32"
    assert pd.read_parquet(paper.run() / "runs.parquet").loc[0, "scale"] == "paper"


def test_block_auto_gets_a_cost_curve_measured_once(tmp_path, monkeypatch):
    """decoder.block=auto: the runner measures this environment's cost curve before timing (once,
    then from the cache), hands it to the decoder and records which curve; block=fixed keeps the run
    id runs had before decoders had a `block` field; a bad mode is one clear error."""
    from core import cost_curve

    monkeypatch.setenv("HARNESS_COST_CACHE", str(tmp_path / "curves"))
    monkeypatch.setattr(cost_curve, "NOISY_SPREAD", float("inf"))  # a tiny model's forwards are all jitter
    monkeypatch.setattr(cost_curve, "FLAT_SLACK", float("inf"))
    measured = []
    real = cost_curve.measure_grid
    monkeypatch.setattr(cost_curve, "measure_grid", lambda *a, **k: measured.append(a[1]) or real(*a, **k))
    fixed = Runner(make_cfg(tmp_path, "decoder=pld"))
    assert "block" not in fixed.identity["decoder_params"]
    auto = Runner(make_cfg(tmp_path, "decoder=pld", "decoder.block=auto"))
    assert auto.run_id != fixed.run_id
    runs = pd.read_parquet(auto.run() / "runs.parquet")
    assert len(measured) == 1 and measured[0][-1] >= auto.decoder.max_block()
    assert runs.loc[0, "cost_curve"] and (tmp_path / "curves" / runs.loc[0, "cost_curve"]).exists()
    samples = pd.read_parquet(auto.rundir.path / "samples.parquet")
    assert samples["matches_vanilla"].all()
    Runner(make_cfg(tmp_path, "decoder=pld", "decoder.block=auto", "run.seed=1")).run()
    assert len(measured) == 1  # the second run reads the cached curve
    assert pd.read_parquet(fixed.run() / "runs.parquet").loc[0, "cost_curve"] == ""
    with pytest.raises(HarnessError, match="block must be one of"):
        Runner(make_cfg(tmp_path, "decoder=pld", "decoder.block=big"))


def test_forward_clock_times_decode_forwards_only_and_unwraps(tmp_path):
    """forward_s sums the target forwards after the prefill mark (not the prefill's), and the engine's
    own step is back once the generation ends; a layer-truncated draft made meanwhile is not wrapped."""
    import torch

    from core.engine import Engine
    from core.models import load_model
    from runners.timing import StepClock

    lm = load_model("tiny", "tiny", arch="llama", dtype="float32", device="cpu", seed=1)
    eng = Engine(lm.model)
    eng.reset(32)
    with StepClock(eng) as clock:
        eng.prefill([1, 2, 3, 4])
        clock.mark()
        assert eng.truncated(1).step.__func__ is Engine.step
        for pos in (4, 5):
            eng.step(torch.tensor([7]), torch.tensor([pos]), CausalView(eng.scale))
            eng.commit([0])
    assert [rows for rows, _, _ in clock.calls] == [4, 1, 1]
    assert clock.seconds_since_mark == pytest.approx(sum(s for _, _, s in clock.calls[1:]))
    assert "step" not in vars(eng)
