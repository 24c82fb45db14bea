"""`RECORD_CASES`: damaged records of a real small run, which `tests/test_damaged_records.py` runs (they
need a run to damage, so the command line of `tests.bad_inputs` does not)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

# damaged records: each case damages the folder of a real small run (`tests/test_damaged_records.py`).
# On a run with finished parts ("partial": one sample failed, so its parts are kept) a rerun must stop
# with one `error:` line naming the damaged file and what to remove, and write nothing. On a complete
# run ("complete") COMPLETE is no longer backed: a rerun resumes it with one line, `analysis.summary`
# skips it with one `warning:` line, and `make paper` refuses with one `error:` line, writing nothing.


def _cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _part(run: Path, sample: str, table: str) -> Path:
    return next((run / "parts").glob(f"{sample}-*.{table}.parquet"))


def _rewrite(path: Path, change: Callable[[pd.DataFrame], pd.DataFrame]) -> None:
    change(pd.read_parquet(path)).to_parquet(path, index=False)


def _no_provenance(run: Path) -> None:
    (run / "parts" / "provenance.json").unlink()


@dataclass(frozen=True)
class RecordCase:
    name: str
    run: str  # "partial" (finished parts kept) or "complete"
    damage: Callable[[Path], None]  # applied to the run's folder
    message: str  # a part of the expected error (warning) line


RECORD_CASES = [
    RecordCase("cut samples part", "partial", lambda r: _cut(_part(r, "s0", "samples")), "cannot be read"),
    RecordCase(
        "empty samples part", "partial", lambda r: _part(r, "s0", "samples").write_bytes(b""), "size is 0"
    ),
    RecordCase(
        "cut steps part", "partial", lambda r: _cut(_part(r, "s2", "steps")), "steps.parquet cannot be read"
    ),
    RecordCase(
        "garbage scores part",
        "partial",
        lambda r: _part(r, "s0", "scores").write_bytes(b"not parquet at all"),
        "scores.parquet cannot be read",
    ),
    RecordCase(
        "samples part without its error column",
        "partial",
        lambda r: _rewrite(_part(r, "s0", "samples"), lambda df: df.drop(columns=["error"])),
        "No match for FieldRef.Name(error)",
    ),
    RecordCase(
        "garbage provenance.json",
        "partial",
        lambda r: (r / "parts" / "provenance.json").write_text('{"git_sha": "abc'),
        "provenance.json cannot be read",
    ),
    RecordCase(
        "provenance.json not an object",
        "partial",
        lambda r: (r / "parts" / "provenance.json").write_text("[1, 2]"),
        "provenance.json cannot be read (not a JSON object)",
    ),
    RecordCase(
        "binary provenance.json",
        "partial",
        lambda r: (r / "parts" / "provenance.json").write_bytes(b"\xff\xfe\x00"),
        "provenance.json cannot be read",
    ),
    RecordCase(
        "cut runs.parquet, no provenance.json",
        "partial",
        lambda r: (_no_provenance(r), _cut(r / "runs.parquet")),
        "runs.parquet cannot be read",
    ),
    RecordCase(
        "runs.parquet without a row, no provenance.json",
        "partial",
        lambda r: (_no_provenance(r), _rewrite(r / "runs.parquet", lambda df: df.iloc[:0])),
        "runs.parquet cannot be read (no row)",
    ),
    RecordCase(
        "samples.parquet gone",
        "complete",
        lambda r: (r / "samples.parquet").unlink(),
        "samples.parquet is missing",
    ),
    RecordCase(
        "cut steps.parquet", "complete", lambda r: _cut(r / "steps.parquet"), "steps.parquet cannot be read"
    ),
    RecordCase(
        "scores.parquet gone",
        "complete",
        lambda r: (r / "scores.parquet").unlink(),
        "scores.parquet is missing",
    ),
    RecordCase(
        "cut runs.parquet", "complete", lambda r: _cut(r / "runs.parquet"), "runs.parquet cannot be read"
    ),
    RecordCase(
        "runs.parquet gone", "complete", lambda r: (r / "runs.parquet").unlink(), "runs.parquet is missing"
    ),
    RecordCase(
        "samples.parquet short of rows",
        "complete",
        lambda r: _rewrite(r / "samples.parquet", lambda df: df.head(2)),
        "samples.parquet holds 2 rows where COMPLETE counts 6",
    ),
    RecordCase(
        "steps.parquet short of rows",
        "complete",
        lambda r: _rewrite(r / "steps.parquet", lambda df: df.head(3)),
        "steps.parquet holds 3 rows where COMPLETE counts 30",
    ),
    RecordCase(
        "binary COMPLETE",
        "complete",
        lambda r: (r / "COMPLETE").write_bytes(b"\xff\xfe"),
        "COMPLETE cannot be read",
    ),
    RecordCase(
        "COMPLETE without counts",
        "complete",
        lambda r: (r / "COMPLETE").write_text("[1]\n"),
        "holds no row counts",
    ),
    RecordCase(
        "old COMPLETE, samples.parquet gone",
        "complete",
        lambda r: ((r / "COMPLETE").write_text("complete\n"), (r / "samples.parquet").unlink()),
        "samples.parquet is missing",
    ),
    RecordCase(
        "old COMPLETE, a sample short",
        "complete",
        lambda r: (
            (r / "COMPLETE").write_text("complete\n"),
            _rewrite(r / "samples.parquet", lambda df: df.head(4)),
        ),
        "samples.parquet holds 2 samples where runs.parquet's limit is 3",
    ),
]
