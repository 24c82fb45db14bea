"""Tidy records, written atomically as parquet. The single source of truth (W&B only mirrors).

A run directory `results/runs/<run_id>/` holds:
- `runs.parquet`     one row: provenance + every parameter + status
- `parts/<sample>.parquet`, `parts/<sample>.steps.parquet`, `parts/<sample>.scores.parquet`
                     written atomically per finished sample (all its turns): the resume unit
- `samples.parquet`, `steps.parquet`, `scores.parquet`   consolidated at the end
- `COMPLETE`         written last, only when every sample succeeded, with the row counts of the
                     three tables (JSON; records before that hold the word `complete`); a complete
                     directory is skipped by a rerun of the same command, and its `parts/` are
                     removed (the consolidated tables hold every row: no sample is stored twice).
                     COMPLETE is believed only when its tables and runs.parquet are readable and hold
                     the rows it counts (`RunDir.completion_problem`); otherwise the run is resumed.
- `config.yaml`      the composed config of the command that ran it (run.py)
- `LOCK`             held (flock) by the process writing the run (`runners.lock`).
A crashed run resumes from its parts: finished samples are skipped, none is duplicated. A sample
whose row carries an error is not finished: a rerun retries it (its part is overwritten). A part,
`provenance.json` or `runs.parquet` that cannot be read is a HarnessError naming it and what to remove.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from core.types import HarnessError

if TYPE_CHECKING:
    from runners.timing import Timed

# nullable ints: a failed (sample, turn) row has an error and no measurements
SAMPLE_COLUMNS = {
    "run_id": "string",
    "sample_id": "string",
    "turn": "int64",
    "category": "string",
    "prompt_tokens": "Int64",
    "new_tokens": "Int64",
    "prefill_s": "float64",
    "decode_s": "float64",
    "forward_s": "float64",  # decode-phase seconds inside the target's Engine.step (CUDA: by events)
    "wall_s": "float64",
    "forwards": "Int64",
    "draft_forwards": "Int64",
    "draft_model_forwards": "Int64",
    "drafted_l1": "Int64",
    "accepted_l1": "Int64",
    "slow_steps": "Int64",
    "kv_rebuilds": "Int64",
    "drafted": "Int64",
    "accepted": "Int64",
    "committed": "Int64",
    "tau": "float64",
    "tok_s": "float64",
    "decode_tok_s": "float64",
    "peak_mem_mb": "float64",
    "kv_cache_mb": "float64",
    "kv_read_mb": "float64",
    "kv_budget": "Int64",
    "restricted_frac": "float64",
    "visible_frac": "float64",
    # what a GPU pays besides the forwards (columns absent from older runs): the share of decode target
    # forwards that took (or with graphs off would take) the fixed-shape forward, host synchronisations
    # per decode step (from an untimed counting generation, `run.count_syncs`), milliseconds per
    # decode target forward spent outside the target's and the draft model's forwards, and the part of
    # them after each step's read of the device, which a GPU waits for (`runners.critical_path`)
    "draft_forward_s": "float64",
    "static_frac": "float64",
    "draft_static_frac": "float64",
    "syncs_per_step": "float64",
    "host_ms_per_forward": "float64",
    "critical_ms_per_forward": "float64",
    # CUDA graphs captured inside the timed decode (their eager warm-up runs and the capture are in its
    # time; the runner's warm-up makes them for the block sizes it meets)
    "graph_captures": "Int64",
    "output_digest": "string",
    "output_text": "string",
    "matches_vanilla": "boolean",
    "first_divergence": "Int64",
    "divergence_gap": "float64",
    "error": "string",
}
STEP_COLUMNS = {
    "run_id": "string",
    "sample_id": "string",
    "turn": "int64",
    "step": "int64",
    "block_tokens": "int64",
    "drafted": "int64",
    "accepted": "int64",
    "committed": "int64",
    "kv_attended": "int64",
    "draft": "bool",
    "draft_model": "bool",
}
SCORE_COLUMNS = {"run_id": "string", "sample_id": "string", "metric": "string", "value": "float64"}
TABLES = ("samples", "steps", "scores")
DAMAGE = (OSError, ValueError, pa.ArrowException)  # what reading a damaged parquet or JSON file raises


def why(exc: BaseException) -> str:
    """An exception as a short reason for one error line: its first line, at most 120 characters."""
    text = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0]
    text = re.sub(r"^Could not open Parquet input source '[^']*': ", "", text)  # the path is named already
    return text if len(text) <= 120 else text[:117] + "..."


def parquet_rows(path: Path) -> int:
    """Rows of a parquet file from its footer (a truncated or damaged file raises one of DAMAGE)."""
    return pq.read_metadata(path).num_rows


def measurements(
    prompt_tokens: int, timed: Timed, forward_s: float, bytes_per_entry: int, capacity: int, peak_mb: float
) -> dict[str, Any]:
    """The measured columns of one (sample, turn) row of `samples` (SAMPLE_COLUMNS): lengths, times,
    counts and tau, rates, memory, KV traffic and the KV policy's activity."""
    counts, n_new = timed.counts, len(timed.output)
    activity = counts.kv_activity
    return {
        "prompt_tokens": prompt_tokens,
        "new_tokens": n_new,
        "prefill_s": timed.prefill_s,
        "decode_s": timed.decode_s,
        "forward_s": forward_s,
        "wall_s": timed.wall_s,
        "forwards": counts.forwards,
        "draft_forwards": counts.draft_forwards,
        "draft_model_forwards": counts.draft_model_forwards,
        "drafted_l1": counts.drafted_l1,
        "accepted_l1": counts.accepted_l1,
        "slow_steps": counts.slow_steps,
        "kv_rebuilds": counts.kv_rebuilds,
        "drafted": counts.drafted,
        "accepted": counts.accepted,
        "committed": counts.committed,
        "tau": counts.tau if counts.forwards else 1.0,
        "tok_s": n_new / timed.wall_s,
        "decode_tok_s": (n_new - 1) / timed.decode_s if n_new > 1 and timed.decode_s > 0 else float("nan"),
        "peak_mem_mb": peak_mb,
        "kv_cache_mb": capacity * bytes_per_entry / 2**20,
        "kv_read_mb": counts.kv_attended * bytes_per_entry / 2**20,
        "kv_budget": counts.kv_budget,
        "restricted_frac": activity.restricted_frac if activity else 0.0,
        "visible_frac": activity.visible_frac if activity else 1.0,
    }


