"""The W&B mirror: offline mode writes a local run; a W&B failure never breaks the run."""

from __future__ import annotations

import json

import pytest

from runners.runner import Runner
from tests.helpers import make_cfg


def test_wandb_offline_mirror(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = make_cfg(tmp_path, "wandb.enabled=true", "wandb.mode=offline", f"wandb.dir={tmp_path}", "+task.n=1")
    path = Runner(cfg).run()
    assert (path / "COMPLETE").exists()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert runs, "no offline W&B run written"
    tables = list(runs[0].glob("files/media/table/samples_*.table.json"))
    assert tables, "the per-sample table was not logged"
    table = json.loads(tables[0].read_text())
    assert len(table["data"]) == 2 and "restricted_frac" in table["columns"]  # one sample, two turns
    # run.finish() only informs the W&B service, which closes the transaction log later; on a busy
    # machine it is still unflushed here. teardown() waits for the service to exit, as a process does.
    wandb.teardown()
    log = next(runs[0].glob("run-*.wandb")).read_bytes()  # the artifact and its files are recorded here
    assert f"records-{path.name}".encode() in log and b"samples.parquet" in log


def test_wandb_failure_does_not_break_the_run(tmp_path, monkeypatch, capsys):
    wandb = pytest.importorskip("wandb")

    def boom(*a, **k):
        raise RuntimeError("wandb is down")

    monkeypatch.setattr(wandb, "init", boom)
    path = Runner(make_cfg(tmp_path, "wandb.enabled=true", "+task.n=1")).run()
    assert (path / "COMPLETE").exists()
    assert "wandb is down" in capsys.readouterr().err


def test_wandb_offline_stages_nothing_outside_its_folder(tmp_path, monkeypatch):
    """Artifact copies and W&B's caches go under wandb.dir, not under the home folder."""
    wandb = pytest.importorskip("wandb")
    from runners import wandb_sink

    home = tmp_path / "home"
    home.mkdir()
    for var in ("HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(home))
    for var in ("WANDB_DATA_DIR", "WANDB_CACHE_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.delenv(var, raising=False)  # restored (unset) afterwards
    monkeypatch.setattr(wandb_sink, "USER_SET", set(), raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "w"
    cfg = make_cfg(
        tmp_path / "out", "wandb.enabled=true", "wandb.mode=offline", f"wandb.dir={run_dir}", "+task.n=1"
    )
    path = Runner(cfg).run()
    assert (path / "COMPLETE").exists()
    wandb.teardown()  # the service writes until it exits: look after it has
    outside = [p for p in home.rglob("*") if p.is_file() and "wandb" in str(p)]
    assert not outside, outside
