"""Damaged records are named, never trusted and never a traceback: each RECORD_CASE of tests/bad_inputs/
damages a copy of a real small run. A run with finished parts stops a rerun with one error naming the
damaged file and writes nothing; a complete run whose files no longer back its COMPLETE is resumed
(its rows neither lost nor doubled), skipped by `analysis.summary` with one warning, and refused by
`make paper` with one error line and nothing written."""

from __future__ import annotations

import contextlib
import io
import shutil
from pathlib import Path

import pandas as pd
import pytest
import torch

from analysis.paper import main as paper_main
from analysis.summary import main as summary_main
from core.types import HarnessError
from runners.records import RunDir
from runners.runner import Runner
from tests.bad_inputs import RECORD_CASES, RecordCase
from tests.helpers import make_cfg

PARTIAL = [c for c in RECORD_CASES if c.run == "partial"]
COMPLETE = [c for c in RECORD_CASES if c.run == "complete"]
BROKEN = "+task.broken=s1"  # sample s1 fails: the run stays incomplete and keeps the parts of s0, s2
LIMIT = "run.limit=3"  # the complete runs record their limit (what an old COMPLETE is checked against)


@pytest.fixture(autouse=True)
def restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> dict[str, Path]:
    """Out dirs holding a run with finished parts ("partial") and a vanilla + a PLD run ("complete")."""
    partial = tmp_path_factory.mktemp("partial")
    with pytest.raises(HarnessError, match="1 of 3 samples"):
        Runner(make_cfg(partial, BROKEN)).run()
    complete = tmp_path_factory.mktemp("complete")
    Runner(make_cfg(complete, LIMIT)).run()
    Runner(make_cfg(complete, LIMIT, "decoder=pld")).run()
    return {"partial": partial, "complete": complete}


def copied(made: dict[str, Path], kind: str, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(made[kind], out)
    return out


def vanilla_run(out: Path) -> Path:
    return next((out / "runs").glob("fake-vanilla-full-*"))


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


@pytest.mark.parametrize("case", PARTIAL, ids=[c.name for c in PARTIAL])
def test_a_damaged_part_stops_the_rerun_with_one_line_and_writes_nothing(made, tmp_path, case: RecordCase):
    out = copied(made, "partial", tmp_path)
    case.damage(vanilla_run(out))
    before = snapshot(out)
    with pytest.raises(HarnessError) as exc:
        Runner(make_cfg(out, BROKEN)).run()
    message = str(exc.value)
    assert case.message in message and "\n" not in message, message
    assert "remove" in message, message  # what to do about it
    assert snapshot(out) == before


@pytest.mark.parametrize("case", COMPLETE, ids=[c.name for c in COMPLETE])
def test_make_paper_refuses_a_damaged_record_with_one_line_and_writes_nothing(
    made, tmp_path, case: RecordCase
):
    out = copied(made, "complete", tmp_path)
    case.damage(vanilla_run(out))
    report = tmp_path / "paper"
    with pytest.raises(SystemExit) as exc, contextlib.redirect_stdout(io.StringIO()):
        paper_main(["--root", str(out), "--out", str(report)])
    line = str(exc.value.code)
    assert line.startswith("error: damaged record ") and case.message in line and "\n" not in line, line
    assert vanilla_run(out).name in line
    assert not report.exists()


@pytest.mark.parametrize("case", COMPLETE, ids=[c.name for c in COMPLETE])
def test_summary_skips_a_damaged_record_with_one_warning(made, tmp_path, case: RecordCase):
    out = copied(made, "complete", tmp_path)
    damaged = vanilla_run(out)
    case.damage(damaged)
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        table = summary_main(["--root", str(out), "--figure", str(tmp_path / "summary.png")])
    lines = [line for line in err.getvalue().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("warning: skipping the damaged record "), lines
    assert str(damaged) in lines[0] and case.message in lines[0], lines
    assert list(table["decoder"]) == ["pld"]  # the other run is still shown


RESUMED = [c for c in COMPLETE if c.name in ("samples.parquet gone", "samples.parquet short of rows")]
RESUMED += [c for c in COMPLETE if c.name == "old COMPLETE, samples.parquet gone"]


@pytest.mark.parametrize("case", RESUMED, ids=[c.name for c in RESUMED])
def test_a_complete_marker_its_files_do_not_back_is_resumed(made, tmp_path, case: RecordCase, capsys):
    out = copied(made, "complete", tmp_path)
    run = vanilla_run(out)
    case.damage(run)
    path = Runner(make_cfg(out, LIMIT)).run()
    said = capsys.readouterr().out
    assert path == run and "already complete" not in said
    (line,) = [line for line in said.splitlines() if "is marked COMPLETE but" in line]
    assert case.message in line and line.endswith(": resuming it as incomplete"), said
    assert RunDir(run.parent, run.name).completion_problem() is None
    samples = pd.read_parquet(run / "samples.parquet")
    assert len(samples) == 6 and not samples.duplicated(["sample_id", "turn"]).any()
    assert len(pd.read_parquet(run / "steps.parquet")) == 30


def test_complete_markers_written_before_the_row_counts_stay_readable(made, tmp_path, capsys):
    out = copied(made, "complete", tmp_path)
    run = vanilla_run(out)
    (run / "COMPLETE").write_text("complete\n")
    Runner(make_cfg(out, LIMIT)).run()
    assert "is already complete; nothing to do" in capsys.readouterr().out
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        table = summary_main(["--root", str(out), "--figure", str(tmp_path / "summary.png")])
    assert err.getvalue() == "" and sorted(table["decoder"]) == ["pld", "vanilla"]


def test_paper_runs_names_a_damaged_record(made, tmp_path):
    from runners import paper_runs

    out = copied(made, "complete", tmp_path)
    cut = next(c for c in COMPLETE if c.name == "cut runs.parquet")
    cut.damage(vanilla_run(out))
    with pytest.raises(HarnessError, match=f"damaged record {vanilla_run(out)} .*remove it"):
        paper_runs.record_slices(out)
