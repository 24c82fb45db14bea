"""Load every run under `results/runs/` into tidy DataFrames (samples joined with their run row)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

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


def _flatten(prefix: str, blob: str) -> dict:
    try:
        params = json.loads(blob) if isinstance(blob, str) else {}
    except json.JSONDecodeError:
        return {}
    return {
        f"{prefix}.{k}": (json.dumps(v) if isinstance(v, (dict, list)) else v)
        for k, v in params.items()
        if k != "_target_"
    }


def load_runs(root: Path | str = "results", complete_only: bool = True) -> pd.DataFrame:
    rows = []
    for path in sorted(Path(root).glob("runs/*/runs.parquet")):
        run = pd.read_parquet(path).iloc[0].to_dict()
        if complete_only and not (path.parent / "COMPLETE").exists():
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
        run["path"] = str(path.parent)
        rows.append(run)
    return pd.DataFrame(rows)


def load_table(root: Path | str, table: str, runs: pd.DataFrame | None = None) -> pd.DataFrame:
    """`samples`, `steps` or `scores` of every (complete) run, with the run's columns joined on."""
    runs = load_runs(root) if runs is None else runs
    frames = []
    for _, run in runs.iterrows():
        p = Path(run["path"]) / f"{table}.parquet"
        if p.exists():
            frames.append(pd.read_parquet(p))
    if not frames:
        return pd.DataFrame()
    df = pd.concat(frames, ignore_index=True)
    if table == "samples":  # runs recorded before the host counters existed: unknown, not zero
        for col in HOST_COLUMNS:
            if col not in df.columns:
                df[col] = float("nan")
    extra = [c for c in runs.columns if c == "run_id" or c not in df.columns]
    return df.merge(runs[extra], on="run_id", how="left")


def load_samples(root: Path | str = "results") -> pd.DataFrame:
    return load_table(root, "samples")


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
