"""A real SLURM (scripts/slurm_local.sh): a two-job sweep through sbatch, one job cancelled mid-run,
the same command again completes it with no lost and no duplicated rows.

Safe on a shared cluster: the sweep's jobs carry a job name unique to this test, and only the jobs of
that name are ever cancelled. The deadline follows the machine: the first job's first samples set the
pace, and the rest of the work gets a generous multiple of it. Whether the test passes, fails or runs
out of time (SIGTERM included), its launchers are killed and its jobs cancelled and gone from the queue.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest

REPO = Path(__file__).resolve().parents[1]
N_SAMPLES = 16  # per job: the first job is cancelled once two are done, with enough left to cut it mid-run
# scoring each sample waits this long, so that the samples a job finishes between the cancel and the
# SIGKILL (KillWait, 2 s in scripts/slurm_local.sh, plus the polling) stay well short of N_SAMPLES on a
# machine that generates a tiny model's sample in a fraction of a second
SAMPLE_DELAY_S = 0.5
SLACK = 6.0  # the deadline's multiple of the time the measured pace predicts
FLOOR_S = 120.0  # never less than this (job start-up, the launcher's polling)


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


class Sweep:
    """This test's launchers and SLURM jobs, and nothing else: the jobs are found by their job name."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.name = f"harness-test-{uuid.uuid4().hex[:12]}"
        self.launchers: list[subprocess.Popen] = []

    def start(self) -> subprocess.Popen:
        cmd = [
            sys.executable,
            str(REPO / "run.py"),
            "-m",
            "launcher=slurm",
            "cluster=cpu",
            f"hydra.launcher.name={self.name}",
            "model=tiny_llama",
            "task._target_=tests.fake_task.FakeTask",
            f"+task.n={N_SAMPLES}",
            f"+task.delay_s={SAMPLE_DELAY_S}",
            "+task.ignore_eos=true",
            "run.limit=null",
            "run.max_new_tokens=300",
            "run.warmup=false",
            "run.audit=false",
            "decoder=vanilla,pld",
            f"run.out_dir={self.tmp}",
            f"hydra.sweep.dir={self.tmp}/multirun",
        ]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # its own process group: killed as one, children included
        )
        self.launchers.append(proc)
        return proc

    def jobs(self, state: str | None = None) -> list[str]:
        cmd = ["squeue", "-h", "-n", self.name, "-o", "%i"] + (["-t", state] if state else [])
        return subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout.split()

    def cancel(self, jobs: list[str]) -> None:
        if jobs:
            subprocess.run(["scancel", *jobs], timeout=10)

    def stop_launchers(self) -> None:
        for proc in self.launchers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)

    def wait_gone(self, jobs: list[str] | None = None, timeout: float = 60) -> None:
        """Until none of `jobs` (all of this test's when None) is queued any more."""
        deadline = time.time() + timeout
        while True:
            queued = set(self.jobs())
            left = queued & set(jobs) if jobs is not None else queued
            if not left:
                return
            if time.time() > deadline:
                raise AssertionError(f"SLURM jobs still queued after {timeout:.0f} s: {sorted(left)}")
            time.sleep(0.5)

    def clean_up(self) -> None:
        """Kill the launchers, cancel every job of this test, and wait for the queue to drop them."""
        self.stop_launchers()
        self.cancel(self.jobs())
        self.wait_gone()


@pytest.fixture
def sweep(tmp_path):
    """A Sweep cleaned up afterwards, also when the test is stopped by SIGTERM (a `timeout` around it)."""
    s = Sweep(tmp_path)

    def on_term(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the clean-up below must not be cut short
        raise TimeoutError(f"stopped by signal {signum}: cleaning up this test's launchers and jobs")

    before = signal.signal(signal.SIGTERM, on_term)
    try:
        yield s
    finally:
        try:
            s.clean_up()
        finally:
            signal.signal(signal.SIGTERM, before)
    assert not s.jobs(), "jobs of this test left in the queue"


def _parts(tmp: Path, decoder: str) -> list[Path]:
    return sorted(tmp.glob(f"runs/*-{decoder}-full-*/parts/*.samples.parquet"))


def _wait_for(what: str, until, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.time() + timeout
    while not until():
        if proc.poll() is not None:
            raise AssertionError(f"the launcher exited ({proc.returncode}) before {what}")
        if time.time() > deadline:
            raise AssertionError(f"{what}: not after {timeout:.0f} s")
        time.sleep(0.5)


def test_cancelled_job_resumes_without_lost_or_duplicated_rows(sweep, tmp_path):
    first = sweep.start()
    start = time.time()
    _wait_for("the first job finished a sample", lambda: len(_parts(tmp_path, "vanilla")) >= 1, first, 600)
    _wait_for("the first job finished two samples", lambda: len(_parts(tmp_path, "vanilla")) >= 2, first, 600)
    stamps = sorted(p.stat().st_mtime for p in _parts(tmp_path, "vanilla"))
    per_sample = max(stamps[1] - stamps[0], 0.5)  # this machine's pace, under whatever load it has now
    jobs = sweep.jobs("R")
    assert jobs, "no running SLURM job of this test to cancel"
    sweep.cancel(jobs)  # SIGKILL follows the SIGTERM after KillWait
    # Without SLURM accounting submitit never learns that a job was cancelled and waits: the user
    # stops the launcher and the rest of the array, then reruns the same command.
    sweep.wait_gone(jobs)
    sweep.clean_up()
    kept = {p.name for p in _parts(tmp_path, "vanilla")}
    run_dir = next(tmp_path.glob("runs/*-vanilla-full-*"))
    assert not (run_dir / "COMPLETE").exists() and len(kept) < N_SAMPLES  # really cut mid-run
    kept_rows = pd.concat(pd.read_parquet(p) for p in _parts(tmp_path, "vanilla"))

    deadline = max(FLOOR_S, SLACK * (2 * N_SAMPLES * per_sample + (time.time() - start) / 2))
    second = sweep.start()
    try:
        out, _ = second.communicate(timeout=deadline)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the rerun did not finish in {deadline:.0f} s") from None
    assert out.count("accounting") <= 1, out[-3000:]  # the launcher says sacct is off once, at most
    runs = sorted(tmp_path.glob("runs/*-full-*"))
    assert len(runs) == 2 and all((r / "COMPLETE").exists() for r in runs), out[-3000:]
    for r in runs:
        samples = pd.read_parquet(r / "samples.parquet")
        assert len(samples) == 2 * N_SAMPLES and not samples.duplicated(["sample_id", "turn"]).any()
        assert samples["error"].isna().all()
    final = pd.read_parquet(run_dir / "samples.parquet").set_index(["sample_id", "turn"])
    kept_rows = kept_rows.set_index(["sample_id", "turn"])
    assert (final.loc[kept_rows.index, "wall_s"] == kept_rows["wall_s"]).all()  # resumed, not redone
