"""Caches on disk are checked before they are trusted: a cost curve filed under this environment's name
but measured for another, or of a broken shape, is measured again with one line saying why (never used,
never a traceback); a vanilla reference edited, nulled or cut short is made again, not compared with."""

from __future__ import annotations

import json

import pytest

from core import cost_curve
from core.cost_curve import CostCurve, cache_name, cached_or_measured, curve_key, read_cached

KEY = curve_key("cpu: Some CPU [none] x2 threads", "m", "float32", "aten", 2, graphs=False)


def good() -> CostCurve:
    meta = cost_curve.measurement_meta(5)
    return CostCurve(
        KEY, rows=[1, 2, 4], contexts=[256, 1024], seconds=[[1.0, 1.1, 1.3], [2.0, 2.1, 2.4]], meta=meta
    )


class FakeEngine:
    max_positions = 8192


@pytest.fixture
def measured(tmp_path, monkeypatch):
    """Point the cache at tmp_path and measure fake grids; returns the list of grids measured."""
    monkeypatch.setenv("HARNESS_COST_CACHE", str(tmp_path))
    calls: list[list[int]] = []

    def fake_grid(eng, rows, contexts, reps):
        calls.append(rows)
        return [[0.01 * (1 + r) for r in rows] for _ in contexts]

    monkeypatch.setattr(cost_curve, "measure_grid", fake_grid)
    return calls


def write_cached(tmp_path, text: str) -> None:
    (tmp_path / cache_name(KEY)).write_text(text)


def test_a_curve_filed_under_this_model_but_measured_for_another_is_measured_again(tmp_path, measured):
    other = good()
    other.key = {**KEY, "model": "another-model"}
    write_cached(tmp_path, other.to_json())
    assert read_cached(KEY)[0] is None and "model 'another-model' instead of 'm'" in read_cached(KEY)[1]
    said: list[str] = []
    curve, fresh = cached_or_measured(FakeEngine(), KEY, 4, on_measure=said.append)
    assert fresh and measured and curve.key == KEY
    assert len(said) == 1 and "measured for another environment" in said[0]
    assert read_cached(KEY) == (curve, "")  # the right curve replaced it


def test_a_hub_model_curve_is_apart_from_another_hub_models():
    a = curve_key("cpu", "hf", "float32", "aten", 2, graphs=False, model_name="org/a")
    b = curve_key("cpu", "hf", "float32", "aten", 2, graphs=False, model_name="org/b")
    assert cache_name(a) != cache_name(b) and cost_curve.key_mismatch(a, b)
    same = curve_key("cpu", "smollm2-135m", "float32", "aten", 2, graphs=False, model_name="smollm2-135m")
    assert "model_name" not in same  # a packaged model keeps the key and cache name it always had


BROKEN = {
    "empty grid": lambda c: {**c, "rows": [], "seconds": [[] for _ in c["contexts"]]},
    "no contexts": lambda c: {**c, "contexts": [], "seconds": []},
    "rows as text": lambda c: {**c, "rows": ["1", "2", "4"]},
    "rows repeated": lambda c: {**c, "rows": [1, 2, 2]},
    "rows at zero": lambda c: {**c, "rows": [0, 2, 4]},
    "ragged grid": lambda c: {**c, "seconds": [[1.0, 1.1], [2.0, 2.1, 2.4]]},
    "a row of text": lambda c: {**c, "seconds": [[1.0, 1.1, 1.3], "slow"]},
    "a time as text": lambda c: {**c, "seconds": [[1.0, "1.1", 1.3], [2.0, 2.1, 2.4]]},
    "a null time": lambda c: {**c, "seconds": [[1.0, None, 1.3], [2.0, 2.1, 2.4]]},
    "an infinite time": lambda c: {**c, "seconds": [[1.0, float("inf"), 1.3], [2.0, 2.1, 2.4]]},
    "a negative time": lambda c: {**c, "seconds": [[1.0, -1.1, 1.3], [2.0, 2.1, 2.4]]},
    "a key that is a list": lambda c: {**c, "key": ["cpu"]},
    "meta null": lambda c: {**c, "meta": None},
    "a list": lambda c: [c],
    "no fields": lambda c: {},
    "an extra field": lambda c: {**c, "colour": "red"},
}


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_a_broken_curve_file_is_measured_again_with_a_reason(tmp_path, measured, what):
    write_cached(tmp_path, json.dumps(BROKEN[what](json.loads(good().to_json()))))
    said: list[str] = []
    curve, fresh = cached_or_measured(FakeEngine(), KEY, 4, on_measure=said.append)
    assert fresh and curve.rows == [1, 2, 4] and len(measured) == 1
    assert len(said) == 1 and "the cached one is not used" in said[0] and "\n" not in said[0], said


@pytest.mark.parametrize("text", ["", "{", "null", "\x00\xff"])
def test_a_curve_file_that_is_not_json_is_measured_again(tmp_path, measured, text):
    write_cached(tmp_path, text)
    said: list[str] = []
    assert cached_or_measured(FakeEngine(), KEY, 4, on_measure=said.append)[1]
    assert "holds no valid cost curve" in said[0]


def test_a_curve_file_that_is_a_folder_is_one_line(tmp_path, measured):
    (tmp_path / cache_name(KEY)).mkdir()
    curve, why = read_cached(KEY)
    assert curve is None and "cannot be read" in why


def _references(out) -> list:
    (path,) = (out / "vanilla_cache").glob("*.jsonl")
    return path


EDITS = {
    "an edited id": lambda row: {**row, "ids": [row["ids"][0] + 1, *row["ids"][1:]]},
    "null ids": lambda row: {**row, "ids": None},
    "cut short": lambda row: {**row, "ids": row["ids"][:-1]},
    "no digest (stored before the check)": lambda row: {"key": row["key"], "ids": row["ids"]},
}


def test_an_edited_vanilla_reference_is_made_again_not_trusted(tmp_path, capsys):
    import pandas as pd

    from runners.runner import Runner
    from tests.helpers import make_cfg

    quick = ("+task.n=2", "run.count_syncs=0")
    Runner(make_cfg(tmp_path, *quick)).run()  # vanilla: stores the references
    path = _references(tmp_path)
    rows = sorted((json.loads(line) for line in path.read_text().splitlines()), key=lambda r: r["key"])
    for seed, (what, edit) in enumerate(EDITS.items()):
        path.write_text("".join(json.dumps(edit(r)) + "\n" for r in rows) + '{"key": "torn\n')
        capsys.readouterr()
        run = Runner(make_cfg(tmp_path, *quick, "decoder=pld", f"run.seed={seed}")).run()  # lossless
        said = capsys.readouterr().out
        assert pd.read_parquet(run / "samples.parquet")["matches_vanilla"].all(), what
        assert said.count("fail their length or digest check") == 1, what
        assert f"{len(rows) + 1} vanilla reference(s)" in said, what
        again = sorted((json.loads(line) for line in path.read_text().splitlines()), key=lambda r: r["key"])
        assert again == [{**r, "n": len(r["ids"])} for r in rows], what  # made again, the bad lines gone
