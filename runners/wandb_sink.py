"""Optional W&B mirror of the parquet records (off by default). A W&B failure never breaks a run."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from runners.report import run_summary


def json_safe(df: pd.DataFrame) -> pd.DataFrame:
    """The per-sample table as plain Python values W&B can serialise: nullable columns (pd.NA) become
    None, list columns (output ids) are dropped (the parquet artifact keeps them)."""
    out = df.drop(columns=["output_ids"], errors="ignore").astype(object)
    return out.where(out.notna(), None)


STAGING_VARS = {"WANDB_DATA_DIR": "data", "WANDB_CACHE_DIR": "cache", "WANDB_ARTIFACT_DIR": "artifacts"}
USER_SET = {var for var in STAGING_VARS if var in os.environ}  # the user's own choice wins


def keep_staging_in(folder: Path) -> None:
    """W&B stages artifact copies and caches downloads under the home folder unless told otherwise: keep
    them inside this run's W&B folder."""
    root = folder.expanduser().resolve()
    for var, sub in STAGING_VARS.items():
        if var not in USER_SET:
            os.environ[var] = str(root / sub)


# seconds wandb.init may wait for its server (W&B's own default, 90, stalled an offline machine that long)
INIT_TIMEOUT_S = 8.0


class WandbSink:
    def __init__(self, cfg: Any, config: dict, run_id: str, names: dict[str, str]) -> None:
        self.run = None
        if not cfg.get("enabled", False):
            return
        try:
            import wandb

            keep_staging_in(Path(cfg.get("dir") or "wandb"))
            self.run = wandb.init(
                project=cfg.get("project", "draftless-harness"),
                entity=cfg.get("entity"),
                name=run_id,
                group=cfg.get("group") or names.get("task"),
                job_type=names.get("decoder"),
                tags=[names.get("decoder", ""), names.get("kv", ""), names.get("task", "")],
                config=config,
                dir=cfg.get("dir"),
                mode=cfg.get("mode"),
                reinit="finish_previous",
                settings=wandb.Settings(init_timeout=INIT_TIMEOUT_S),
            )
        except Exception as exc:  # noqa: BLE001
            self._warn("init", exc)

    def log(self, tables: dict[str, pd.DataFrame], run_path: Path) -> None:
        if self.run is None:
            return
        try:
            import wandb

            samples = tables["samples"]
            self.run.summary.update({k: float(v) for k, v in run_summary(samples).items()})
            scores = tables["scores"]
            if len(scores):
                self.run.summary.update(
                    scores.groupby("metric")["value"].mean().add_prefix("score/").to_dict()
                )
            self.run.log({"samples": wandb.Table(dataframe=json_safe(samples))})
            art = wandb.Artifact(name=f"records-{run_path.name}", type="results")
            for p in run_path.glob("*.parquet"):
                art.add_file(str(p))
            self.run.log_artifact(art)
        except Exception as exc:  # noqa: BLE001
            self._warn("log", exc)

    def finish(self) -> None:
        if self.run is not None:
            try:
                self.run.finish()
            except Exception as exc:  # noqa: BLE001
                self._warn("finish", exc)

    @staticmethod
    def _warn(stage: str, exc: Exception) -> None:
        print(
            f"[wandb] {stage} failed ({exc.__class__.__name__}: {exc}); records on disk are unaffected",
            file=sys.stderr,
        )
