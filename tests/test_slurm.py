"""A real SLURM (scripts/slurm_local.sh): a two-job sweep through sbatch, one job cancelled mid-run,
the same command again completes it with no lost and no duplicated rows."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
# Samples per job: enough that a job still has work when it is cancelled (a tiny-model sample takes
# about a second, and scancel's SIGKILL follows its SIGTERM only after KillWait).
N_SAMPLES = 24


def _slurm_idle() -> str | None:
    """None when a SLURM node is idle here, else why the test cannot run."""
    if shutil.which("sinfo") is None:
        return "no SLURM here (sinfo not found; scripts/slurm_local.sh start installs a local one)"
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"sinfo failed: {exc}"
    if "idle" not in out.stdout:
        return f"no idle SLURM node (sinfo: {out.stdout.strip() or out.stderr.strip()})"
    return None


pytestmark = [pytest.mark.slurm, pytest.mark.skipif(_slurm_idle() is not None, reason=str(_slurm_idle()))]


def _sweep(tmp: Path) -> subprocess.Popen:
    cmd = [
        sys.executable,
        str(REPO / "run.py"),
        "-m",
        "launcher=slurm",
        "cluster=cpu",
        "model=tiny_llama",
        "task._target_=tests.fake_task.FakeTask",
        f"+task.n={N_SAMPLES}",
        "+task.ignore_eos=true",
        "run.limit=null",
        "run.max_new_tokens=1200",
        "run.warmup=false",
        "run.audit=false",
        "decoder=vanilla,pld",
        f"run.out_dir={tmp}",
        f"hydra.sweep.dir={tmp}/multirun",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _parts(tmp: Path, decoder: str) -> list[Path]:
    return sorted(tmp.glob(f"runs/*-{decoder}-full-*/parts/*.samples.parquet"))


def _running_jobs() -> list[str]:
    out = subprocess.run(["squeue", "-h", "-t", "R", "-o", "%i"], capture_output=True, text=True, timeout=10)
    return out.stdout.split()


def _wait_for_empty_queue(jobs: list[str], timeout: float = 60) -> None:
    """Until none of `jobs` (every job when empty) is in the queue any more."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        queued = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout.split()
        if not (set(queued) & set(jobs) if jobs else queued):
            return
        time.sleep(0.5)
    raise AssertionError(f"SLURM jobs still queued after {timeout:.0f} s: {queued}")


def test_cancelled_job_resumes_without_lost_or_duplicated_rows(tmp_path):
    first = _sweep(tmp_path)
    try:
        deadline = time.time() + 120
        while len(_parts(tmp_path, "vanilla")) < 2:  # the first job has finished two samples
            assert time.time() < deadline and first.poll() is None, "the first job never got going"
            time.sleep(0.5)
        jobs = _running_jobs()
        assert jobs, "no running SLURM job to cancel"
        subprocess.run(["scancel", *jobs], check=True, timeout=10)  # SIGKILL follows after KillWait
        # Without SLURM accounting submitit never learns that a job was cancelled and waits: the user
        # stops the launcher and the rest of the array, then reruns the same command.
        _wait_for_empty_queue(jobs)
        first.terminate()
        first.communicate(timeout=30)
        subprocess.run(["scancel", "-u", "root"], timeout=10)
        _wait_for_empty_queue([])
    finally:
        if first.poll() is None:
            first.kill()
    kept = {p.name: p.stat().st_mtime_ns for p in _parts(tmp_path, "vanilla")}
    run_dir = next(tmp_path.glob("runs/*-vanilla-full-*"))
    assert not (run_dir / "COMPLETE").exists() and len(kept) < N_SAMPLES  # really cut mid-run

    out, _ = _sweep(tmp_path).communicate(timeout=300)
    runs = sorted(tmp_path.glob("runs/*-full-*"))
    assert len(runs) == 2 and all((r / "COMPLETE").exists() for r in runs), out[-3000:]
    for r in runs:
        samples = pd.read_parquet(r / "samples.parquet")
        assert len(samples) == 2 * N_SAMPLES and not samples.duplicated(["sample_id", "turn"]).any()
        assert samples["error"].isna().all()
    now = {p.name: p.stat().st_mtime_ns for p in _parts(tmp_path, "vanilla")}
    assert all(now[name] == mtime for name, mtime in kept.items())  # resumed, not redone
    subprocess.run(["scancel", "-u", "root"], timeout=10)
