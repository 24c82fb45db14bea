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
