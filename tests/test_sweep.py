"""A two-job sweep through hydra-submitit-launcher's local executor (the SLURM pickling path)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd

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
