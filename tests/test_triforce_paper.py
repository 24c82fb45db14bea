"""analysis.triforce_paper: acceptance per draft-cache policy beside TriForce Table 1."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import triforce_paper as tp
from analysis.metrics import AnalysisError


def rows(run_id: str, kv: str, task: str, drafted: int, accepted: int) -> list[dict]:
    return [
        {
            "run_id": run_id,
            "model": "smollm2-135m",
            "dtype": "float32",
            "device_name": "cpu",
            "decoder": "selfspec",
            "kv": kv,
            "task": task,
            "sample_id": f"s{i}",
            "turn": 0,
            "drafted": drafted,
            "accepted": accepted,
            "committed": accepted + 2,
            "forwards": 2,
            "visible_frac": 0.05,
            "restricted_frac": 1.0,
            "matches_vanilla": True,
            "error": None,
        }
        for i in range(2)
    ]


def test_table1_acceptance_beside_the_paper():
    df = pd.DataFrame(
        rows("a", "streaming", "longbench_ruler_niah", 10, 1)
        + rows("b", "retrieval", "longbench_ruler_niah", 10, 9)
    )
    t = tp.table1(df).set_index("policy")
    assert t.loc["StreamingLLM", "ours_acceptance"] == pytest.approx(0.1)
    assert t.loc["Retrieval", "ours_acceptance"] == pytest.approx(0.9)
    assert t.loc["Retrieval", "paper_acceptance"] == pytest.approx(0.9878)
    assert t.loc["StreamingLLM", "paper_acceptance"] == pytest.approx(0.0519)
    assert "Llama2-7B-128K" in t.attrs["caption"] and "smollm2-135m" in t.attrs["caption"]
    with pytest.raises(AnalysisError, match="would pool"):
        tp.table1(pd.concat([df, pd.DataFrame(rows("c", "streaming", "longbench_ruler_niah", 10, 5))]))


def tri_rows(run_id: str, decoder: str, g1: int, g2: int, wall: float, kv_mb: float) -> list[dict]:
    base = {
        "model": "smollm2-135m",
        "dtype": "float32",
        "device_name": "cpu",
        "task": "pg19",
        "kv": "full" if decoder == "vanilla" else "retrieval",
        "draft": "none" if decoder == "vanilla" else "self_layers",
        "draft.label": "self-draft: first 4 of 30 layers",
        "decoder": decoder,
        "decoder.gamma1": g1,
        "decoder.gamma2": g2,
    }
    return [
        {
            **base,
            "run_id": run_id,
            "sample_id": f"s{i}",
            "turn": 0,
            "wall_s": wall,
            "decode_s": wall - 1,
            "new_tokens": 10,
            "kv_read_mb": kv_mb,
            "drafted": 8,
            "accepted": 6,
            "drafted_l1": 4,
            "accepted_l1": 1,
            "committed": 9,
            "forwards": 3 if decoder != "vanilla" else 9,
            "matches_vanilla": True,
            "error": None,
        }
        for i in range(2)
    ]


def test_table8_speedups_from_the_vanilla_run_of_the_same_environment():
    df = pd.DataFrame(
        tri_rows("v", "vanilla", None, None, 4.0, 100.0)
        + tri_rows("t12", "triforce", 1, 6, 2.0, 25.0)
        + tri_rows("t26", "triforce", 2, 6, 8.0, 50.0)
    )
    t = tp.table8(df).set_index("gamma1")
    assert t.loc[1, "speedup"] == pytest.approx(2.0) and t.loc[2, "speedup"] == pytest.approx(0.5)
    assert t.loc[1, "kv_bound_speedup"] == pytest.approx(4.0) and t.loc[
        2, "kv_bound_speedup"
    ] == pytest.approx(2.0)
    assert t.loc[1, "accept_l1"] == pytest.approx(0.25) and t.loc[1, "accept_l2"] == pytest.approx(0.75)
    assert t.loc[1, "paper_speedup"] == pytest.approx(2.3) and t.loc[2, "paper_speedup"] == pytest.approx(
        2.31
    )
    assert "self-draft" in t.attrs["caption"] and "JackFram/llama-68m" in t.attrs["caption"]
    no_base = tp.table8(df[df["decoder"] == "triforce"])
    assert no_base["speedup"].isna().all() and "no vanilla" in no_base["note"].iloc[0]
    rebuilt = [dict(r, **{"decoder.rebuild_every": 1}) for r in tri_rows("r26", "triforce", 2, 6, 4.0, 50.0)]
    both = tp.table8(pd.concat([df, pd.DataFrame(rebuilt)])).set_index("kv")
    assert both.loc["retrieval rebuilt every 1 verification", "speedup"] == pytest.approx(1.0)
    assert both.loc["retrieval", "gamma1"].tolist() == [1, 2]


def test_figure6_acceptance_by_budget_and_chunk(tmp_path):
    def run(run_id, chunk, frac, acc):
        out = rows(run_id, "retrieval", "pg19", 10, acc)
        for r in out:
            r.update({"kv.chunk": chunk, "kv.budget_frac": frac, "kv_budget": int(frac * 1000)})
        return out

    df = pd.DataFrame(
        run("a", 8, 0.01, 2) + run("b", 8, 0.04, 6) + run("c", 1, 0.04, 3) + run("d", 32, 0.04, 5)
    )
    png = tmp_path / "fig6.png"
    t = tp.figure6(df, png)
    assert len(t) == 4 and png.stat().st_size > 1000
    got = t.set_index(["chunk", "budget_pct"])["acceptance"]
    assert got[(8, 4.0)] == pytest.approx(0.6) and got[(1, 4.0)] == pytest.approx(0.3)


def test_tables_read_the_runs_of_their_experiment():
    df = pd.DataFrame(
        [
            {"decoder": "selfspec", "experiment": "triforce_table1_cpu", "run_id": "a"},
            {"decoder": "selfspec", "experiment": "triforce_figure6a_cpu", "run_id": "b"},
            {"decoder": "vanilla", "experiment": "", "run_id": "v"},
        ]
    )
    assert list(tp.from_experiments(df, ("triforce_table1_cpu",))["run_id"]) == ["a", "v"]
    assert list(tp.from_experiments(df, ("nothing_recorded",))["run_id"]) == []  # no baseline of nothing
    old = df.assign(experiment="")  # records made before runs named their experiment
    assert len(tp.from_experiments(old, ("triforce_table1_cpu",))) == 3


def test_an_experiments_own_vanilla_run_is_its_baseline_on_that_task():
    """Where the experiments started a vanilla run on a task, another experiment's vanilla run on that
    task is not theirs; on a task where they started none, every vanilla run is a candidate; on a task
    they did not run, none is."""
    df = pd.DataFrame(
        [
            {"decoder": "sfi", "experiment": "sfi_t", "task": "qa", "run_id": "m"},
            {"decoder": "sfi", "experiment": "sfi_t", "task": "niah", "run_id": "m2"},
            {"decoder": "vanilla", "experiment": "sfi_t", "task": "qa", "run_id": "own"},
            {"decoder": "vanilla", "experiment": "other", "task": "qa", "run_id": "theirs"},
            {"decoder": "vanilla", "experiment": "other", "task": "niah", "run_id": "only"},
            {"decoder": "vanilla", "experiment": "other", "task": "summary", "run_id": "elsewhere"},
        ]
    )
    assert list(tp.from_experiments(df, ("sfi_t",))["run_id"]) == ["m", "m2", "own", "only"]
    assert list(tp.from_experiments(df, ("other",))["run_id"]) == ["theirs", "only", "elsewhere"]


def test_table1_keeps_a_retrieval_run_with_another_gqa_scoring_apart():
    niah = "longbench_ruler_niah"
    logit = [dict(r, **{"kv.gqa_score": "logit"}) for r in rows("b", "retrieval", niah, 10, 5)]
    prob = [dict(r, **{"kv.gqa_score": "prob"}) for r in rows("p", "retrieval", niah, 10, 8)]
    t = tp.table1(pd.DataFrame(logit + prob)).set_index("kv")
    assert t.loc["retrieval", "ours_acceptance"] == pytest.approx(0.5)
    assert t.loc["retrieval gqa_score=prob", "ours_acceptance"] == pytest.approx(0.8)
    assert set(t["policy"]) == {"Retrieval"} and t["paper_acceptance"].notna().all()


def test_table1_keeps_a_rebuilt_retrieval_run_apart_from_the_papers_build_once():
    niah = "longbench_ruler_niah"
    once = [dict(r, **{"decoder.rebuild_every": 0}) for r in rows("b", "retrieval", niah, 10, 4)]
    every = [dict(r, **{"decoder.rebuild_every": 1}) for r in rows("e", "retrieval", niah, 10, 9)]
    below = [dict(r, **{"decoder.rebuild_below": 0.5}) for r in rows("w", "retrieval", niah, 10, 6)]
    t = tp.table1(pd.DataFrame(once + every + below)).set_index("kv")
    assert t.loc["retrieval", "ours_acceptance"] == pytest.approx(0.4)
    assert t.loc["retrieval rebuilt every 1 verification", "ours_acceptance"] == pytest.approx(0.9)
    assert t.loc["retrieval rebuilt below acceptance 0.5", "ours_acceptance"] == pytest.approx(0.6)


def sampled(rows_: list[dict], temperature: float, kv: str | None = None) -> list[dict]:
    text = f'{{"temperature": {temperature}, "top_p": 1.0, "top_k": 0}}'
    return [dict(r, sampling=text, **({"kv": kv} if kv else {})) for r in rows_]


def test_table2_rows_of_one_temperature_beside_the_papers_at_that_temperature():
    df = pd.DataFrame(
        sampled(tri_rows("v", "vanilla", None, None, 4.0, 100.0), 0.6)
        + sampled(tri_rows("t", "triforce", 2, 6, 2.0, 25.0), 0.6)
        + sampled([dict(r, decoder="selfspec") for r in tri_rows("s", "triforce", 2, 6, 8.0, 50.0)], 0.6)
        + sampled(tri_rows("st", "triforce", 2, 6, 4.0, 25.0), 0.6, kv="streaming")
        + sampled(
            [dict(r, decoder="swift") for r in tri_rows("sw", "triforce", 2, 6, 5.0, 100.0)], 0.6, "full"
        )
    )
    t = tp.table2(df).set_index("method")
    assert list(t.index) == [
        "TriForce",
        "Retrieval w/o Hierarchy",
        "StreamingLLM w/ Hierarchy",
        "Skipping Layers (Draft&Verify; uses 68% of KV)",
    ]
    assert t.loc["TriForce", "ours_speedup"] == pytest.approx(2.0)
    assert t.loc["TriForce", "ours_decode_speedup"] == pytest.approx(3.0)  # (4 - 1) / (2 - 1)
    assert t.loc["Retrieval w/o Hierarchy", "ours_speedup"] == pytest.approx(0.5)
    assert t.loc["TriForce", "ours_acceptance"] == pytest.approx(0.75)
    assert t.loc["TriForce", "temperature"] == pytest.approx(0.6)
    # the paper's numbers at the run's own temperature (0.6), Table 5's row without one
    assert t.loc["TriForce", "paper_acceptance"] == pytest.approx(0.9137)
    assert t.loc["TriForce", "paper_speedup"] == pytest.approx(2.19)
    assert t.loc["StreamingLLM w/ Hierarchy", "paper_speedup"] == pytest.approx(1.9)
    assert t.loc["Skipping Layers (Draft&Verify; uses 68% of KV)", "paper_speedup"] == pytest.approx(1.36)
    at1 = pd.DataFrame(
        sampled(tri_rows("v1", "vanilla", None, None, 4.0, 100.0), 1.0)
        + sampled(tri_rows("t1", "triforce", 2, 6, 2.0, 25.0), 1.0)
    )
    assert tp.table2(at1)["paper_acceptance"].iloc[0] == pytest.approx(0.9004)  # "temperature=1.0"
    with pytest.raises(AnalysisError, match="setups"):  # two temperatures are two setups
        tp.table2(pd.concat([df, at1]))


def test_table7_one_row_per_output_length_against_that_lengths_vanilla_run():
    def at(rows_: list[dict], n: int) -> list[dict]:
        return [dict(r, max_new_tokens=n) for r in rows_]

    df = pd.DataFrame(
        at(tri_rows("v64", "vanilla", None, None, 4.0, 100.0), 64)
        + at(tri_rows("t64", "triforce", 2, 6, 2.0, 25.0), 64)
        + at(tri_rows("v256", "vanilla", None, None, 12.0, 100.0), 256)
        + at(tri_rows("t256", "triforce", 2, 6, 4.0, 25.0), 256)
    )
    t = tp.table7(df).set_index("max_new_tokens")
    assert list(t.index) == [64, 256]
    assert t.loc[64, "ours_speedup"] == pytest.approx(2.0) and t.loc[256, "ours_speedup"] == pytest.approx(
        3.0
    )
    assert pd.isna(t.loc[64, "paper_speedup"]) and t.loc[256, "paper_speedup"] == pytest.approx(2.31)
