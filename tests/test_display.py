"""Output that reads clean (analysis.display): the end-of-run table and the summary fit 120 columns,
labels name only what differs between the runs shown (the rest in a legend) and tell every two runs
apart, exactness is counted as exact / within a numerical tie / diverged, the per-sample counters show
where the records hold them; and `model.dtype=auto` on a CPU is float32."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from analysis import display
from analysis.metrics import ENV, summarize
from analysis.summary import BLOCK, report_lines, with_run_details
from analysis.summary import main as summary_main
from runners.records import SAMPLE_COLUMNS, RunDir, typed_frame
from runners.report import print_summary
from tests.synthetic_runs import BASE, run_rows

COUNTER_COLUMNS = ("static_frac", "syncs_per_step", "host_ms_per_forward")


def runs_table(*runs: dict) -> pd.DataFrame:
    """One row per run, on the environment of `BASE` unless a run says otherwise."""
    return pd.DataFrame([{**BASE, "kv": "full", "draft": "none", **r} for r in runs])


def fits(lines: list[str]) -> bool:
    return all(len(line) <= display.WIDTH for line in lines)


# --- labels and legend ------------------------------------------------------------------------------
def test_labels_name_only_the_parameters_that_differ_and_the_legend_holds_the_rest():
    table = runs_table(
        {"run_id": "a", "decoder": "fafo", "decoder.k": 6, "decoder.n": 40, "decoder.seed": 0},
        {"run_id": "b", "decoder": "fafo", "decoder.k": 4, "decoder.n": 40, "decoder.seed": 0},
        {"run_id": "c", "decoder": "fafo", "decoder.k": 6, "decoder.n": 20, "decoder.seed": 0},
        {"run_id": "d", "decoder": "vanilla"},
        {"run_id": "e", "decoder": "pld", "kv": "streaming", "kv.budget": 64, "decoder.k": 3},
    )
    lay = display.layout(table, ENV, BLOCK)
    assert lay.labels == ["fafo k=6 n=40", "fafo k=4 n=40", "fafo k=6 n=20", "vanilla", "pld+streaming"]
    assert set(lay.headers) == {""}  # one environment: nothing to set a block apart
    legend = "\n".join(display.legend_lines(lay.legend))
    assert "legend: all runs: task gsm8k, tokens 64, model smollm2-135m, dtype float32" in legend
    assert "fafo: decoder.seed=0" in legend and "pld+streaming: decoder.k=3 kv.budget=64" in legend
    assert fits(display.legend_lines(lay.legend))


@pytest.mark.parametrize(
    ("field", "a", "b"), [("max_new_tokens", 24, 32), ("seed", 0, 1), ("git_sha", "a" * 40, "b")]
)
def test_two_runs_that_differ_in_one_field_are_told_apart(field, a, b):
    table = runs_table(
        {"run_id": "x", "decoder": "pld", field: a}, {"run_id": "y", "decoder": "pld", field: b}
    )
    flat = display.layout(table, ENV)
    assert flat.labels[0] != flat.labels[1]
    blocks = display.layout(table, ENV, BLOCK)  # the summary's blocks: the label or the header differs
    assert (blocks.headers[0], blocks.labels[0]) != (blocks.headers[1], blocks.labels[1])
    if field == "max_new_tokens":  # inside one block, in the label itself
        assert blocks.labels == ["pld tokens=24", "pld tokens=32"]


def test_too_many_differing_parameters_give_a_numbered_label_defined_in_the_legend():
    long = {f"decoder.parameter_{i}": 0 for i in range(6)}
    table = runs_table(
        {"run_id": "a", "decoder": "sfi", **long},
        {"run_id": "b", "decoder": "sfi", **{k: 1 for k in long}},
        {"run_id": "c", "decoder": "sfi", "decoder.note": "x" * 60},
    )
    lay = display.layout(table, ENV)
    assert all(len(label) <= display.MAX_LABEL for label in lay.labels)
    assert len(set(lay.labels)) == 3
    assert lay.labels == ["sfi#1", "sfi#2", "sfi note#1"]
    assert "sfi#1: parameter_0=0 parameter_1=0" in lay.legend[1] and lay.legend[-1] == f"note#1 = {'x' * 60}"


# --- exactness --------------------------------------------------------------------------------------
DIVERGING = pd.DataFrame(
    {
        "error": [None] * 5,
        "matches_vanilla": pd.array([True, False, False, False, None], dtype="boolean"),
        "divergence_gap": [None, 0.0, 0.125, 0.5, None],
    }
)


def test_exactness_counts_ties_by_the_dtype_rounding():
    assert display.exactness(DIVERGING, "bfloat16") == (1, 2, 1)
    assert display.exactness(DIVERGING, "float32") == (1, 1, 2)  # only the exact tie is within 1e-4
    assert display.exactness(DIVERGING, "int8") == (1, 0, 3)  # no tolerance known: every difference counts
    assert display.exactness_text(display.exactness(DIVERGING, "bfloat16")) == "1/2/1"
    assert display.exactness_text(display.exactness(DIVERGING.iloc[[4]], "bfloat16")) == "-"  # not audited


# --- the end-of-run table ---------------------------------------------------------------------------
def write_run(root: Path, run_id: str, rows: list[dict], **run: object) -> Path:
    """A complete run folder holding `rows` as its samples."""
    rd = RunDir(root / "runs", run_id)
    rd.path.mkdir(parents=True)
    first = rows[0]
    rd.write_run(
        {
            **{k: first[k] for k in BASE},
            "run_id": run_id,
            "status": "complete",
            "decoder": first["decoder"],
            "kv": first["kv"],
            "lossless": True,
            "decoder_params": json.dumps({"_target_": "x", "k": 6, "n": 40}),
            "kv_params": json.dumps({"_target_": "y", "budget": 48}),
            **run,
        }
    )
    cols = [c for c in rows[0] if c in SAMPLE_COLUMNS]
    typed = typed_frame([{c: r[c] for c in cols} for r in rows], {c: SAMPLE_COLUMNS[c] for c in cols})
    frame = typed.assign(**{c: [r[c] for r in rows] for c in COUNTER_COLUMNS if c in rows[0]})
    rd.write_sample("all", frame.to_dict("records"), [], [])
    rd.consolidate()
    rd.mark_complete()
    return rd.path


def diverging_rows(run_id: str, decoder: str, kv: str, **extra: object) -> list[dict]:
    rows = run_rows(run_id, decoder, kv, 2.0, n=5, **extra)
    for row, (m, gap) in zip(rows, zip(DIVERGING["matches_vanilla"], DIVERGING["divergence_gap"])):
        row.update(matches_vanilla=None if m is pd.NA else bool(m), divergence_gap=gap)
        row.update(prompt_tokens=100, kv_budget=48, visible_frac=0.5, restricted_frac=0.5, forward_s=1.0)
    return rows


def test_end_of_run_table_fits_120_columns_with_counts_counters_and_legend(tmp_path, capsys):
    long_device = "cpu: AMD EPYC 9654 96-Core Processor x2 threads"
    counters = {"static_frac": 0.75, "syncs_per_step": 1.5, "host_ms_per_forward": 0.42}
    rows = diverging_rows("r1", "fafo", "streaming", dtype="bfloat16", device_name=long_device, **counters)
    path = write_run(tmp_path, "r1", rows)
    print_summary(path)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert fits(lines), [len(line) for line in lines]
    assert "exact/tie/div" in out and "1/2/1" in out and "matches vanilla" not in out
    assert "static" in out and "75%" in out and "syncs/step" in out and "host ms/fwd" in out
    assert "legend: fafo+streaming: decoder.k=6 decoder.n=40 kv.budget=48" in out
    assert "kv restricted" in out and "50%" in out


def test_end_of_run_table_of_old_records_has_no_counter_columns(tmp_path, capsys):
    path = write_run(tmp_path, "r1", diverging_rows("r1", "pld", "full"))
    print_summary(path)
    out = capsys.readouterr().out
    assert "static" not in out and "syncs/step" not in out and "host ms/fwd" not in out
    assert "1/1/2" in out and fits(out.splitlines())  # float32: only the zero gap is a tie


# --- the summary ------------------------------------------------------------------------------------
def test_summary_fits_120_columns_and_labels_every_run_apart(tmp_path, capsys):
    rows = run_rows("van", "vanilla", "full", 4.0) + run_rows(
        "van24", "vanilla", "full", 3.0, max_new_tokens=24
    )
    rows += run_rows("pld", "pld", "full", 2.0) + run_rows("pld24", "pld", "full", 1.5, max_new_tokens=24)
    for m in range(3):
        long = {"decoder.a_very_long_parameter_name": m, "decoder.another_long_one": "x" * 30}
        rows += run_rows(f"r{m}", "decoder_with_a_long_name", "streaming", 2.0 + m, **long)
    rows += run_rows("other", "pld", "full", 2.0, task="humaneval")
    for run_id, run in pd.DataFrame(rows).groupby("run_id", sort=False):
        write_run(tmp_path, str(run_id), run.to_dict("records"))
    capsys.readouterr()
    table = summary_main(["--root", str(tmp_path), "--figure", str(tmp_path / "s.png")])
    lines = capsys.readouterr().out.splitlines()
    assert fits(lines), max(len(line) for line in lines)
    assert table.groupby("task")["label"].nunique().to_dict() == {"gsm8k": 7, "humaneval": 1}
    assert {"pld tokens=24", "pld tokens=64"} <= set(table["label"])
    assert any(line.startswith("== humaneval") for line in lines)
    assert any(line.startswith("legend: all runs:") for line in lines)
    assert {"exact", "within_tie", "diverged", "match_rate"} <= set(table.columns)  # old column kept
    assert "static" not in "\n".join(lines)  # records without the counters: no column


def test_summary_shows_the_counters_where_the_records_hold_them():
    rows = run_rows(
        "van", "vanilla", "full", 4.0, static_frac=1.0, syncs_per_step=1.0, host_ms_per_forward=0.1
    )
    rows += run_rows("pld", "pld", "full", 2.0)  # an older run: its cells read "-"
    samples = pd.DataFrame(rows)
    table = with_run_details(summarize(samples), samples[["run_id"]].drop_duplicates(), samples)
    text = "\n".join(report_lines(table))
    assert "static" in text and "syncs/step" in text and "host ms/fwd" in text and "100%" in text
    assert fits(text.splitlines())


# --- dtype auto -------------------------------------------------------------------------------------
def test_dtype_auto_is_float32_on_a_cpu_whatever_its_isa_and_bfloat16_on_cuda():
    from core.models import load_model, resolve_dtype

    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto") == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16  # still a choice
    assert load_model("tiny", "tiny", dtype="auto", device="cpu").dtype == torch.float32
