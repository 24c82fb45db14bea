"""The paper report's numbers are the records' (issue 95): one run per cell, scale labels from what ran,
counts over measured rows only, verdicts from the recorded intervals, paper cells marked as they are."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import fafo_paper as fp
from analysis.fafo_orderings import orderings
from analysis.metrics import AnalysisError, scale_label
from analysis.report_parts import setup_name
from tests.synthetic_runs import rows, write_run

FAFO = {"decoder.k": 6, "decoder.n": 40, "kv.budget": 760}


def with_ids(frame: list[dict], run_id: str) -> list[dict]:
    return [{**r, "run_id": run_id, "committed": r["tau"] * r["forwards"]} for r in frame]


def two_task_budget_runs() -> pd.DataFrame:
    """FAFO-Stream at budget 760 on MT-Bench (Table 1/2's run) and on Multi-IF (Table 13's)."""
    r = []
    for task, wall in (("mtbench", 2.0), ("multi_if", 3.0)):
        r += with_ids(rows("vanilla", "full", 4.0, 1.0, task), f"van-{task}")
        r += with_ids(rows("fafo", "streaming", wall, 2.0, task, **FAFO), f"fafo-{task}")
    return pd.DataFrame(r)


def test_a_cell_of_two_runs_is_refused_and_table13_takes_the_multi_if_run():
    samples = two_task_budget_runs()
    with pytest.raises(AnalysisError, match="would pool 2 runs: fafo-mtbench, fafo-multi_if"):
        fp.table13(samples, task=None)  # every task at once: two runs in the 760 cell
    t = fp.table13(samples).set_index("kv.budget")
    assert t.loc["760", "ours_speedup"] == pytest.approx(4.0 / 3.0)  # Multi-IF's run, not the mean
    assert "Multi-IF" in t.attrs["title"]
    with pytest.raises(AnalysisError, match="no FAFO-Stream run on Multi-IF"):
        fp.table13(samples[samples["task"] == "mtbench"])  # MT-Bench runs are not Table 13's


def test_scale_is_named_by_what_ran_not_by_the_preset():
    ran = pd.DataFrame(
        {"run_id": ["a", "a"], "sample_id": ["s0", "s1"], "scale": "paper", "limit": 2.0,
         "max_new_tokens": 64, "task.max_new_tokens": 256}
    )  # fmt: skip
    assert "NOT the paper's protocol: 2 samples/run, 64 new tokens (task: 256)" in scale_label(ran)
    key = {"device_name": "cpu: AMD EPYC x2 threads", "threads": "2", "dtype": "float32",
           "model": "smollm2-135m", "scale": "paper"}  # fmt: skip
    assert setup_name(key, ran) == "cpu-epyc2-fp32@2samples-64tok"
    full = ran.assign(limit=float("nan"), max_new_tokens=256)
    assert scale_label(full) == "" and setup_name(key, full) == "cpu-epyc2-fp32@paper"


def test_cost_count_is_over_runs_with_a_measured_speedup(tmp_path):
    from analysis import paper
    from analysis.cost_model import CostCurve, cache_name

    root = tmp_path / "records"
    write_run(root, "v", "vanilla", "full", "", 10.0)
    steps = [
        dict(step=j, block_tokens=8, drafted=7, accepted=6, committed=7, kv_attended=0, draft=False,
             draft_model=False)
        for j in range(9)
    ]  # fmt: skip
    write_run(root, "m", "pld", "full", "fafo_baselines", 5.0, steps=steps)
    write_run(root, "alone", "pld", "full", "fafo_baselines", 5.0, steps=steps, task="gsm8k")  # no vanilla
    key = {"device": "cpu: test", "model": "smollm2-135m", "dtype": "float32", "linear": "aten", "threads": 2}
    (tmp_path / "cpu-test").mkdir()
    curve = CostCurve(key, [1, 8], [64, 256], [[1.0, 1.75], [1.0, 1.75]])
    (tmp_path / "cpu-test" / cache_name(key)).write_text(curve.to_json())
    text = " ".join(" ".join(paper.cost_section(root, tmp_path)).split())  # prose wraps its lines
    assert "0 of 1 runs with a measured speedup within +-15% (1 without one" in text


def _ordering_samples(lookahead_tau: float, spread: float) -> pd.DataFrame:
    """FAFO-Stream at tau 2.0 against Lookahead, both with a spread over samples of +-`spread`."""
    r = with_ids(rows("vanilla", "full", 4.0, 1.0, n_samples=6), "van")
    for run_id, decoder, kv, tau, params in (
        ("fafo", "fafo", "streaming", 2.0, FAFO),
        ("la", "lookahead", "full", lookahead_tau, {"decoder.G": 7}),
    ):
        part = with_ids(rows(decoder, kv, 2.0, tau, n_samples=6, **params), run_id)
        for i, row in enumerate(part):
            row["committed"] = row["forwards"] * (tau + (spread if i % 4 < 2 else -spread))
        r += part
    return pd.DataFrame(r)


def test_orderings_say_within_noise_where_the_intervals_overlap():
    claim = "MT-Bench: FAFO-Stream > Lookahead by tau"
    close = orderings(_ordering_samples(1.94, 0.3)).set_index("claim").loc[claim]
    assert close["verdict"] == "within noise" and "margin +0.06" in close["ours (A vs B, 95% interval)"]
    far = orderings(_ordering_samples(1.2, 0.05)).set_index("claim").loc[claim]
    assert far["verdict"] == "holds"
    below = orderings(_ordering_samples(2.8, 0.05)).set_index("claim").loc[claim]
    assert below["verdict"] == "differs" and below["why it differs"]


def test_paper_cells_are_marked_as_they_are():
    samples = two_task_budget_runs()
    t12 = fp.table12(samples).set_index(["method", "decoder.n"])
    assert pd.isna(t12.loc[("FAFO-Stream", "40"), "paper_tau_approx"])  # 2.3 is Table 12's own cell
    assert t12.loc[("FAFO-Stream", "10"), "paper_tau_approx"] == "~ (prose)"
    assert list(t12.columns).index("paper_speedup_approx") == list(t12.columns).index("paper_speedup") + 1
    extra = with_ids(rows("pld", "full", 2.0, 1.5), "pld")
    t2 = fp.table2(pd.concat([samples, pd.DataFrame(extra)]), tasks=("mtbench",)).set_index("method")
    assert t2.loc["PLD", "paper_source"] == "- (no paper cell)"
    assert t2.loc["FAFO-Stream", "paper_source"] == "Table 2, Llama-2-7b-chat"
    assert "peak RSS on a CPU but allocated GPU memory" in fp.table1(samples).attrs["notes"]


def test_triforce_tau_of_gamma2_plus_one_is_explained():
    base = {"decoder.gamma2": 6, "forwards": 9, "committed": 63, "drafted": 54, "accepted": 54}
    tri = pd.DataFrame([{**base, "restricted_frac": 0.0}] * 2)
    assert "exactly gamma2 + 1 = 7" in fp.triforce_full_middle_note(tri)
    assert fp.triforce_full_middle_note(tri.assign(restricted_frac=0.5)) == ""


def test_the_papers_pairs_are_priced_against_an_eager_like_and_a_bandwidth_bound_vanilla():
    from analysis import cost_model as cm

    van = {"decoder": "vanilla", "kv": "full", "device_name": "NVIDIA H200", "model": "m", "dtype": "bf16",
           "task": "mtbench", "new_tokens": 100}  # fmt: skip
    runs = pd.DataFrame(
        [{**van, "cuda_graphs": False, "decode_s": 1.0}, {**van, "cuda_graphs": True, "decode_s": 0.25}]
    )
    ratio, where = cm.eager_step_ratio(runs)
    assert ratio == pytest.approx(4.0) and "eager vanilla 10.0 ms per token, graphed 2.5 ms" in where
    pairs = cm.check_pairs(cm.GPUS["A100-80GB"], cm.SHAPES["llama-2-7b"], eager_ratio=ratio).set_index("rows")
    block = pairs.loc[481, "cost_ratio"].iloc[0]
    assert pairs.loc[481, "cost_ratio_eager"].iloc[0] == pytest.approx((block + 3) / 4)  # host cost shared
    assert (pairs.loc[57, "cost_ratio_eager"] == 1).all()
    assert "error_pct_eager" not in cm.check_pairs(cm.GPUS["A100-80GB"], cm.SHAPES["llama-2-7b"]).columns
