"""runners.paper_runs: every entry of conf/paper_runs.yaml composes into the slice its records carry,
stale slices (uncommitted code, several commits) are found, and a rerun replaces exactly a slice's CPU
records."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from runners import paper_runs


def _record(
    records: Path, name: str, experiment: str, sha: str, device: str = "cpu: AMD EPYC x2 threads"
) -> Path:
    folder = records / "runs" / name
    folder.mkdir(parents=True)
    run = {
        "experiment": experiment,
        "model": "smollm2-135m",
        "scale": "cpu",
        "git_sha": sha,
        "device_name": device,
    }
    pd.DataFrame([run]).to_parquet(folder / "runs.parquet")
    pd.DataFrame([{"prefill_s": 1.0, "decode_s": 29.0}]).to_parquet(folder / "samples.parquet")
    return folder


def test_every_entry_composes_into_its_records_slice():
    plan = paper_runs.load_plan()
    assert {e.group for e in plan} == {"cpu", "slice8", "qwen", "qwen15"}
    slices = {paper_runs.slice_of(e) for e in plan}
    assert ("fafo_table1", "smollm2-135m", "cpu") in slices
    assert ("fafo_table1", "smollm2-135m", "paper_slice8") in slices
    assert ("triforce_table1_qwen_cpu", "qwen25-coder-0.5b", "cpu_experiment") in slices
    assert ("triforce_table1_qwen_cpu", "qwen25-coder-1.5b", "cpu_experiment") in slices
    assert ("fafo_table10", "smollm2-135m", "paper") in slices


def test_stale_slices_and_a_rerun_replaces_only_their_cpu_records(tmp_path, capsys):
    records = tmp_path / "records"
    a = _record(records, "a", "fafo_table11", "1" * 40)
    b = _record(records, "b", "fafo_table11", "2" * 40 + "-dirty-0123456789")
    c = _record(records, "c", "fafo_table12", "1" * 40)
    gpu = _record(records, "g", "fafo_table11", "3" * 40, device="NVIDIA H200")
    runs = paper_runs.record_slices(records)
    assert len(runs) == 3  # GPU records are not this tool's
    assert paper_runs.stale(runs) == {
        ("fafo_table11", "smollm2-135m", "cpu"): "2 code versions, 1 runs from uncommitted code"
    }
    argv = ["--records", str(records), "--experiment", "fafo_table11", "fafo_table12", "--stale", "--rerun"]
    assert paper_runs.main([*argv, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "stale fafo_table11/smollm2-135m/cpu: 2 code versions" in out and "~1 min" in out
    assert "rerun fafo_table11/smollm2-135m/cpu: 2 recorded runs replaced" in out
    assert "experiment=fafo_table11 scale=cpu run.out_dir=" in out and "fafo_table12" not in out
    assert a.exists() and b.exists() and c.exists() and gpu.exists()  # a dry run touches nothing


def test_bad_group_is_one_line(capsys):
    assert paper_runs.main(["--group", "gpu", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --group takes cpu, qwen, qwen15, slice8") and err.count("\n") == 1
