"""Every committed run keeps its id: its identity rebuilt through `runners.identity` (the decoder and
the KV policy by method name and validated options, `_target_` only as the frozen name a method's runs
were recorded under) from the run's saved config and its record digests to the committed run id."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from omegaconf import OmegaConf

from runners.identity import Environment, group_params, method_params, run_identity
from runners.records import run_id_for

REPO = Path(__file__).resolve().parents[1]
RUNS = sorted(p.parent for p in (REPO / "results").glob("**/runs/*/runs.parquet"))


def scale_stratifies(name: str) -> bool:
    """Whether the scale preset a run records (`scale.name`) sets run.stratify."""
    for path in (REPO / "conf" / "scale").glob("*.yaml"):
        preset = OmegaConf.load(path)
        if OmegaConf.select(preset, "scale.name", default=None) == name:
            return bool(OmegaConf.select(preset, "run.stratify", default=False))
    return False


def identity_of(run: Path) -> tuple[str, dict]:
    """(the committed id, the identity the current code gives the run's config and environment)."""
    row = pd.read_parquet(run / "runs.parquet").iloc[0]
    recorded = {g: json.loads(row[f"{g}_params"]) for g in ("decoder", "kv", "draft", "task")}
    saved = run / "config.yaml"
    if saved.exists():  # the composed config the run was started with (run.py saves it)
        cfg = OmegaConf.load(saved)
        decoder, kv, task, sampling = cfg.decoder, cfg.kv, group_params(cfg.task), group_params(cfg.sampling)
        graphs = "emulate" if cfg.run.get("cuda_graphs") == "emulate" else bool(row.get("cuda_graphs"))
        stratify = bool(cfg.run.get("stratify", False))
    else:  # a run recorded before configs were saved: the groups as its record shows them
        decoder = OmegaConf.create({k: v for k, v in recorded["decoder"].items() if k != "draft"})
        kv, task = OmegaConf.create(recorded["kv"]), recorded["task"]
        sampling, graphs = json.loads(row["sampling"]), bool(row.get("cuda_graphs"))
        stratify = scale_stratifies(row["scale"])
    extra = {"draft": recorded["decoder"]["draft"]} if "draft" in recorded["decoder"] else {}
    env = Environment(
        model_name=row["model_name"],
        dtype=row["dtype"],
        device="cpu" if str(row["device_name"]).startswith("cpu") else "cuda",
        device_name=row["device_name"],
        threads=int(row["threads"]),
        prefill_chunk=int(row["prefill_chunk"]),
        linear=row["linear"],
        cuda_graphs=graphs,
        compile=bool(row.get("compile", False)),
    )
    params = {
        "decoder": {**method_params(decoder, "decoder"), **extra},  # + the draft weights' digest
        "kv": method_params(kv, "kv"),
        "draft": recorded["draft"],
        "task": task,
        "sampling": sampling,
    }
    names = {g: str(row[g]) for g in ("model", "decoder", "kv", "draft", "task")}
    limit = None if pd.isna(row["limit"]) else int(row["limit"])
    identity = run_identity(
        names, env, params, row["task_version"], limit, int(row["max_new_tokens"]), int(row["seed"]), stratify
    )
    return row["run_id"], identity


def test_there_are_committed_runs_with_their_configs():
    assert len(RUNS) >= 300 and sum((r / "config.yaml").exists() for r in RUNS) >= 270


@pytest.mark.parametrize("run", RUNS, ids=[r.name for r in RUNS])
def test_a_committed_run_keeps_its_id(run):
    committed, identity = identity_of(run)
    assert run.name == committed
    assert run_id_for(identity) == committed, identity
