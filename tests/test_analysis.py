"""Analysis on a synthetic table: speedup is the ratio of totals on paired samples, with a CI."""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.metrics import bootstrap_ratio, summarize
from analysis.summary import main as summary_main
from tests.synthetic_runs import synthetic_frame, write_synthetic_runs


def test_speedup_is_ratio_of_paired_totals():
    df = synthetic_frame()
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


def test_summary_cli_on_written_records(tmp_path):
    write_synthetic_runs(tmp_path)
    table = summary_main(["--root", str(tmp_path)])
    assert set(table["decoder"]) == {"vanilla", "lookahead"}
    assert (tmp_path / "figures" / "summary.png").stat().st_size > 1000


def test_a_turn_the_baseline_lacks_gives_no_speedup():
    df = synthetic_frame()
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
