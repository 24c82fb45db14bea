"""analysis.longspec_paper: tau and speedups (vs vanilla, vs MagicDec) beside LongSpec Table 1."""

from __future__ import annotations

import pandas as pd
import pytest

from analysis import longspec_paper as lp
from analysis.metrics import AnalysisError


def rows(
    run_id: str, decoder: str, kv: str, wall: float, committed: int, forwards: int, **extra
) -> list[dict]:
    return [
        {
            "run_id": run_id,
            "model": "smollm2-135m",
            "dtype": "float32",
            "device_name": "cpu",
            "task": "pg19",
            "decoder": decoder,
            "kv": kv,
            "sample_id": f"s{i}",
            "turn": 0,
            "wall_s": wall,
            "decode_s": wall - 1,
            "new_tokens": committed,
            "drafted": 4 * forwards if decoder != "vanilla" else 0,
            "accepted": committed - forwards,
            "committed": committed,
            "forwards": forwards,
            "matches_vanilla": True,
            "error": None,
            **extra,
        }
        for i in range(2)
    ]


def frame() -> pd.DataFrame:
    return pd.DataFrame(
        rows("v", "vanilla", "full", 6.0, 60, 60)
        + rows("t", "longspec", "full", 3.0, 60, 20, **{"decoder.widths": "[4, 16, 16, 16, 16]"})
        + rows("c", "longspec", "full", 4.0, 60, 30, **{"decoder.widths": "[1, 1, 1, 1]"})
        + rows("m", "selfspec", "streaming", 5.0, 60, 25)
    )


def test_table1_speedups_and_paper_columns():
    t = lp.table1(frame()).set_index("method")
    assert t.loc["LongSpec", "tau"] == pytest.approx(3.0)
    assert t.loc["LongSpec", "speedup"] == pytest.approx(2.0)
    assert t.loc["MagicDec", "speedup"] == pytest.approx(1.2)
    assert t.loc["LongSpec", "vs_magicdec"] == pytest.approx(2.0 / 1.2)
    assert t.loc["LongSpec chain (CPU preset)", "speedup"] == pytest.approx(1.5)
    assert t.loc["LongSpec", "verify_rows"] == pytest.approx(5.0)
    # the paper's mean (min-max) over its 25 Table 1 cells; RepoBench-P's derived speedups included
    assert t.loc["LongSpec", "paper_tau"] == "3.51 (2.76-4.46)"
    assert t.loc["LongSpec", "paper_speedup_vs_FA"] == "2.20 (1.48-3.26)"
    assert t.loc["MagicDec", "paper_speedup_vs_FA"].startswith("1.00 (0.68-1.35)")
    assert t.loc["LongSpec chain (CPU preset)", "paper_tau"] == ""
    assert "smollm2-135m" in t.attrs["caption"] and "Vanilla FA" in t.attrs["caption"]


def test_method_names_say_what_is_not_the_papers():
    def name(widths: str, vocab: object) -> str:
        return lp.method_of(pd.Series({"decoder": "longspec", "kv": "full", "decoder.widths": widths,
                                       "decoder.draft_vocab": vocab}))  # fmt: skip

    assert name("[4, 16, 16, 16, 16]", None) == name("[4, 16, 16, 16, 16]", float("nan")) == "LongSpec"
    assert (
        name("[4, 16, 16, 16, 16]", 8192)
        == "LongSpec tree [4, 16, 16, 16, 16] (CPU preset, draft vocab 8192)"
    )
    assert name("[1, 1, 1, 1]", 8192.0) == "LongSpec chain (CPU preset, draft vocab 8192)"
    assert name("[2, 2, 2, 2]", None) == "LongSpec tree [2, 2, 2, 2] (CPU preset)"
    auto = pd.Series({"decoder": "longspec_auto", "kv": "full", "decoder.widths": "[4, 16, 16, 16, 16]",
                      "decoder.draft_vocab": None, "decoder.block": "auto"})  # fmt: skip
    assert lp.method_of(auto) == "LongSpec tree [4, 16, 16, 16, 16] (CPU preset, block=auto)"
    other = pd.Series({"decoder": "fafo", "kv": "full"})
    assert lp.method_of(other) == "FAFO, fumble rows over the full cache (ours, not in the paper's table)"
    assert lp.method_of(pd.Series({"decoder": "fafo", "kv": "streaming"})) == "fafo kv=streaming"


def test_table1_refuses_two_setups_and_pooled_cells():
    df = frame()
    other = df[df["run_id"] == "t"].assign(run_id="t2", device_name="other-cpu")
    with pytest.raises(AnalysisError, match="setups"):
        lp.table1(pd.concat([df, other]))
    again = df[df["run_id"] == "t"].assign(run_id="t3")
    with pytest.raises(AnalysisError):
        lp.table1(pd.concat([df, again]))


