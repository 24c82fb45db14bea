"""What can be refused before the model loads or anything is generated is refused then: a second
identical command (before loading its model), a later turn that may overflow the model's context (before
the first token), and the W&B mirror never holds the run's lock while it waits for its server."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.types import HarnessError
from runners import runner as runner_module
from runners.lock import CommandLock
from runners.runner import Runner, command_key, run
from tests.helpers import make_cfg

REPO = Path(__file__).resolve().parents[1]


def test_a_second_identical_command_is_refused_before_its_model_loads(tmp_path, monkeypatch):
    cfg = make_cfg(tmp_path, "+task.n=1")
    built = []
    monkeypatch.setattr(runner_module, "build", lambda *a, **k: built.append(a) or 1 / 0)
    with CommandLock(tmp_path / "runs", command_key(cfg)):  # the first command, still running
        with pytest.raises(HarnessError, match=r"the same run is already running \(pid \d+ on .* since"):
            run(make_cfg(tmp_path, "+task.n=1"))
        assert not built  # refused before anything was loaded
        other = make_cfg(tmp_path, "+task.n=1", "run.seed=1")  # another run is not held up
        assert command_key(other) != command_key(cfg)
        with pytest.raises(ZeroDivisionError):
            run(other)
    assert not (tmp_path / "runs").exists()  # the lock files and the folder made for them are gone


def test_the_command_key_ignores_what_does_not_change_the_run(tmp_path):
    base = command_key(make_cfg(tmp_path))
    assert base == command_key(make_cfg(tmp_path, "run.warmup=true", "wandb.enabled=true", "run.audit=false"))
    assert base != command_key(make_cfg(tmp_path, "decoder=pld"))
    assert base != command_key(make_cfg(tmp_path, "run.max_new_tokens=7"))


def test_wandb_waits_briefly_and_never_inside_the_run_lock(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    seen = {}

    def init(**kw):
        (lock,) = (tmp_path / "runs").glob("*/LOCK")
        with open(lock) as fh:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                seen["lock free"] = True
                fcntl.flock(fh, fcntl.LOCK_UN)
            except BlockingIOError:
                seen["lock free"] = False
        seen["timeout"] = kw["settings"].init_timeout
        raise ConnectionError("no network")

    monkeypatch.setattr(wandb, "init", init)
    path = Runner(make_cfg(tmp_path, "wandb.enabled=true", "+task.n=1")).run()
    assert (path / "COMPLETE").exists()
    assert seen["lock free"] and seen["timeout"] <= 10


def test_a_later_turn_that_may_overflow_the_context_is_refused_before_generating(tmp_path, monkeypatch):
    generated = []
    monkeypatch.setattr(Runner, "_generate", lambda self, prompt: generated.append(prompt) or 1 / 0)
    # tiny_llama holds 4096 positions: turn 0 (a short prompt + 2100) fits, turn 1 (+ 2 x 2100) cannot
    runner = Runner(make_cfg(tmp_path, "+task.n=2", "run.max_new_tokens=2100", "+task.ignore_eos=true"))
    with pytest.raises(HarnessError, match=r"sample s0 turn 1: prompt of \d+ tokens \+ 1 earlier answer"):
        runner.run()
    assert not generated and not (tmp_path / "runs").exists()


def _run_py(*args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    cmd = [sys.executable, str(REPO / "run.py"), *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)


def test_ctrl_c_is_one_line_and_the_same_command_resumes(tmp_path):
    # each sample's scoring sleeps 3 s: the signal comes while the second or third sample runs
    task = ("task._target_=tests.fake_task.FakeTask", "+task.n=3", "+task.delay_s=3", "run.limit=null")
    args = ("debug=quick", *task, "run.count_syncs=0", f"run.out_dir={tmp_path}")
    first = _run_py(*args)
    deadline = time.monotonic() + 300
    while not list(tmp_path.glob("runs/*/parts/*.samples.parquet")) and time.monotonic() < deadline:
        time.sleep(0.2)
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=120)
    lines = [line for line in err.splitlines() if line.strip()]
    assert first.returncode == 130 and len(lines) == 1 and lines[0].startswith("interrupted: "), err[-2000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert not (run_dir / "COMPLETE").exists() and not list(tmp_path.glob("runs/.command-*"))
    again = _run_py(*args)
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0 and (run_dir / "COMPLETE").exists(), err[-2000:]
    assert "[run] resuming" in out and "samples already done" in out


def test_a_sweep_job_the_machine_fails_is_named_and_the_sweep_goes_on(tmp_path):
    res = _run_py(
        "-m",
        "debug=quick",
        "task._target_=tests.raising_task.RaisingTask",
        "+task.n=1",
        "+task.fails=disk,none,memory",
        f"run.out_dir={tmp_path}",
    )
    _, err = res.communicate(timeout=600)
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert res.returncode != 0 and "Traceback" not in err, err[-2000:]
    assert errors[0].startswith("error: job 0 (") and "No space left on device" in errors[0], errors
    assert errors[1].startswith("error: job 2 (") and "out of memory (cannot allocate 64 GiB)" in errors[1]
    assert errors[2] == "error: 2 sweep job(s) failed (each named in an 'error: job' line)"
    (done,) = (tmp_path / "runs").iterdir()  # the job between them ran
    assert (done / "COMPLETE").exists()
