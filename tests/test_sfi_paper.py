"""analysis.sfi_paper: SFI's Table 4 (quality vs dense and kvpress baselines) on synthetic records."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import sfi_paper as sp
from analysis.metrics import AnalysisError


def rows(run_id: str, decoder: str, kv: str, press: str | None, matches: list[bool]) -> list[dict]:
    return [
        {
            "run_id": run_id,
            "model": "smollm2-135m",
            "dtype": "float32",
            "device_name": "cpu",
            "decoder": decoder,
            "kv": kv,
            "kv.press": press,
            "task": "longbench_ruler_qa",
            "sample_id": f"s{i}",
            "turn": 0,
            "forwards": 10,
            "slow_steps": 3 if decoder == "sfi" else 0,
            "visible_frac": 0.2 if kv != "full" else 1.0,
            "matches_vanilla": m,
            "first_divergence": None if m else 4,
            "error": None,
        }
        for i, m in enumerate(matches)
    ]


def test_table4_scores_and_audit_beside_the_paper():
    samples = pd.DataFrame(
        rows("d", "vanilla", "full", None, [True, True])
        + rows("s", "sfi", "sfi_ctx20", None, [True, False])
        + rows("t", "vanilla", "kvpress", "TOVAPress", [False, False])
    )
    scores = pd.DataFrame(
        [
            {"run_id": r, "sample_id": f"s{i}", "metric": "accuracy", "value": v}
            for r, v in (("d", 1.0), ("s", 0.5), ("t", 0.0))
            for i in range(2)
        ]
    )
    t = sp.table4(samples, scores).set_index("method")
    assert t.loc["SFI", "score.accuracy"] == pytest.approx(0.5) and t.loc["TOVA", "score.accuracy"] == 0.0
    assert t.loc["SFI", "match_dense"] == pytest.approx(0.5) and t.loc["SFI", "slow_share"] == pytest.approx(
        0.3
    )
    assert t.loc["SFI", "paper_lbv2_avg"] > 0 and t.loc["Slow (full KV)", "paper_lbv2_avg"] == pytest.approx(
        34.2
    )
    assert "LongBench-V2" in sp.table4(samples, scores).attrs["caption"]
    with pytest.raises(AnalysisError, match="would pool"):
        sp.table4(
            pd.concat([samples, pd.DataFrame(rows("s2", "sfi", "sfi_ctx20", None, [True, True]))]), scores
        )


def test_figure4_speedup_per_context_pairs_with_that_contexts_dense_run():
    def run(run_id: str, decoder: str, ctx: int, decode_s: float) -> list[dict]:
        out = []
        for r in rows(run_id, decoder, "sfi_ctx20" if decoder == "sfi" else "full", None, [True, True]):
            r.update(
                {
                    "task": "pg19",
                    "task.context_length": ctx,
                    "task_params": f'{{"context_length": {ctx}}}',
                    "new_tokens": 64,
                    "decode_s": decode_s,
                    "wall_s": decode_s + 1.0,
                }
            )
            out.append(r)
        return out

    samples = pd.DataFrame(
        run("d1", "vanilla", 1024, 2.0) + run("s1", "sfi", 1024, 2.5) + run("d7", "vanilla", 7168, 4.0)
        + run("s7", "sfi", 7168, 2.0) + run("s4", "sfi", 4096, 1.0)
    )  # fmt: skip
    t = sp.figure4(samples).set_index("context")
    assert list(t.index) == [1024, 4096, 7168]
    assert t.loc[1024, "decode_speedup"] == pytest.approx(0.8) and t.loc[
        7168, "decode_speedup"
    ] == pytest.approx(2)
    assert t.loc[7168, "dense_tok_s"] == pytest.approx(16.0) and t.loc[7168, "sfi_tok_s"] == pytest.approx(
        32.0
    )
    assert pd.isna(t.loc[4096, "decode_speedup"]) and "no vanilla" in t.loc[4096, "note"]
    assert t.loc[1024, "slow_share"] == pytest.approx(0.3) and t.loc[1024, "visible"] == pytest.approx(0.2)
    assert "128K: 14.36x" in sp.figure4(samples).attrs["caption"]


def test_table6_one_row_per_lambda_clip_beside_the_paper():
    samples = pd.DataFrame(
        [{**r, "kv.lambda_clip": lam} for lam, rid in ((0.02, "a"), (0.4, "b"))
         for r in rows(rid, "sfi", "sfi_ctx20", None, [True, lam < 0.1])]
        + rows("d", "vanilla", "full", None, [True, True])
    )  # fmt: skip
    scores = pd.DataFrame(
        [{"run_id": r, "sample_id": f"s{i}", "metric": "f1", "value": v} for r, v in (("a", 0.4), ("b", 0.2))
         for i in range(2)]
    )  # fmt: skip
    t = sp.table6(samples, scores).set_index("lambda_clip")
    assert list(t.index) == [0.02, 0.4] and t.loc[0.02, "score.f1"] == pytest.approx(0.4)
    assert t.loc[0.02, "match_dense"] == 1.0 and t.loc[0.4, "match_dense"] == 0.5
    assert t.loc[0.02, "paper_lbv1_avg"] == pytest.approx(46.1) and t.loc[0.4, "slow_share"] == pytest.approx(
        0.3
    )
    with pytest.raises(AnalysisError, match="would pool"):
        sp.table6(pd.concat([samples, samples.assign(run_id="c")[samples["run_id"] == "a"]]), scores)


def test_table7_rows_per_alpha_pair_beside_the_paper():
    settings = ((0.35, 0.0, "a"), (0.35, 1.0, "b"))
    samples = pd.DataFrame(
        [{**r, "kv.alpha_cross": ac, "kv.alpha_soft": asoft} for ac, asoft, rid in settings
         for r in rows(rid, "sfi", "sfi_ctx20", None, [True, True])]
    )  # fmt: skip
    scores = pd.DataFrame(columns=["run_id", "sample_id", "metric", "value"])
    t = sp.table7(samples, scores)
    assert list(zip(t["alpha_cross"], t["alpha_soft"])) == [(0.35, 0.0), (0.35, 1.0)]
    assert t["paper_lbv1_avg"].notna().all() and "alpha_cross / alpha_soft" in t.attrs["caption"]


def test_table4_names_a_second_sfi_budget_and_compares_with_dense_and_the_best_press():
    samples = pd.DataFrame(
        rows("d", "vanilla", "full", None, [True, True])
        + rows("s", "sfi", "sfi_ctx20", None, [True, False])
        + rows("k", "sfi", "sfi_keep50", None, [True, True])
        + rows("t", "vanilla", "kvpress", "TOVAPress", [False, False])
        + rows("n", "vanilla", "kvpress", "SnapKVPress", [True, False])
    )
    scores = pd.DataFrame(
        [
            {"run_id": r, "sample_id": f"s{i}", "metric": "f1", "value": v}
            for r, v in (("d", 0.8), ("s", 0.5), ("k", 0.75), ("t", 0.25), ("n", 0.625))
            for i in range(2)
        ]
    )
    t = sp.table4(samples, scores).set_index("method")
    assert t.loc["SFI (kv=sfi_keep50)", "paper_lbv2_avg"] == t.loc["SFI", "paper_lbv2_avg"] > 0
    assert t.loc["SFI", "minus_dense"] == pytest.approx(-0.3)
    assert t.loc["SFI (kv=sfi_keep50)", "minus_best_press"] == pytest.approx(0.125)
    assert t.loc["TOVA", "minus_best_press"] == pytest.approx(-0.375)
    assert str(sp.DENSE_MARGIN) in sp.table4(samples, scores).attrs["caption"]


def test_quality_sfi_against_full_attention_per_task_beside_the_papers_difference():
    long = rows("d", "vanilla", "full", None, [True, True]) + rows(
        "s", "sfi", "sfi_ctx20", None, [True, False]
    )
    gsm = [
        dict(r, task="gsm8k")
        for r in rows("dg", "vanilla", "full", None, [True, True])
        + rows("sg", "sfi", "sfi_ctx20", None, [True, True])
    ]
    other = rows("k", "sfi", "sfi_keep50", None, [True, True])  # not the paper's ~20% preset: left out
    scores = pd.DataFrame(
        [
            {"run_id": r, "sample_id": f"s{i}", "metric": "accuracy", "value": v}
            for r, vals in (
                ("d", (1.0, 0.0)),
                ("s", (0.0, 0.0)),
                ("dg", (1.0, 1.0)),
                ("sg", (1.0, 0.0)),
                ("k", (1, 1)),
            )
            for i, v in enumerate(vals)
        ]
    )
    t = sp.quality(pd.DataFrame(long + gsm + other), scores).set_index(["task", "method"])
    assert len(t) == 4
    assert t.loc[("longbench_ruler_qa", "SFI"), "sfi_minus_full"] == pytest.approx(-0.5)
    assert t.loc[("gsm8k", "SFI"), "ours_score"] == pytest.approx(0.5)
    assert t.loc[("gsm8k", "SFI"), "score_95"] == "[0, 1]"
    assert pd.isna(t.loc[("gsm8k", "Slow (full KV)"), "sfi_minus_full"])
    # Table 3 (LongBench-V2 overall, Qwen3-4B): 34.8 - 34.2; Table 5 (MMLU, Qwen3-4B-Thinking): 63.0 - 63.0
    assert t.loc[("longbench_ruler_qa", "SFI"), "paper_sfi_minus_full"] == pytest.approx(0.6)
    assert t.loc[("gsm8k", "SFI"), "paper_sfi_minus_full"] == pytest.approx(0.0)
    assert t.loc[("gsm8k", "SFI"), "paper_table"] == "Table 5 MMLU"