def ablation_frame(*drafts: tuple[str, float, int, str]) -> pd.DataFrame:
    """A vanilla run (6 s, 60 forwards) and a paper-tree LongSpec run per (run id, wall s, forwards,
    checkpoint), every run committing 60 tokens."""
    out = rows("v", "vanilla", "full", 6.0, 60, 60)
    for run_id, wall, forwards, checkpoint in drafts:
        draft = {"decoder.widths": "[4, 16, 16, 16, 16]", "decoder.checkpoint": checkpoint}
        out += rows(run_id, "longspec", "full", wall, 60, forwards, **draft)
    return pd.DataFrame(out)


def test_table2_anchor_offset_ablation():
    df = ablation_frame(("a", 3.0, 20, "auto: x@1"), ("n", 4.0, 24, "y/no-anchor@2"))
    t = lp.table2(df).set_index("draft")
    assert t.loc["LongSpec w/ Anchor-Offset", "tau"] == pytest.approx(3.0)
    assert t.loc["LongSpec w/o Anchor-Offset", "speedup"] == pytest.approx(1.5)
    assert t.loc["LongSpec w/ Anchor-Offset", "paper_tau"] == pytest.approx((3.36 + 3.39) / 2)
    assert t.loc["LongSpec w/o Anchor-Offset", "paper_tau"] == pytest.approx((3.2 + 3.26) / 2)
    assert lp.load_table2(df[df["run_id"] != "n"]).empty  # no ablation run: the report names the command


def test_table2_names_a_draft_that_reads_another_target_layer():
    """A draft folder named `layer<N>` is its own row, labelled ours, with no paper number beside it."""
    df = ablation_frame(("a", 3.0, 20, "x/anchor@1"), ("l", 2.0, 15, "x/layer17@3"))
    t = lp.table2(df).set_index("draft")
    row = t.loc["LongSpec w/ Anchor-Offset, target layer 17 (ours)"]
    assert row["tau"] == pytest.approx(4.0) and pd.isna(row["paper_tau"])
    assert "another target layer" in lp.table2(df).attrs["caption"]
    assert "another target layer" not in lp.table2(df[df["run_id"] != "l"]).attrs["caption"]


def test_table2_takes_its_own_runs_and_vanilla():
    """The shipped draft's Table 1 run is not one of the ablation's pair: Table 2 holds the runs of
    experiment=longspec_table2_cpu, against the vanilla run its own slice recorded, else Table 1's."""

    def run(run_id: str, experiment: str, checkpoint: str, wall: float, forwards: int) -> list[dict]:
        extra = {"decoder.widths": "[4, 16, 16, 16, 16]", "decoder.checkpoint": checkpoint}
        return rows(run_id, "longspec", "full", wall, 60, forwards, experiment=experiment, **extra)

    df = pd.DataFrame(
        rows("v", "vanilla", "full", 6.0, 60, 60, experiment="longspec_table1_cpu")
        + run("s", "longspec_table1_cpu", "auto: s@0", 2.0, 15)
        + run("a", lp.TABLE2, "x/anchor@1", 3.0, 20)
        + run("n", lp.TABLE2, "y/no-anchor@2", 4.0, 24)
    )
    t = lp.load_table2(df).set_index("checkpoint")
    assert sorted(t.index) == ["x/anchor@1", "y/no-anchor@2"]
    assert t.loc["x/anchor@1", "speedup"] == pytest.approx(2.0)

    own = rows("v2", "vanilla", "full", 9.0, 60, 60, experiment=lp.TABLE2)
    t = lp.load_table2(pd.concat([df, pd.DataFrame(own)])).set_index("checkpoint")
    assert t.loc["x/anchor@1", "speedup"] == pytest.approx(3.0)  # its own slice's vanilla, not Table 1's


def tau_frame(per_prompt: dict[str, list[tuple[int, int]]], experiment: str = lp.TAU_PROMPTS) -> pd.DataFrame:
    """One run per key of `experiment`, (committed, forwards) per prompt essays-0, essays-1, ...;
    `longspec` is the paper tree, `longspec_lookup` the paper tree with decoder.lookup=10."""
    out = []
    for key, cells in per_prompt.items():
        decoder, extra = key, {}
        if key.startswith("longspec"):
            decoder = key  # a preset's records name it: longspec_lookup
            extra = {"decoder.widths": "[4, 16, 16, 16, 16]", "decoder.lookup": 10 if "lookup" in key else 0}
        for i, (committed, forwards) in enumerate(cells):
            row = rows(key, decoder, "full", 5.0, committed, forwards, **extra)[0]
            out.append({**row, "sample_id": f"essays-{i}", "experiment": experiment})
    return pd.DataFrame(out)


