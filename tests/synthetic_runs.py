"""Synthetic run records for the analysis and report tests: per-turn rows as the analysis reads them
(`rows`: the FAFO paper's tables; `run_rows` on the environment `BASE`; `synthetic_frame`: a vanilla and
a faster run), and whole complete run folders written through `RunDir` (`write_run`: a paper-report
run with its experiment; `write_synthetic_runs`: `synthetic_frame` as the summary CLI reads it)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from runners.records import SAMPLE_COLUMNS, RunDir, typed_frame

ENV = {"model": "smollm2-135m", "dtype": "bfloat16", "device_name": "cpu: test x2"}


def rows(
    decoder: str,
    kv: str,
    wall: float,
    tau: float,
    task: str = "mtbench",
    n_samples: int = 3,
    **params: object,
) -> list[dict]:
    out = []
    for s in range(n_samples):
        for turn in (0, 1):
            out.append(
                {
                    **ENV,
                    "decoder": decoder,
                    "kv": kv,
                    "task": task,
                    "sample_id": f"q{s}",
                    "turn": turn,
                    "new_tokens": 100,
                    "decode_s": wall * 0.9,
                    "wall_s": wall,
                    "forwards": 50,
                    "tau": tau,
                    "peak_mem_mb": 500.0 + wall,
                    **params,
                }
            )
    return out


BASE = {
    "model": "smollm2-135m",
    "model_name": "smollm2-135m",
    "dtype": "float32",
    "linear": "onednn",
    "device_name": "cpu: test x2 threads",
    "threads": 2,
    "prefill_chunk": 1024,
    "task": "gsm8k",
    "task_params": "{}",
    "task_version": "1",
    "max_new_tokens": 64,
    "seed": 0,
    "sampling": "{}",
    "sample_set": "abc",
    "git_sha": "deadbeef",
}


def run_rows(run_id: str, decoder: str, kv: str, wall: float, n: int = 6, **extra: object) -> list[dict]:
    rng = np.random.default_rng(abs(hash(run_id)) % 2**32)
    return [
        {
            **BASE,
            "run_id": run_id,
            "decoder": decoder,
            "kv": kv,
            "sample_id": f"s{i}",
            "turn": 0,
            "wall_s": wall * (1 + 0.1 * rng.random()),
            "decode_s": wall * 0.9,
            "prefill_s": wall * 0.1,
            "new_tokens": 64,
            "forwards": 40,
            "committed": 63,
            "tau": 63 / 40,
            "peak_mem_mb": 100.0,
            "matches_vanilla": True,
            "restricted_frac": 0.0,
            "error": None,
            **extra,
        }
        for i in range(n)
    ]


def synthetic_frame(n: int = 10) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    for run_id, decoder, slow in (("r-van", "vanilla", 2.0), ("r-fast", "lookahead", 1.0)):
        for i in range(n):
            wall = slow * (1 + rng.random())
            rows.append(
                {
                    "run_id": run_id,
                    "sample_id": str(i),
                    "turn": 0,
                    "wall_s": wall,
                    "decode_s": wall * 0.9,
                    "prefill_s": wall * 0.1,
                    "new_tokens": 50,
                    "forwards": 50 if slow == 2.0 else 25,
                    "committed": 49,
                    "peak_mem_mb": 100.0,
                    "matches_vanilla": True,
                    "error": None,
                    "model": "m",
                    "dtype": "float32",
                    "device_name": "cpu",
                    "task": "t",
                    "max_new_tokens": 50,
                    "decoder": decoder,
                    "kv": "full",
                }
            )
    return pd.DataFrame(rows)


def write_synthetic_runs(root: Path, n: int = 4) -> None:
    """`synthetic_frame(n)` written as complete runs under `root/runs/` (what the summary CLI reads)."""
    df = synthetic_frame(n)
    for run_id, run in df.groupby("run_id"):
        rd = RunDir(root / "runs", run_id)
        rd.path.mkdir(parents=True)
        rd.write_run(
            {
                "run_id": run_id,
                "status": "complete",
                "decoder": run["decoder"].iloc[0],
                "kv": "full",
                "task": "t",
                "model": "m",
                "model_name": "m",
                "dtype": "float32",
                "device_name": "cpu",
                "max_new_tokens": 50,
                "seed": 0,
                "lossless": True,
                "git_sha": "x",
                "decoder_params": json.dumps({"_target_": "x", "k": 3}),
                "kv_params": "{}",
            }
        )
        cols = [c for c in SAMPLE_COLUMNS if c in run.columns]
        rd.write_sample(
            "all",
            typed_frame(run[cols].to_dict("records"), {c: SAMPLE_COLUMNS[c] for c in cols}).to_dict(
                "records"
            ),
            [],
            [],
        )
        rd.consolidate()
        rd.mark_complete()


def write_run(
    root,
    run_id: str,
    decoder: str,
    kv: str,
    experiment: str,
    wall: float,
    steps=(),
    device: str = "cpu: test",
    task: str = "pg19",
    sha: str = "abc",
    **params,
) -> None:
    rd = RunDir(root / "runs", run_id)
    rd.path.mkdir(parents=True)
    dec = {"_target_": "x", **{k: v for k, v in params.items() if k.startswith("gamma") or k == "n"}}
    rd.write_run(
        {
            "run_id": run_id,
            "status": "complete",
            "decoder": decoder,
            "kv": kv,
            "task": task,
            "task_params": json.dumps({"context_length": 4096} if task == "pg19" else {}),
            "model": "smollm2-135m",
            "model_name": "smollm2-135m",
            "dtype": "float32",
            "device_name": device,
            "threads": 2,
            "max_new_tokens": 64,
            "seed": 0,
            "lossless": True,
            "git_sha": sha,
            "experiment": experiment,
            "draft": "self_layers" if decoder == "triforce" else "none",
            "draft_params": json.dumps(
                {"label": "self-draft: first 4 of 30 layers"} if decoder == "triforce" else {}
            ),
            "decoder_params": json.dumps(dec),
            "kv_params": "{}",
        }
    )
    rows = [
        {
            "run_id": run_id,
            "sample_id": f"s{i}",
            "turn": 0,
            "new_tokens": 64,
            "wall_s": wall,
            "decode_s": wall - 1,
            "forwards": 16 if decoder != "vanilla" else 63,
            "committed": 63,
            "drafted": 40,
            "accepted": 30,
            "drafted_l1": 20,
            "accepted_l1": 2,
            "kv_read_mb": 100.0 if decoder == "vanilla" else 40.0,
            "matches_vanilla": True,
            "prompt_tokens": 100,
        }
        for i in range(2)
    ]
    cols = [c for c in SAMPLE_COLUMNS if c in rows[0]]
    step_rows = [{"run_id": run_id, "sample_id": f"s{i}", "turn": 0, **st} for i in range(2) for st in steps]
    rd.write_sample(
        "all", typed_frame(rows, {c: SAMPLE_COLUMNS[c] for c in cols}).to_dict("records"), step_rows, []
    )
    rd.consolidate()
    rd.mark_complete()