def host_counters(timed: Timed, clocks: Any, syncs: float) -> dict[str, float | int]:
    """The host-side columns of one (sample, turn) row, from its generation (`runners.timing.Timed`)
    and the clocks of it (`runners.timing.DecodeClocks`: the target's and the draft model's forwards after the
    prefill mark, with the share of each that took the fixed-shape path, and the reads of the device)."""
    forwards, drafts = clocks.forwards, clocks.drafts
    n = forwards.forwards_since_mark
    host = clocks.host_s(timed) / n * 1e3 if n else float("nan")
    return {
        "draft_forward_s": drafts.seconds_since_mark,
        "static_frac": forwards.static_frac_since_mark,
        "draft_static_frac": drafts.static_frac_since_mark,
        "syncs_per_step": syncs,
        "host_ms_per_forward": host,
        "critical_ms_per_forward": clocks.critical_s(timed) / n * 1e3 if n else float("nan"),
        "graph_captures": clocks.captures_since_mark,
    }


def typed_frame(rows: list[dict[str, Any]], columns: dict[str, str]) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=list(columns))
    extra = [c for c in (rows[0] if rows else {}) if c not in columns]
    for c in extra:  # e.g. output_ids (list column)
        df[c] = [r.get(c) for r in rows]
    return df.astype(columns)


