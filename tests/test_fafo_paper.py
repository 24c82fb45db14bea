"""analysis.fafo_paper on a synthetic per-sample table: our numbers land in the right cells, the
paper's numbers come from results/curated/paper_tables_fafo.csv, captions name our setup."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from analysis import fafo_paper as fp
from analysis.fafo_figure1 import figure1 as fafo_figure1
from analysis.fafo_orderings import orderings as fafo_orderings
from tests.synthetic_runs import rows


@pytest.fixture()
def samples() -> pd.DataFrame:
    r = []
    for task in ("mtbench", "gsm8k"):
        r += rows("vanilla", "full", 4.0, 1.0, task)
        r += rows("fafo", "streaming", 2.0, 2.5, task, **{"decoder.k": 6, "decoder.n": 40, "kv.budget": 760})
        r += rows("fafo", "quest", 2.5, 2.0, task, **{"decoder.k": 6, "decoder.n": 40, "kv.budget": 760})
        r += rows("lookahead", "full", 3.2, 1.6, task, **{"decoder.G": 7})
    for k, wall in ((4, 3.0), (8, 2.2)):
        r += rows(
            "fafo", "streaming", wall, 2.0 + k / 10, **{"decoder.k": k, "decoder.n": 40, "kv.budget": 760}
        )
    for n, wall in ((10, 3.6), (20, 2.9)):
        r += rows("fafo", "streaming", wall, 1.5, **{"decoder.k": 6, "decoder.n": n, "kv.budget": 760})
        r += rows("lookahead", "full", wall + 1, 1.4, **{"decoder.G": n})
    for budget in (360, 1360):
        r += rows("fafo", "streaming", 2.4, 2.2, **{"decoder.k": 6, "decoder.n": 40, "kv.budget": budget})
    r += rows("fafo_2forward", "streaming", 3.0, 2.4, **{"decoder.k": 6, "decoder.n": 40, "kv.budget": 760})
    return pd.DataFrame(r)


def cell(df: pd.DataFrame, col: str, **match: object) -> float:
    sel = df
    for k, v in match.items():
        sel = sel[sel[k].astype(str) == str(v)]
    assert len(sel) == 1, (match, sel)
    return float(sel[col].iloc[0])


def test_method_labels():
    assert fp.method_of("fafo", "streaming") == "FAFO-Stream"
    assert fp.method_of("fafo_cpu", "quest") == "FAFO-Quest"
    assert fp.method_of("fafo_2forward", "streaming") == "FAFO-2forward"
    assert fp.method_of("lookahead", "full") == "Lookahead"
    assert fp.method_of("swift", "full") == "SWIFT"


def test_table1(samples):
    t = fp.table1(samples)
    assert cell(t, "ours_speedup", method="FAFO-2forward") == pytest.approx(4.0 / 3.0)
    assert cell(t, "ours_tau", method="FAFO-2forward") == pytest.approx(2.4)
    assert cell(t, "paper_speedup", method="FAFO-2forward") == pytest.approx(1.19)
    assert cell(t, "paper_peak_memory_MB", method="Lookahead") == 2183
    assert math.isnan(cell(t, "ours_tau", method="SWIFT")) and cell(t, "paper_tau", method="SWIFT") == 2.65
    assert "smollm2-135m" in t.attrs["caption"] and "cpu: test x2" in t.attrs["caption"]
    assert "A100" in t.attrs["caption"]


def test_sweeps_hold_the_other_parameters_fixed(samples):
    """A sweep varies only its own column: rows of the other sweeps (n, budget) stay out."""
    t11 = fp.table11(samples)
    assert cell(t11, "ours_speedup", **{"decoder.k": "6"}) == pytest.approx(4.0 / 2.0)
    assert cell(t11, "ours_speedup", **{"decoder.k": "4"}) == pytest.approx(4.0 / 3.0)
    assert cell(t11, "paper_speedup", **{"decoder.k": "4"}) == pytest.approx(0.90)
    assert math.isnan(cell(t11, "ours_speedup", **{"decoder.k": "9"}))  # paper-only column
    assert cell(t11, "paper_tau", **{"decoder.k": "9"}) == pytest.approx(2.15)


def test_table2_per_task(samples):
    t = fp.table2(samples)
    assert cell(t, "ours_speedup", method="FAFO-Quest", task="GSM8K") == pytest.approx(4.0 / 2.5)
    assert cell(t, "paper_speedup", method="FAFO-Quest", task="GSM8K") == pytest.approx(1.40)
    assert cell(t, "paper_tau", method="FAFO-SnapKV", task="MT-Bench") == pytest.approx(1.90)  # Table 8
    assert math.isnan(cell(t, "ours_tau", method="FAFO-Stream", task="HumanEval-Completion"))
    assert cell(t, "paper_tau", method="Lookahead", task="HumanEval-Completion") == pytest.approx(1.77)


def test_table12_and_prose(samples):
    t = fp.table12(samples)
    assert cell(t, "ours_speedup", method="FAFO-Stream", **{"decoder.n": "20"}) == pytest.approx(4.0 / 2.9)
    assert cell(t, "paper_speedup", method="FAFO-Stream", **{"decoder.n": "20"}) == pytest.approx(1.78)
    assert cell(t, "paper_speedup", method="FAFO-Stream", **{"decoder.n": "10"}) == pytest.approx(
        1.05
    )  # prose
    assert cell(t, "paper_tau", method="FAFO-Quest", **{"decoder.n": "40"}) == pytest.approx(2.19)
    # Lookahead's runs (no decoder.n) add no "nan" column; the sweep values are in numeric order
    assert list(t[t["method"] == "FAFO-Stream"]["decoder.n"]) == ["10", "20", "40"]


def test_table13(samples):
    t = fp.table13(samples, task="mtbench")
    assert cell(t, "ours_speedup", **{"kv.budget": "1360"}) == pytest.approx(4.0 / 2.4)
    assert cell(t, "paper_speedup", **{"kv.budget": "760"}) == pytest.approx(2.02)
    assert math.isnan(cell(t, "ours_tau", **{"kv.budget": "560"}))


def test_table2_ignores_runs_of_other_tasks(samples):
    """Table 13's Multi-IF budget sweep (several FAFO-Stream runs) does not make Table 2 pool cells."""
    extra = [
        r
        for frac in (0.05, 0.1)
        for r in rows("fafo", "streaming", 2.0, 2.0, "multi_if", **{"decoder.k": 6, "decoder.n": 40,
                                                                    "kv.budget": 760, "kv.budget_frac": frac})
    ]  # fmt: skip
    both = pd.concat([samples, pd.DataFrame(extra)], ignore_index=True)
    assert cell(fp.table2(both), "ours_tau", method="FAFO-Stream", task="MT-Bench") == pytest.approx(2.5)