def test_tau_over_prompts_per_prompt_pooled_and_wins():
    df = tau_frame(
        {
            "vanilla": [(10, 10)] * 11,
            "longspec": [(30, 10)] * 10 + [(40, 40)],
            "lookahead": [(20, 10)] * 10 + [(40, 10)],
            "pld": [(40, 10)] * 11,
            "longspec_lookup": [(45, 10)] * 11,
        }
    )
    t = lp.load_tau_over_prompts(df).set_index("prompt")
    paper, look, both = "LongSpec (paper tree)", "Lookahead", "LongSpec, paper tree + prompt lookup 10 (ours)"
    assert list(t.columns) == [paper, both, look, "prompt lookup"]  # no FAFO run: no column
    assert t.loc["pooled", both] == pytest.approx(4.5) and t.loc["LongSpec higher on", both] == "0/11"
    assert list(t.index[:11]) == [f"essays-{i}" for i in range(11)]  # essays-10 after essays-9
    assert t.loc["essays-10", paper] == pytest.approx(1.0)
    assert t.loc["pooled", paper] == pytest.approx(340 / 140)  # committed / forwards, not a mean of taus
    assert t.loc["median prompt", look] == pytest.approx(2.0)
    assert t.loc["LongSpec higher on", look] == "10/11"
    assert t.loc["LongSpec higher on", "prompt lookup"] == "0/11"
    assert t.loc["LongSpec higher on", paper] == ""
    assert t.loc["matches vanilla", paper] == "True"
    assert "11 prompts" in t.attrs["caption"] and "not a paper's table" in t.attrs["caption"]


def test_tau_over_prompts_tables_are_one_per_prompt_set():
    """The QA and summarisation experiments' runs make their own tables, captioned so; none reads the
    others' runs."""
    pg19 = tau_frame({"longspec": [(30, 10)] * 3, "fafo": [(40, 10)] * 3})
    qa = tau_frame({"longspec": [(20, 10)] * 2, "fafo": [(10, 10)] * 2}, lp.TAU_QA)
    summary = tau_frame({"longspec": [(25, 10)] * 4, "fafo": [(20, 10)] * 4}, lp.TAU_SUMMARY)
    both = pd.concat(
        [pg19, qa.assign(run_id=qa["run_id"] + "-qa"), summary.assign(run_id=summary["run_id"] + "-sum")],
        ignore_index=True,
    )
    on_pg19 = lp.load_tau_over_prompts(both).set_index("prompt")
    on_qa = lp.load_tau_over_prompts(both, lp.TAU_QA).set_index("prompt")
    on_summary = lp.load_tau_over_prompts(both, lp.TAU_SUMMARY).set_index("prompt")
    assert on_pg19.loc["pooled", "FAFO (full cache)"] == pytest.approx(4.0)
    assert on_qa.loc["pooled", "FAFO (full cache)"] == pytest.approx(1.0)
    assert on_qa.loc["LongSpec higher on", "FAFO (full cache)"] == "2/2"
    assert on_summary.loc["pooled", "FAFO (full cache)"] == pytest.approx(2.0)
    assert on_summary.loc["LongSpec higher on", "FAFO (full cache)"] == "4/4"
    assert "QA prompts" in on_qa.attrs["caption"] and "PG-19" in on_pg19.attrs["caption"]
    assert "summarisation prompts" in on_summary.attrs["caption"]
    assert "QA" not in on_pg19.attrs["caption"] and "QA" not in on_summary.attrs["caption"]


def test_tau_over_prompts_refuses_methods_on_other_prompts():
    df = tau_frame({"longspec": [(30, 10)] * 3, "lookahead": [(20, 10)] * 2})
    with pytest.raises(AnalysisError, match="same prompts.*LongSpec \\(paper tree\\) 3, Lookahead 2"):
        lp.tau_over_prompts(df)
    assert lp.load_tau_over_prompts(tau_frame({"lookahead": [(20, 10)]})).empty  # before a LongSpec run


def test_figure3_reads_its_own_runs_at_temperature_1_without_table_1s_paper_columns():
    t1 = frame().assign(experiment="longspec_table1_cpu")
    f3 = pd.DataFrame(
        rows("v3", "vanilla", "full", 6.0, 60, 60)
        + rows("t3", "longspec", "full", 4.0, 60, 30, **{"decoder.widths": "[4, 16, 16, 16, 16]"})
        + rows("m3", "selfspec", "streaming", 3.0, 60, 40)
    ).assign(experiment="longspec_figure3_cpu", sampling='{"temperature": 1.0, "top_p": 1.0, "top_k": 0}')
    t = lp.load_figure3(pd.concat([t1, f3], ignore_index=True)).set_index("method")
    assert sorted(t.index) == ["LongSpec", "MagicDec", "Vanilla"]  # Table 1's runs stay out
    assert t.loc["LongSpec", "speedup"] == pytest.approx(1.5) and t.loc[
        "MagicDec", "speedup"
    ] == pytest.approx(2.0)
    assert t.loc["LongSpec", "tau"] == pytest.approx(2.0)
    assert "paper_tau" not in t.columns and "Figure 3" in t.attrs["title"]
    assert "matches_vanilla" not in t.columns  # sampled runs: no greedy audit
    assert lp.load_figure3(t1).empty