def write_parquet_atomic(df: pd.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    df.to_parquet(tmp, index=False)
    os.replace(tmp, path)


def run_id_for(identity: dict[str, Any]) -> str:
    """Stable id from what defines the run (model, decoder, kv, task, seed, limits)."""
    blob = json.dumps(identity, sort_keys=True, default=str)
    readable = "-".join(str(identity.get(k, "")) for k in ("task", "decoder", "kv"))
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', readable)}-{hashlib.sha1(blob.encode()).hexdigest()[:10]}"


def safe_name(sample_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", sample_id) + "-" + hashlib.sha1(sample_id.encode()).hexdigest()[:6]


def part_stem(path: Path) -> str:
    """The sample's stem of a part file `<stem>.<table>.parquet` (`safe_name` keeps dots of sample ids)."""
    for table in TABLES:
        if path.name.endswith(f".{table}.parquet"):
            return path.name.removesuffix(f".{table}.parquet")
    return path.stem


class RunDir:
    def __init__(self, root: Path, run_id: str) -> None:
        self.path = root / run_id
        self.parts = self.path / "parts"

    @property
    def complete(self) -> bool:
        """COMPLETE is there and backed by its files."""
        return (self.path / "COMPLETE").exists() and self.completion_problem() is None

    def completion_problem(self) -> str | None:
        """Why this run's COMPLETE is not to be believed, or None when its files back it: runs.parquet and
        the three tables readable, and the tables holding the rows (and samples) COMPLETE counts."""
        marker = self.path / "COMPLETE"
        try:
            text = marker.read_text(encoding="utf-8").strip()
            counts = {} if text == "complete" else json.loads(text)  # "complete": written before the counts
        except (*DAMAGE, UnicodeDecodeError) as exc:
            return f"COMPLETE cannot be read ({why(exc)})"
        if not isinstance(counts, dict) or not all(isinstance(v, int) for v in counts.values()):
            return "COMPLETE holds no row counts"
        for name in ("runs", *TABLES):
            path = self.path / f"{name}.parquet"
            if not path.is_file():
                return f"{path.name} is missing"
            try:
                rows = parquet_rows(path)
            except DAMAGE as exc:
                return f"{path.name} cannot be read ({why(exc)})"
            if name in counts and rows != counts[name]:
                return f"{path.name} holds {rows} rows where COMPLETE counts {counts[name]}"
        want, said = counts.get("sample_ids"), "COMPLETE counts"
        try:
            if want is None:  # a marker written before the counts: the run's limit, when it had one
                limit = pd.read_parquet(self.path / "runs.parquet").iloc[0].get("limit")
                want, said = (None if pd.isna(limit) else int(limit)), "runs.parquet's limit is"
            if want is None:
                return None
            ids = pd.read_parquet(self.path / "samples.parquet", columns=["sample_id"])["sample_id"]
        except (*DAMAGE, IndexError) as exc:
            return f"the records cannot be read ({why(exc)})"
        if ids.nunique() != want:
            return f"samples.parquet holds {ids.nunique()} samples where {said} {want}"
        return None

    def read_part(self, path: Path, columns: list[str] | None = None) -> pd.DataFrame:
        """One part file, or a HarnessError naming it and what to remove (that sample then runs again)."""
        try:
            return pd.read_parquet(path, columns=columns)
        except DAMAGE as exc:
            stem = part_stem(path)
            raise HarnessError(
                f"part {path} cannot be read ({why(exc)}); remove {self.parts}/{stem}.*.parquet and rerun: "
                "that sample runs again"
            ) from None

    def _part_status(self) -> pd.DataFrame:
        """sample_id and error of every finished sample's part; its steps and scores parts are checked
        readable too, so that a damaged one stops the run before any sample is run, not at the end."""
        frames = []
        for path in sorted(self.parts.glob("*.samples.parquet")):
            frames.append(self.read_part(path, ["sample_id", "error"]))
            for table in ("steps", "scores"):
                sibling = path.with_name(part_stem(path) + f".{table}.parquet")
                if sibling.exists():
                    self.read_part(sibling, ["sample_id"])
        frames = [f for f in frames if len(f)]
        if not frames:
            return pd.DataFrame({"sample_id": [], "error": []})
        return pd.concat(frames, ignore_index=True).astype({"sample_id": str})

    def done_samples(self) -> set[str]:
        """Samples whose every turn succeeded (failed samples are retried by a rerun)."""
        if not self.parts.exists():
            return set()
        rows = self._part_status()
        failed = set(rows.loc[rows["error"].notna(), "sample_id"])
        return set(rows["sample_id"]) - failed

    def failed_samples(self) -> set[str]:
        if not self.parts.exists():
            return set()
        rows = self._part_status()
        return set(rows.loc[rows["error"].notna(), "sample_id"])

    def read_provenance(self) -> dict[str, Any] | None:
        """Who wrote the parts (code version, packages, device, threads), or None."""
        path = self.parts / "provenance.json"
        if not path.exists():
            return None
        try:
            found = json.loads(path.read_text(encoding="utf-8"))
        except (*DAMAGE, UnicodeDecodeError) as exc:
            found = why(exc)
        if not isinstance(found, dict):
            reason = found if isinstance(found, str) else "not a JSON object"
            raise HarnessError(
                f"{path} cannot be read ({reason}); remove it and rerun (the run's runs.parquet then says "
                f"who wrote its parts), or remove {self.path} to start the run afresh"
            )
        return found

    def write_provenance(self, provenance: dict[str, Any]) -> None:
        """Record who writes the parts, once: a resumed run keeps the first writer's record."""
        path = self.parts / "provenance.json"
        if not path.exists():
            self.parts.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(provenance, sort_keys=True))
            tmp.replace(path)

    def read_run(self) -> dict[str, Any] | None:
        path = self.path / "runs.parquet"
        if not path.exists():
            return None
        try:
            return pd.read_parquet(path).iloc[0].to_dict()
        except (*DAMAGE, IndexError) as exc:
            raise HarnessError(
                f"{path} cannot be read ({why(exc) if not isinstance(exc, IndexError) else 'no row'}); "
                f"remove {self.path} to start the run afresh"
            ) from None

    def write_run(self, row: dict[str, Any]) -> None:
        write_parquet_atomic(pd.DataFrame([row]), self.path / "runs.parquet")

    def write_sample(
        self, sample_id: str, samples: list[dict], steps: list[dict], scores: list[dict]
    ) -> None:
        stem = safe_name(sample_id)
        # steps/scores first: the samples part is the commit marker of a finished sample
        write_parquet_atomic(typed_frame(steps, STEP_COLUMNS), self.parts / f"{stem}.steps.parquet")
        write_parquet_atomic(typed_frame(scores, SCORE_COLUMNS), self.parts / f"{stem}.scores.parquet")
        write_parquet_atomic(typed_frame(samples, SAMPLE_COLUMNS), self.parts / f"{stem}.samples.parquet")

    def consolidate(self) -> dict[str, pd.DataFrame]:
        out = {}
        for table, cols in (("samples", SAMPLE_COLUMNS), ("steps", STEP_COLUMNS), ("scores", SCORE_COLUMNS)):
            frames = [self.read_part(p) for p in sorted(self.parts.glob(f"*.{table}.parquet"))]
            frames = [f for f in frames if len(f)]
            df = pd.concat(frames, ignore_index=True) if frames else typed_frame([], cols)
            if table == "samples":
                done = set(df["sample_id"])
                df = df.sort_values(["sample_id", "turn"], ignore_index=True)
            elif len(df):  # drop steps/scores orphaned by a crash between part writes
                df = df[df["sample_id"].isin(done)].reset_index(drop=True)
            write_parquet_atomic(df, self.path / f"{table}.parquet")
            out[table] = df
        return out

    def mark_complete(self, tables: dict[str, pd.DataFrame] | None = None) -> None:
        """Mark the run complete with the row counts of its consolidated `tables` (by default those on
        disk), so that a table lost or cut later is noticed; then drop its parts: the consolidated tables
        now hold every row."""
        if tables is None:
            tables = {name: pd.read_parquet(self.path / f"{name}.parquet") for name in TABLES}
        counts = {name: len(tables[name]) for name in TABLES}
        counts["runs"] = 1
        counts["sample_ids"] = int(tables["samples"]["sample_id"].nunique())
        tmp = self.path / f".COMPLETE.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(counts, sort_keys=True) + "\n")
        os.replace(tmp, self.path / "COMPLETE")
        if self.parts.exists():
            for part in self.parts.iterdir():
                part.unlink(missing_ok=True)
            self.parts.rmdir()

    def withdraw_complete(self) -> None:
        """Remove a COMPLETE its files do not back: the run is incomplete again and resumes."""
        (self.path / "COMPLETE").unlink(missing_ok=True)
