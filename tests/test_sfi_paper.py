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