def test_table13_budget_fractions_stand_for_the_paper_budgets():
    """experiment=fafo_table13_frac at scale=cpu: each budget fraction is shown under the paper budget
    it stands for (fraction x 7600); the config budget (760) of those runs is ignored."""
    r = rows("vanilla", "full", 4.0, 1.0, "multi_if", scale="cpu")
    for frac, wall in ((0.0474, 3.0), (0.1789, 2.0)):
        params = {"decoder.k": 6, "decoder.n": 40, "kv.budget": 760, "kv.budget_frac": frac, "scale": "cpu"}
        r += rows("fafo", "streaming", wall, 2.0, "multi_if", **params)
    t = fp.table13(pd.DataFrame(r), task="multi_if")
    assert cell(t, "ours_speedup", **{"kv.budget": "360"}) == pytest.approx(4.0 / 3.0)
    assert cell(t, "ours_speedup", **{"kv.budget": "1360"}) == pytest.approx(2.0)
    assert math.isnan(cell(t, "ours_speedup", **{"kv.budget": "760"}))
    assert (
        "kv.budget_frac x 7600" in t.attrs["caption"]
        and "scale=cpu: NOT the paper's setting" in t.attrs["caption"]
    )


def test_orderings_check_the_papers_claims(samples):
    """Each claim's verdict from our cells (no spread over samples here: the values decide alone)."""
    t = fafo_orderings(samples).set_index("claim")
    row = t.loc["MT-Bench: FAFO-Stream > Lookahead by tau"]
    assert (row["paper (A vs B)"], row["verdict"]) == ("2.29 vs 1.66", "holds")
    assert row["ours (A vs B, 95% interval)"] == "2.5 vs 1.6, margin +0.9"
    assert t.loc["MT-Bench: FAFO-Stream > FAFO-Quest by speedup", "verdict"] == "holds"
    assert t.loc["MT-Bench: the k sweep's tau peaks at k=8", "verdict"] == "holds"
    assert t.loc["MT-Bench: the n sweep's tau peaks at n=40", "verdict"] == "holds"
    # a sweep of one point (the paper's setting alone) gives no verdict on where the peak is
    only_k6 = samples[samples["decoder.k"].isna() | (samples["decoder.k"] == 6)]
    assert "MT-Bench: the k sweep's tau peaks at k=8" not in set(fafo_orderings(only_k6)["claim"])
    assert fafo_orderings(samples[samples["task"] == "pg19"]).empty  # nothing of ours: no claims shown
    slow = samples.copy()
    slow.loc[slow["decoder"] == "fafo", "wall_s"] *= 10  # FAFO slower than Lookahead in wall-clock
    row = fafo_orderings(slow).set_index("claim").loc["MT-Bench: FAFO-Stream > Lookahead by speedup"]
    assert row["verdict"] == "differs" and "every row costs compute" in row["why it differs"]


