"""A two-job sweep through hydra-submitit-launcher's local executor (the SLURM pickling path)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]


def test_submitit_local_two_job_sweep(tmp_path):
    cmd = [
        sys.executable,
        str(REPO / "run.py"),
        "-m",
        "launcher=submitit_local",
        "model=tiny_llama",
        "task._target_=tests.fake_task.FakeTask",
        "+task.n=1",
        "run.max_new_tokens=4",
        "run.warmup=false",
        "run.limit=null",
        "run.seed=0,1",
        f"run.out_dir={tmp_path}",
        f"hydra.sweep.dir={tmp_path}/multirun",
    ]
    res = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=600,
        env={**__import__("os").environ, "PYTHONPATH": str(REPO)},
    )
    assert res.returncode == 0, res.stderr[-2000:]
    runs = sorted((tmp_path / "runs").iterdir())
    assert len(runs) == 2 and all((r / "COMPLETE").exists() for r in runs)
    seeds = sorted(int(pd.read_parquet(r / "runs.parquet").loc[0, "seed"]) for r in runs)
    assert seeds == [0, 1]
    assert len(list((tmp_path / "multirun").glob("**/.submitit"))) or (tmp_path / "multirun").exists()


def _sweep(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        str(REPO / "run.py"),
        "-m",
        *args,
        "debug=quick",
        "run.max_new_tokens=8,5000",  # job 1 asks for more than the model's context: seen only once it loads
        f"run.out_dir={tmp_path}",
        f"hydra.sweep.dir={tmp_path}/multirun",
    ]
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600, env=env)


@pytest.mark.parametrize("launcher", [[], ["launcher=submitit_local"]], ids=["local", "submitit_local"])
def test_one_bad_job_does_not_stop_the_sweep(tmp_path, launcher):
    res = _sweep(tmp_path, *launcher)
    assert res.returncode != 0
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 2, res.stderr[-2000:]
    assert errors[0].startswith("error: job 1 (") and "max_new_tokens=5000" in errors[0]
    assert "exceeds the model context" in errors[0]
    assert errors[1] == "error: 1 sweep job(s) failed (each named in an 'error: job' line)"
    assert "Traceback" not in res.stderr
    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and (runs[0] / "COMPLETE").exists()  # the good job ran; the bad wrote nothing


def test_a_sweep_with_a_bad_value_runs_no_job_and_writes_nothing(tmp_path):
    """A value out of range in any job of a sweep is refused before the first job starts."""
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        str(REPO / "run.py"),
        "-m",
        "debug=quick",
        "run.max_new_tokens=8,-1",
        f"run.out_dir={out}",
    ]
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO)}
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600, env=env)
    assert res.returncode == 2
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: job 1 (") and "no job was run" in lines[0]
    assert "run.max_new_tokens must be an integer >= 1" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == []
