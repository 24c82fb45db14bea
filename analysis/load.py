"""Load every run under `results/runs/` into tidy DataFrames (samples joined with their run row).

A record that cannot be trusted (a runs.parquet or table that cannot be read, a COMPLETE its tables do
not back: `runners.records.RunDir.completion_problem`) is skipped with one `warning:` line on stderr
naming it, never dropped in silence; `strict=True` (make paper) raises a DamagedRecord instead.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from runners.records import DAMAGE, RunDir, why

RUN_KEYS = [
    "run_id",
    "model",
    "model_name",
    "dtype",
    "device_name",
    "decoder",
    "kv",
    "draft",
    "task",
    "lossless",
    "max_new_tokens",
    "seed",
    "status",
    "git_sha",
]

# samples columns of the host counters (runners.records.host_counters)
HOST_COLUMNS = (
    "draft_forward_s",
    "static_frac",
    "draft_static_frac",
    "syncs_per_step",
    "host_ms_per_forward",
    "critical_ms_per_forward",
    "graph_captures",
)


CONFIG = Path(__file__).resolve().parents[1] / "conf" / "config.yaml"


def default_root() -> str:
    """The config's `run.out_dir` (where `python run.py` writes), "results" if unreadable."""
    try:
        return str(OmegaConf.load(CONFIG).run.out_dir)
    except Exception:  # noqa: BLE001
        return "results"


def _flatten(prefix: str, blob: str) -> dict:
    try:
        params = json.loads(blob) if isinstance(blob, str) else {}
    except json.JSONDecodeError:
        return {}
    return {
        f"{prefix}.{k}": (json.dumps(v) if isinstance(v, (dict, list)) else v)
        for k, v in params.items()
        if k not in ("_target_", "method")  # the identity's head (`runners.identity.method_params`)
    }


class DamagedRecord(Exception):  # noqa: N818 - named for what it is, like AnalysisError's refusals
    """A run record that cannot be read or whose COMPLETE its files do not back."""


_WARNED: set[str] = set()  # each damaged record is named once per process
RECORD_FILES = ("COMPLETE", "runs.parquet", "samples.parquet", "steps.parquet", "scores.parquet")


def completion_problem(folder: Path) -> str | None:
    """`RunDir.completion_problem` of the run in `folder`, checked once per state of its files (a report
    loads the same records several times)."""
    stamp = []
    for name in RECORD_FILES:
        try:
            st = (folder / name).stat()
            stamp.append((st.st_size, st.st_mtime_ns, st.st_ino))
        except OSError:
            stamp.append(None)
    return _completion_problem(str(folder), tuple(stamp))


@functools.lru_cache(maxsize=8192)
def _completion_problem(folder: str, _stamp: tuple) -> str | None:
    path = Path(folder)
    return RunDir(path.parent, path.name).completion_problem()


def damaged(path: Path, problem: str, strict: bool) -> None:
    """Raise (strict) or warn once that the record at `path` is skipped."""
    if strict:
        raise DamagedRecord(f"damaged record {path}: {problem}")
    if str(path) not in _WARNED:
        _WARNED.add(str(path))
        print(f"warning: skipping the damaged record {path}: {problem}", file=sys.stderr)


def load_runs(root: Path | str = "results", complete_only: bool = True, strict: bool = False) -> pd.DataFrame:
    """One row per run under `root/runs/`: its runs.parquet, its parameters flattened, its `path`.
    `complete_only`: only runs whose COMPLETE is backed by their tables; a damaged one is skipped with a
    warning (or raises DamagedRecord when `strict`)."""
    rows = []
    for folder in sorted(p for p in Path(root).glob("runs/*") if p.is_dir()):
        path, marked = folder / "runs.parquet", (folder / "COMPLETE").exists()
        if complete_only and not marked:
            continue  # still running, or failed: not a record yet
        if not path.is_file():
            if marked:
                damaged(folder, "runs.parquet is missing", strict)
            continue
        try:
            run = pd.read_parquet(path).iloc[0].to_dict()
        except (*DAMAGE, IndexError) as exc:
            damaged(folder, f"runs.parquet cannot be read ({why(exc)})", strict)
            continue
        problem = completion_problem(folder) if complete_only else None
        if problem:
            damaged(folder, f"its COMPLETE is not backed: {problem}", strict)
            continue
        run.update(_flatten("decoder", run.get("decoder_params")))
        run.update(_flatten("kv", run.get("kv_params")))
        run.update(_flatten("draft", run.get("draft_params")))
        run.update(_flatten("task", run.get("task_params")))
        run.setdefault("draft", "none")  # runs recorded before the draft group existed
        run.setdefault("experiment", "")  # the experiment file that started the run ("" = none)
        run.setdefault("scale", "paper")  # runs recorded before conf/scale/ existed
        run.setdefault("linear", "aten")  # runs recorded before run.linear existed
        run.setdefault("cuda_graphs", False)  # runs recorded before run.cuda_graphs existed
        run["path"] = str(folder)
        rows.append(run)
    return pd.DataFrame(rows)


def load_table(
    root: Path | str, table: str, runs: pd.DataFrame | None = None, strict: bool = False
) -> pd.DataFrame:
    """`samples`, `steps` or `scores` of every (complete) run, with the run's columns joined on; a table
    that cannot be read is skipped with a warning (raises DamagedRecord when `strict`)."""
    runs = load_runs(root, strict=strict) if runs is None else runs
    frames = []
    for _, run in runs.iterrows():
        p = Path(run["path"]) / f"{table}.parquet"
        if p.exists():
            try:
                frames.append(pd.read_parquet(p))
            except DAMAGE as exc:
                damaged(p.parent, f"{p.name} cannot be read ({why(exc)})", strict)
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    if table == "samples":  # runs recorded before the host counters existed: unknown, not zero
        for col in HOST_COLUMNS:
            if col not in df.columns:
                df[col] = float("nan")
    extra = [c for c in runs.columns if c == "run_id" or c not in df.columns]
    return df.merge(runs[extra], on="run_id", how="left")


def load_samples(root: Path | str = "results", strict: bool = False) -> pd.DataFrame:
    return load_table(root, "samples", strict=strict)


def experiments(prefix: str) -> tuple[str, ...]:
    """The experiment files (conf/experiment/*.yaml) whose names start with `prefix`."""
    conf = Path(__file__).resolve().parents[1] / "conf" / "experiment"
    return tuple(sorted(p.stem for p in conf.glob(f"{prefix}*.yaml")))


def from_experiments(samples: pd.DataFrame, names: tuple[str, ...]) -> pd.DataFrame:
    """The runs the experiment files `names` started, plus the vanilla baselines (they pair by
    environment): per task they ran, the vanilla runs those experiments started, or every vanilla run of
    the task where they started none (another experiment's vanilla run on the same task is not theirs;
    a vanilla run of a task they did not run is no one's baseline here). Records made before runs named
    their experiment are taken whole."""
    recorded = "experiment" in samples.columns and samples["experiment"].fillna("").astype(bool).any()
    if not recorded:
        return samples
    named, vanilla = samples["experiment"].isin(names), samples["decoder"] == "vanilla"
    task = samples["task"] if "task" in samples.columns else pd.Series("", index=samples.index)
    with_own_baseline = set(task[named & vanilla])
    return samples[named | (vanilla & task.isin(set(task[named])) & ~task.isin(with_own_baseline))]
