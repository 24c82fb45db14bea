"""The cost model: curve interpolation and its cache file, the roofline's arithmetic, and the predicted
speedup of a run from a synthetic steps table (hand-computed)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch

from analysis.cost_model import (
    GPUS,
    SHAPES,
    CostCurve,
    ModelShape,
    cache_name,
    check_pairs,
    predicted_speedup,
)

KEY = {"device": "cpu: Some CPU", "model": "m", "dtype": "float32", "linear": "onednn", "threads": 2}


def curve() -> CostCurve:
    return CostCurve(KEY, rows=[1, 4], contexts=[100, 200], seconds=[[1.0, 4.0], [2.0, 5.0]])


def test_curve_interpolates_inside_and_clamps_outside_the_grid():
    c = curve()
    assert c(1, 100) == 1.0 and c(4, 200) == 5.0
    assert c(2, 100) == pytest.approx(2.0) and c(2, 200) == pytest.approx(3.0)
    assert c(2, 150) == pytest.approx(2.5)
    assert c(8, 100) == pytest.approx(4.0)  # past the most rows: the nearest measured point
    assert c(1, 300) == pytest.approx(2.0)  # and along the context
    assert c.ratio(4, 100) == pytest.approx(4.0)


def test_curve_json_roundtrip_and_cache_names():
    c = curve()
    back = CostCurve.from_json(c.to_json())
    assert back == c and back(2, 150) == c(2, 150)
    names = {cache_name({**KEY, k: "other"}) for k in KEY}
    assert len(names) == len(KEY) and cache_name(KEY) not in names  # every key field separates curves
    assert "/" not in cache_name({**KEY, "device": "cpu: a/b"})


def test_curve_rejects_a_malformed_grid():
    with pytest.raises(ValueError, match="increasing"):
        CostCurve(KEY, rows=[4, 1], contexts=[100], seconds=[[1.0, 2.0]])
    with pytest.raises(ValueError, match="grid"):
        CostCurve(KEY, rows=[1, 4], contexts=[100, 200], seconds=[[1.0, 2.0]])


def test_model_shape_counts_the_real_weights(tiny_lm):
    """from_hf_config's layer + head weights equal the model's linear weights (norms aside; a tied LM
    head is still one Linear module)."""
    model = tiny_lm.model
    shape = ModelShape.from_hf_config(model.config)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert shape.n_layers * shape.layer_params + shape.head_params == linear


def test_smollm2_shape_is_135m_parameters():
    s = SHAPES["smollm2-135m"]
    assert 134e6 < s.n_layers * s.layer_params + s.head_params < 135e6


def test_roofline_decode_step_is_memory_bound_and_big_blocks_cost_more():
    a100, llama = GPUS["A100-80GB"], SHAPES["llama-2-7b"]
    one = a100.seconds(llama, 1, 600)
    reads = llama.weight_bytes(2) + 600 * llama.kv_bytes_per_entry(2)
    assert one == pytest.approx(reads / (a100.bandwidth * a100.bw_eff))
    assert a100.seconds(llama, 8, 600) == pytest.approx(one)  # a few rows ride on the weight reads
    assert a100.seconds(llama, 481, 600) > 2 * one  # hundreds of rows become compute-bound
    assert GPUS["H200"].seconds(llama, 1, 600) < one


def test_paper_pairs_are_checked_with_their_error():
    pairs = check_pairs(GPUS["A100-80GB"], SHAPES["llama-2-7b"])
    assert {"FAFO-Stream", "Lookahead"} <= set(pairs["method"])
    row = pairs[(pairs["method"] == "Lookahead") & (pairs["task"] == "MT-Bench")].iloc[0]
    assert row["predicted"] == pytest.approx(row["tau"] / row["cost_ratio"])
    assert row["error_pct"] == pytest.approx(100 * (row["predicted"] / row["paper_speedup"] - 1))


def _steps(rows: list[tuple]) -> pd.DataFrame:
    cols = ["sample_id", "turn", "step", "block_tokens", "committed", "kv_attended", "draft", "draft_model"]
    return pd.DataFrame(rows, columns=cols)


def test_predicted_speedup_by_hand():
    samples = pd.DataFrame({"sample_id": ["a", "b"], "turn": [0, 0], "prompt_tokens": [100, 50]})
    flat = lambda b, ctx: 1 + 0.1 * (b - 1)  # noqa: E731  (context-free cost)
    steps = _steps([("a", 0, 0, 5, 3, 0, False, False), ("a", 0, 1, 5, 2, 0, False, False)])
    # vanilla: 5 one-row steps (5.0); the method: two 5-row forwards (2 x 1.4)
    assert predicted_speedup(steps, samples, flat, n_layers=2) == pytest.approx(5 / 2.8)
    grows = lambda b, ctx: b + ctx / 100  # noqa: E731
    one = _steps([("b", 0, 0, 4, 3, 0, False, False)])
    vanilla = sum(1 + (50 + j) / 100 for j in range(3))
    assert predicted_speedup(one, samples, grows, n_layers=2) == pytest.approx(vanilla / (4 + 0.5))
    # a self-speculative draft forward costs its rows over what it attends (sparse), commits nothing
    spec = _steps([("b", 0, 0, 1, 0, 2 * 10, True, False), ("b", 0, 1, 4, 3, 2 * 53, False, False)])
    method = (1 + 10 / 100) + (4 + 53 / 100)
    assert predicted_speedup(spec, samples, grows, n_layers=2, sparse=True) == pytest.approx(vanilla / method)
    # the dense path attends the whole cache whatever the policy hides
    assert predicted_speedup(spec, samples, grows, n_layers=2) == pytest.approx(vanilla / (1.5 + 4.5))


def test_predicted_speedup_unknown_for_a_separate_draft_model():
    samples = pd.DataFrame({"sample_id": ["a"], "turn": [0], "prompt_tokens": [10]})
    steps = _steps([("a", 0, 0, 1, 0, 5, False, True), ("a", 0, 1, 3, 2, 10, False, False)])
    assert math.isnan(predicted_speedup(steps, samples, lambda b, c: 1.0, n_layers=1))
    assert math.isnan(predicted_speedup(_steps([]), samples, lambda b, c: 1.0, n_layers=1))


def test_cached_or_measured_reads_the_cache_unless_refreshed(tmp_path, monkeypatch):
    from core import cost_curve

    monkeypatch.setenv("HARNESS_COST_CACHE", str(tmp_path))
    calls = []

    def fake_grid(eng, rows, contexts, reps):
        calls.append((rows, contexts))
        return [[float(len(calls)) * r for r in rows] for _ in contexts]

    monkeypatch.setattr(cost_curve, "measure_grid", fake_grid)
    eng = type("E", (), {"max_positions": 8192})()
    first, measured = cost_curve.cached_or_measured(eng, KEY, 4)
    assert measured and calls == [([1, 2, 4], [256, 1024, 4096])]
    again, measured = cost_curve.cached_or_measured(eng, KEY, 4)
    assert not measured and again == first and len(calls) == 1
    fresh, measured = cost_curve.cached_or_measured(eng, KEY, 4, refresh=True)
    assert measured and len(calls) == 2 and fresh.seconds != first.seconds
    assert cost_curve.cached_or_measured(eng, KEY, 4)[0] == fresh  # the fresh curve replaced the cached one
    stale = cost_curve.CostCurve.from_json(fresh.to_json())
    stale.meta["measure_version"] = cost_curve.MEASURE_VERSION - 1  # measured before the last change
    cost_curve.store_curve(stale)
    current, measured = cost_curve.cached_or_measured(eng, KEY, 4)
    assert measured and len(calls) == 3 and cost_curve.is_current(current)
    assert not cost_curve.cached_or_measured(eng, KEY, 4)[1]


def test_a_graphed_curve_prices_a_block_as_the_power_of_two_it_runs_in_and_is_kept_apart():
    eager = CostCurve(KEY, rows=[1, 4, 8], contexts=[100], seconds=[[1.0, 4.0, 8.0]])
    graphed = CostCurve({**KEY, "graphs": True}, rows=[1, 4, 8], contexts=[100], seconds=[[1.0, 4.0, 8.0]])
    assert eager(3, 100) == pytest.approx(3.0) and eager(5, 100) == pytest.approx(5.0)
    assert graphed(3, 100) == graphed(4, 100) == 4.0 and graphed(5, 100) == graphed(8, 100) == 8.0
    assert graphed(1, 100) == 1.0 and not eager.graphed and graphed.graphed
    assert cache_name(graphed.key) != cache_name(eager.key)
    assert cache_name(KEY) == cache_name({**KEY, "graphs": False})  # eager curves keep their names
    from core.cost_curve import curve_key

    env = ("cpu: Some CPU", "m", "float32", "onednn", 2)
    assert curve_key(*env, graphs=False) == KEY and curve_key(*env, graphs=True) == graphed.key


def test_a_run_is_priced_on_the_curve_of_its_own_forwards():
    """A run with CUDA graphs takes the graphed curve of its environment, an eager run the eager one."""
    from analysis.cost_model import curve_for_run

    env = {"device": "cuda: H", "model": "m", "dtype": "bfloat16", "linear": "aten", "threads": 16}
    eager = CostCurve(env, rows=[1, 4], contexts=[100], seconds=[[1.0, 1.1]])
    graphed = CostCurve({**env, "graphs": True}, rows=[1, 4], contexts=[100], seconds=[[0.2, 0.3]])
    run = {"device_name": "cuda: H", "model": "m", "dtype": "bfloat16", "linear": "aten"}
    for curves in ([eager, graphed], [graphed, eager]):
        assert curve_for_run(curves, {**run, "cuda_graphs": "True"}) is graphed  # with_env's text
        assert curve_for_run(curves, {**run, "cuda_graphs": False}) is eager
        assert curve_for_run(curves, run) is eager  # records from before run.cuda_graphs
    assert curve_for_run([eager], {**run, "cuda_graphs": True}) is None


def test_a_grid_measured_on_fixed_shape_forwards_takes_them(tiny_lm, monkeypatch):
    """`measure_grid` on an engine with fixed-shape forwards (here their eager twin) times those
    forwards, each row count in the block it is padded to. The noise check is tests/test_cost_curve_checks'
    subject: off here, so that the other test worker's load cannot fail this one."""
    from core import cost_curve
    from core.cost_curve import measure_grid
    from core.engine import Engine

    monkeypatch.setattr(cost_curve, "suspect_points", lambda line: [])
    eng = Engine(tiny_lm.model)
    eng.use_graphs(capture=False)
    grid = measure_grid(eng, [1, 2, 4], [16], reps=2)
    assert len(grid) == 1 and len(grid[0]) == 3 and all(t > 0 for t in grid[0])
    # two passes of 3 row counts x 2 repeats
    assert eng.fixed_shape_steps == 2 * 3 * 2 and sorted(eng.graphs.by_rows) == [1, 2, 4]
