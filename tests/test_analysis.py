"""Analysis on a synthetic table: speedup is the ratio of totals on paired samples, with a CI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.metrics import bootstrap_ratio, summarize
from analysis.summary import main as summary_main
from runners.records import SAMPLE_COLUMNS, RunDir, typed_frame


def _synthetic(n: int = 10) -> pd.DataFrame:
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


def test_speedup_is_ratio_of_paired_totals():
    df = _synthetic()
    table = summarize(df).set_index("decoder")
    paired = df
    expect = (
        paired[paired.decoder == "vanilla"]["wall_s"].sum()
        / paired[paired.decoder == "lookahead"]["wall_s"].sum()
    )
    assert abs(table.loc["lookahead", "speedup"] - expect) < 1e-12
    assert table.loc["lookahead", "speedup_lo"] <= expect <= table.loc["lookahead", "speedup_hi"]
    assert table.loc["vanilla", "speedup"] == 1.0
    assert table.loc["lookahead", "paired_turns"] == 10


def test_bootstrap_interval_narrows_with_more_samples():
    rng = np.random.default_rng(1)

    def width(n):
        num, den = pd.Series(rng.random(n) + 1), pd.Series(rng.random(n) + 0.5)
        lo, hi = bootstrap_ratio(num, den, pd.Series(range(n)))
        return hi - lo

    assert width(400) < width(10)


def write_synthetic_runs(root: Path, n: int = 4) -> None:
    """`_synthetic(n)` written as complete runs under `root/runs/` (what the summary CLI reads)."""
    df = _synthetic(n)
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


def test_summary_cli_on_written_records(tmp_path):
    write_synthetic_runs(tmp_path)
    table = summary_main(["--root", str(tmp_path)])
    assert set(table["decoder"]) == {"vanilla", "lookahead"}
    assert (tmp_path / "figures" / "summary.png").stat().st_size > 1000


def test_a_turn_the_baseline_lacks_gives_no_speedup():
    df = _synthetic()
    df = pd.concat([df, df.tail(1).assign(sample_id="extra")], ignore_index=True)  # lookahead only
    row = summarize(df).set_index("decoder").loc["lookahead"]
    assert np.isnan(row["speedup"]) and "baseline lacks 1" in row["note"]


def test_caption_names_every_code_version_of_its_runs():
    """A table made from runs of several code versions says so in its caption, with runs per version;
    one version is named whole as before."""
    from analysis.metrics import code_versions, ours_setup

    sha_a, sha_b = "a" * 40, "b" * 40 + "-dirty-0123456789"
    one = pd.DataFrame({"git_sha": [sha_a, sha_a], "run_id": ["r1", "r1"]})
    assert code_versions(one) == f"code {sha_a}"
    mixed = pd.DataFrame({"git_sha": [sha_a, sha_b, sha_b, sha_b], "run_id": ["r1", "r2", "r3", "r3"]})
    assert code_versions(mixed) == "code versions bbbbbbbbbb-dirty-0123456789 (2 runs), aaaaaaaaaa (1 run)"
    assert ours_setup(mixed.assign(model="m", dtype="float32", device_name="cpu")).endswith(
        "code versions bbbbbbbbbb-dirty-0123456789 (2 runs), aaaaaaaaaa (1 run)"
    )
    assert code_versions(pd.DataFrame({"x": [1]})) == "code ?"


def test_caption_states_threads_once():
    from analysis.metrics import ours_setup

    row = {"git_sha": "a" * 40, "run_id": "r", "model": "m", "dtype": "float32", "threads": 2}
    named = pd.DataFrame([dict(row, device_name="cpu: AMD EPYC x2 threads")])
    assert ours_setup(named, threads=True).count("threads") == 1
    bare = pd.DataFrame([dict(row, device_name="cuda: NVIDIA H100")])
    assert "cuda: NVIDIA H100, 2 threads, code" in ours_setup(bare, threads=True)