def test_figure1(samples, tmp_path):
    png = tmp_path / "fig1.png"
    t = fafo_figure1(samples, png)
    assert png.exists() and png.stat().st_size > 1000
    assert cell(t, "speedup", method="Lookahead", guesses=10.0) == pytest.approx(4.0 / 4.6)
    assert cell(t, "tau", method="FAFO-Stream", guesses=20.0) == pytest.approx(1.5)
    assert set(t["method"]) == {"FAFO-Stream", "FAFO-Quest", "Lookahead"}
    assert "Figure 1" in fp.render(t)
    assert "dtype" not in t.columns and "model" not in t.columns  # the caption names the one setup


def test_failed_samples_are_dropped(samples):
    bad = samples.copy()
    bad["error"] = None
    broken = bad.index[(bad["decoder"] == "fafo_2forward") & (bad["sample_id"] == "q0")]
    bad.loc[broken, "error"] = "boom"
    bad.loc[broken, "wall_s"] = 1e9
    assert cell(fp.table1(bad), "ours_speedup", method="FAFO-2forward") == pytest.approx(4.0 / 3.0)


# --- the experiment files behind the tables ---------------------------------------------------------
EXPERIMENTS = sorted(
    p.stem for p in (fp.Path(__file__).resolve().parents[1] / "conf" / "experiment").glob("fafo_*.yaml")
)


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_experiment_sweep_points_compose_and_instantiate(experiment, tiny_lm):
    """Every job of every fafo_* sweep composes, and its decoder + kv policy instantiate."""
    import itertools

    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from core.engine import Engine
    from runners.schemas import register_schemas

    register_schemas()
    conf = str(fp.Path(__file__).resolve().parents[1] / "conf")
    with initialize_config_dir(conf, version_base="1.3"):
        base = compose("config", overrides=[f"experiment={experiment}"], return_hydra_config=True)
        params = {k: str(v).split(",") for k, v in base.hydra.sweeper.params.items()}
        assert params, f"{experiment} defines no sweep"
        assert base.run.limit is None  # the paper's protocol: every sample
        engine = Engine(tiny_lm.model)
        for values in itertools.product(*params.values()):
            job = [f"experiment={experiment}", *(f"{k}={v}" for k, v in zip(params, values))]
            cfg = compose("config", overrides=job)
            decoder = instantiate(cfg.decoder)(engine=engine, kv=instantiate(cfg.kv))
            for key, value in zip(params, values):
                if key.startswith("decoder."):
                    assert str(getattr(decoder, key.split(".", 1)[1])) == value  # the option reached it
            if experiment == "fafo_figure1_lookahead":
                assert decoder.W == decoder.G


def test_table10_by_context_length_with_the_triforce_rows():
    """Each context length is its own environment (task parameters differ): every method pairs with the
    vanilla run of its context; the caption names our TriForce rows' draft."""
    r = []
    for ctx, wall in ((1024, 4.0), (2048, 6.0)):
        params = {"task_params": f'{{"context_length": {ctx}}}', "task.context_length": ctx}
        r += rows("vanilla", "full", wall, 1.0, "pg19", **params)
        r += rows(
            "triforce", "retrieval", wall / 2, 5.0, "pg19", **params, **{"draft.label": "self-draft: 4"}
        )
        r += rows("fafo", "streaming", wall / 4, 3.0, "pg19", **params, **{"decoder.k": 6, "kv.budget": 760})
    t = fp.table10(pd.DataFrame(r)).set_index(["method", "task.context_length"])
    assert t.loc[("TriForce", "1024"), "ours_speedup"] == pytest.approx(2.0)
    assert t.loc[("FAFO-Stream", "2048"), "ours_speedup"] == pytest.approx(4.0)
    assert t.loc[("TriForce", "1024"), "paper_speedup"] == pytest.approx(1.83)
    assert t.loc[("TriForce", "3072"), "paper_tau"] == pytest.approx(5.5)
    assert math.isnan(t.loc[("TriForce", "3072"), "ours_speedup"])
    assert "self-draft: 4" in fp.table10(pd.DataFrame(r)).attrs["caption"]


