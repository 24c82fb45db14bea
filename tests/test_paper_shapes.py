"""Config-only models (`model.source=config`) and `benchmarks.paper_shapes`, on the tiny config: the rows
land in the CSV as measured, and each mode's curve where `analysis.cost_model` reads curves."""

from __future__ import annotations

import csv

import pytest
import torch

from analysis.cost_model import committed_curves, shape_of
from benchmarks import paper_shapes
from core.models import load_model
from core.types import HarnessError
from runners.config import graphs_choice

TINY = "conf/model/shapes/tiny-llama.json"


def test_a_config_builds_its_model_with_seeded_random_weights():
    a = load_model("config", TINY, dtype="bfloat16", device="cpu", seed=3)
    b = load_model("config", TINY, dtype="bfloat16", device="cpu", seed=3)
    assert a.name == "tiny-llama" and a.dtype == torch.bfloat16 and a.context_length == 65536
    assert a.model.config.num_hidden_layers == 2
    assert all(torch.equal(x, y) for x, y in zip(a.model.parameters(), b.model.parameters(), strict=True))
    with pytest.raises(HarnessError, match="no config file"):
        load_model("config", "conf/model/shapes/absent.json", device="cpu")


def test_paper_shapes_writes_rows_and_curves_the_cost_model_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_BENCH_OUT", str(tmp_path / "bench"))
    monkeypatch.setenv("HARNESS_COST_CACHE", str(tmp_path / "cache"))
    rows = tmp_path / "rows.csv"
    paper_shapes.main(
        ["--device", "cpu", "--configs", TINY, "--rows", "1", "2", "--contexts", "16", "32", "--reps", "1",
         "--hf-new", "2", "--graphs-emulate", "--rows-out", str(rows)]
    )  # fmt: skip
    got = list(csv.DictReader(rows.open()))
    assert [(r["mode"], r["rows"], r["cache"]) for r in got] == [
        *((mode, b, c) for mode in ("eager", "graphed") for c in ("16", "32") for b in ("1", "2")),
        ("hf_generate", "1", "16"),
        ("hf_generate", "1", "32"),
    ]
    assert all(float(r["ms"]) > 0 for r in got)
    curves = committed_curves(tmp_path / "bench")
    assert sorted(c.graphed for c in curves) == [False, True]
    assert all(c.key["model"] == "tiny-llama" and c.contexts == [16, 32] and c.rows == [1, 2] for c in curves)
    assert shape_of(curves[0]).n_layers == 2


def test_emulated_graphs_are_a_choice_on_any_device():
    assert graphs_choice("emulate", torch.device("cpu")) == "emulate"
    with pytest.raises(HarnessError, match="true, false, auto or emulate"):
        graphs_choice("yes", torch.device("cpu"))
