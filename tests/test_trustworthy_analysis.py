"""Analysis that refuses to pool or pair: one baseline per environment, one run per table cell, one
setup per table, inactive KV policies named, approximate paper cells marked, readable summaries."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

from analysis import fafo_paper as fp
from analysis.metrics import AnalysisError, reference_run, summarize
from analysis.summary import default_root, speedup_figure
from analysis.summary import main as summary_main
from runners.records import SAMPLE_COLUMNS, RunDir, typed_frame
from tests.synthetic_runs import BASE, run_rows


def _speedup(table: pd.DataFrame, run_id: str) -> float:
    return float(table.set_index("run_id").loc[run_id, "speedup"])


def test_an_extra_vanilla_run_of_another_configuration_changes_nothing():
    rows = run_rows("van", "vanilla", "full", 4.0) + run_rows("la", "lookahead", "full", 6.0)
    before = _speedup(summarize(pd.DataFrame(rows)), "la")
    extra = run_rows("van-short", "vanilla", "full", 1.0, max_new_tokens=16)  # another max_new_tokens
    extra += run_rows("van-seed1", "vanilla", "full", 1.5, seed=1)
    table = summarize(pd.DataFrame(rows + extra))
    assert _speedup(table, "la") == pytest.approx(before)
    for run_id in ("van", "van-short", "van-seed1"):  # a vanilla run is its own baseline, nobody else's
        assert _speedup(table, run_id) == pytest.approx(1.0)
    paper = fp.aggregate(pd.DataFrame(rows + extra[:6]), [])  # same setup, another max_new_tokens
    assert float(paper.set_index("method").loc["Lookahead", "speedup"]) == pytest.approx(before)


def test_two_baselines_in_one_environment_are_refused():
    rows = run_rows("van-a", "vanilla", "full", 4.0) + run_rows("van-b", "vanilla", "full", 3.0)
    rows += run_rows("la", "lookahead", "full", 2.0)
    with pytest.raises(AnalysisError, match="van-a, van-b"):
        summarize(pd.DataFrame(rows))


def test_unknown_environment_fields_never_pair_with_known_ones():
    old = [
        {k: v for k, v in r.items() if k not in ("prefill_chunk", "sample_set")}
        for r in run_rows("van", "vanilla", "full", 4.0)
    ]
    table = summarize(pd.concat([pd.DataFrame(old), pd.DataFrame(run_rows("la", "lookahead", "full", 2.0))]))
    row = table.set_index("run_id").loc["la"]
    assert np.isnan(row["speedup"]) and "no vanilla" in row["note"]


def test_paper_tables_refuse_mixed_setups_and_pooled_cells():
    rows = run_rows("van", "vanilla", "full", 4.0, task="mtbench") + run_rows(
        "van-tiny", "vanilla", "full", 1.0, task="mtbench", model="tiny_llama"
    )
    fafo = {"decoder.k": 6, "decoder.n": 40, "kv.budget": 760}
    rows += run_rows("fafo", "fafo", "streaming", 2.0, task="mtbench", **fafo)
    with pytest.raises(AnalysisError, match="2 setups .*model"):
        fp.table1(pd.DataFrame(rows))
    one = [r for r in rows if r["model"] == "smollm2-135m"]
    caption = fp.table1(pd.DataFrame(one)).attrs["caption"]
    assert (
        "Ours: smollm2-135m (float32)" in caption
        and "tiny_llama" not in caption
        and "code deadbeef" in caption
    )
    pooled = one + run_rows("fafo-m8", "fafo", "streaming", 2.5, task="mtbench", **fafo, **{"decoder.m": 8})
    with pytest.raises(AnalysisError, match="would pool 2 runs: fafo, fafo-m8 .*decoder.m"):
        fp.table1(pd.DataFrame(pooled))


def test_fafo_paper_cli_prints_one_set_of_tables_per_setup(tmp_path, capsys):
    rows = run_rows("van", "vanilla", "full", 4.0, task="mtbench")
    rows += run_rows("van-tiny", "vanilla", "full", 1.0, task="mtbench", model="tiny_llama", model_name="t")
    _write_runs(tmp_path, rows)
    fp.main(["--root", str(tmp_path)])
    out = capsys.readouterr().out
    assert "=== setup 1 of 2" in out and "=== setup 2 of 2" in out
    assert "smollm2-135m, tiny_llama" not in out


def test_inactive_policy_is_named_in_every_table():
    rows = run_rows("van", "vanilla", "full", 4.0, task="mtbench")
    fafo = {"decoder.k": 6, "decoder.n": 40, "kv.budget": 760}
    rows += run_rows("fafo", "fafo", "streaming", 2.0, task="mtbench", **fafo)
    rows += run_rows("fafo-q", "fafo", "quest", 2.0, task="mtbench", **fafo, restricted_frac=0.5)
    table = summarize(pd.DataFrame(rows)).set_index("run_id")
    assert table.loc["fafo", "kv_activity"].startswith("inactive")
    assert table.loc["fafo-q", "kv_activity"] == "restricted 50% of forwards"
    assert table.loc["van", "kv_activity"] == "-"
    t2 = fp.table2(pd.DataFrame(rows), tasks=("mtbench",)).set_index("method")
    assert t2.loc["FAFO-Stream", "ours_kv_activity"].startswith("inactive")


def test_prose_approximations_stay_marked():
    rows = run_rows("van", "vanilla", "full", 4.0, task="mtbench")
    t12 = fp.table12(pd.DataFrame(rows))
    approx = t12[t12["decoder.n"].astype(str) == "10"]
    assert len(approx) and (approx["paper_speedup_approx"] == "~ (prose)").any()
    exact = t12[t12["decoder.n"].astype(str) == "20"]
    assert exact.get("paper_tau_approx", pd.Series(dtype=object)).isna().all()


def _write_runs(root, rows: list[dict]) -> None:
    df = pd.DataFrame(rows)
    for run_id, run in df.groupby("run_id"):
        rd = RunDir(root / "runs", run_id)
        rd.path.mkdir(parents=True)
        first = run.iloc[0]
        rd.write_run(
            {
                **{k: first[k] for k in BASE},
                "run_id": run_id,
                "status": "complete",
                "decoder": first["decoder"],
                "kv": first["kv"],
                "lossless": True,
                "decoder_params": json.dumps({"_target_": "x"}),
                "kv_params": "{}",
            }
        )
        cols = [c for c in SAMPLE_COLUMNS if c in run.columns]
        records = typed_frame(run[cols].to_dict("records"), {c: SAMPLE_COLUMNS[c] for c in cols})
        rd.write_sample("all", records.to_dict("records"), [], [])
        rd.consolidate()
        rd.mark_complete()


def test_summary_defaults_to_the_config_out_dir_and_documents_root(capsys):
    assert default_root() == "results"
    with pytest.raises(SystemExit):
        summary_main(["--help"])
    assert "--root" in capsys.readouterr().out and "run.out_dir" in capsys.readouterr().out + "run.out_dir"


def test_summary_cli_runs_without_pandas_warnings_and_refuses_in_one_line(tmp_path, capsys):
    rows = run_rows("van", "vanilla", "full", 4.0) + run_rows("la", "lookahead", "full", 2.0)
    _write_runs(tmp_path, rows)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        table = summary_main(["--root", str(tmp_path)])
    assert _speedup(table, "la") == pytest.approx(2.0, rel=0.2)
    assert reference_run(tmp_path, "la") == tmp_path / "runs" / "van"
    _write_runs(tmp_path, run_rows("van2", "vanilla", "full", 3.0))
    with pytest.raises(SystemExit, match="^error: two vanilla kv=full runs"):
        summary_main(["--root", str(tmp_path)])


def test_figure_stays_readable_with_nine_tasks_and_long_names(tmp_path):
    rows = []
    for t in range(9):
        rows += run_rows(f"van{t}", "vanilla", "full", 4.0, task=f"task{t}")
        for m in range(4):
            long = {"decoder.a_very_long_parameter_name": m, "decoder.another_long_one": "x" * 20}
            rows += run_rows(
                f"r{t}-{m}", f"decoder_with_long_name_{m}", "full", 2.0 + m, task=f"task{t}", **long
            )
    table = summarize(pd.DataFrame(rows))
    path = speedup_figure(table, tmp_path / "f.png")
    import matplotlib.image as mpimg

    h, w = mpimg.imread(path).shape[:2]
    assert w <= 1600 and h <= 2000  # a 3-column grid, not 9 panels side by side


def test_divergences_at_a_numerical_tie_are_told_apart_from_real_ones():
    """bf16 runs diverge from vanilla where its top-2 logits tie within bf16 rounding (a multi-row
    forward rounds differently): the run report and the summary say so, and flag a larger gap."""
    from analysis.metrics import divergences_at_ties, match_or_tie_rate
    from runners.report import divergence_note

    samples = pd.DataFrame(
        {
            "error": [None] * 5,
            "matches_vanilla": [True, False, False, False, None],
            "divergence_gap": [None, 0.0, 0.125, 0.5, None],
        }
    )
    assert divergences_at_ties(samples, "bfloat16") == (3, 2)
    assert divergences_at_ties(samples, "float32") == (3, 1)  # only the exact tie is within 1e-4
    assert match_or_tie_rate(samples, "bfloat16") == pytest.approx(3 / 4)
    note = divergence_note(pd.Series({"dtype": "bfloat16"}), samples)
    assert "3 turn(s) diverge" in note and "2 of them" in note and "1 beyond it" in note
    assert "no tie tolerance" in divergence_note(pd.Series({"dtype": "int8"}), samples)
    lossy = divergence_note(pd.Series({"dtype": "bfloat16", "lossless": False}), samples)
    assert "as a lossy decoder or KV policy may" in lossy and "compare in float32" not in lossy
    assert divergence_note(pd.Series({"dtype": "bfloat16"}), samples.iloc[[0, 4]]) is None