def test_swift_runs_fill_the_swift_rows_of_tables_1_and_2(samples):
    """decoder=swift (experiment=fafo_swift) fills the SWIFT rows beside the paper's, in Tables 1 and 2."""
    swift = pd.DataFrame(rows("swift", "full", 5.0, 1.7) + rows("swift", "full", 8.0, 1.5, "gsm8k"))
    both = pd.concat([samples, swift], ignore_index=True)
    t1 = fp.table1(both)
    assert cell(t1, "ours_tau", method="SWIFT") == pytest.approx(1.7)
    assert cell(t1, "ours_speedup", method="SWIFT") == pytest.approx(4.0 / 5.0)
    assert cell(t1, "paper_tau", method="SWIFT") == 2.65
    t2 = fp.table2(both, tasks=("mtbench", "gsm8k"))
    assert cell(t2, "ours_speedup", method="SWIFT", task="GSM8K") == pytest.approx(0.5)
    assert cell(t2, "paper_tau", method="SWIFT", task="GSM8K") == 2.43


def test_a_run_pairs_with_its_own_experiments_vanilla_run():
    """Two experiments that each ran their own vanilla run in one environment (experiment=fafo_swift
    beside fafo_baselines): each method's speedup is over its own experiment's vanilla run, timed
    beside it, instead of a refusal for two vanilla runs."""
    r = []
    for exp, decoder, kv, wall, tau in (
        ("fafo_baselines", "vanilla", "full", 4.0, 1.0),
        ("fafo_baselines", "lookahead", "full", 2.0, 1.6),
        ("fafo_swift", "vanilla", "full", 10.0, 1.0),
        ("fafo_swift", "swift", "full", 5.0, 1.7),
    ):
        r += [{**x, "experiment": exp, "run_id": f"{exp}-{decoder}"} for x in rows(decoder, kv, wall, tau)]
    t1 = fp.table1(pd.DataFrame(r), fixed={})
    assert cell(t1, "ours_speedup", method="SWIFT") == pytest.approx(10.0 / 5.0)
    assert cell(t1, "ours_speedup", method="Lookahead") == pytest.approx(4.0 / 2.0)


SAMPLED = '{"temperature": 0.6, "top_p": 0.9, "top_k": 0}'


def test_sampled_runs_fill_table4_alone(samples):
    """Runs sampled at temperature 0.6 (experiment=fafo_table4) fill Table 4 beside the paper's sampled
    numbers and no greedy table; greedy runs fill no cell of Table 4."""
    greedy = samples.assign(sampling='{"temperature": 0.0, "top_p": 1.0, "top_k": 0}')
    assert fp.table4(greedy)["ours_speedup"].isna().all()
    r = []
    for decoder, kv, wall, tau in (("vanilla", "full", 6.0, 1.0), ("fafo", "streaming", 3.0, 2.2)):
        r += rows(decoder, kv, wall, tau, "gsm8k", sampling=SAMPLED, **{"decoder.k": 6, "decoder.n": 40})
    sampled = pd.DataFrame(r)
    t4 = fp.table4(sampled)
    assert cell(t4, "ours_speedup", method="FAFO-Stream", task="GSM8K") == pytest.approx(2.0)
    assert cell(t4, "paper_speedup", method="FAFO-Stream", task="GSM8K") == pytest.approx(1.95)
    assert cell(t4, "paper_tau", method="Lookahead", task="MT-Bench") == pytest.approx(2.01)
    assert "temperature" in t4.attrs["caption"]
    assert fp.table2(sampled)["ours_speedup"].isna().all()


def test_aime24_and_multi_if_runs_fill_tables_5_and_6():
    """experiment=fafo_table5 (AIME24) and fafo_table6 (Multi-IF): each task's runs fill its own table
    beside the paper's numbers, paired with that task's vanilla run."""
    r = []
    for task, wall in (("aime24", 6.0), ("multi_if", 8.0)):
        r += rows("vanilla", "full", wall, 1.0, task)
        r += rows("fafo", "quest", wall / 2, 2.1, task, **{"decoder.k": 6, "decoder.n": 40})
        r += rows("lookahead", "full", wall / 4, 1.5, task, **{"decoder.G": 7})
    df = pd.DataFrame(r)
    t5, t6 = fp.table5(df), fp.table6(df)
    assert cell(t5, "ours_speedup", method="FAFO-Quest", task="AIME24") == pytest.approx(2.0)
    assert cell(t5, "paper_speedup", method="FAFO-Quest", task="AIME24") == pytest.approx(1.46)
    assert cell(t6, "ours_speedup", method="Lookahead", task="Multi-IF") == pytest.approx(4.0)
    assert cell(t6, "paper_tau", method="FAFO-Stream", task="Multi-IF") == pytest.approx(2.84)
    assert "AIME24" not in set(t6["task"])
