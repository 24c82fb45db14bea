"""The claims ledger's parts of the paper report: the summary that opens it (verdicts per paper and the
findings a reader should leave with, computed from the ledger, `analysis.claims`), the ledger itself,
and the verdict line that ends each reproduced table."""

from __future__ import annotations

import re

import pandas as pd

from analysis.claims import PAPERS
from analysis.report_parts import markdown, prose
from analysis.verdict import DIFFERS, HOLDS, NOISE, UNTESTABLE, VERDICTS


def counts(table: pd.DataFrame) -> pd.DataFrame:
    """Per paper: its claims, and its verdicts (one per claim and setup that tests it)."""
    rows = []
    for paper in PAPERS:
        sub = table[table["paper"] == paper]
        rows.append(
            {
                "paper": paper,
                "claims": sub["id"].nunique(),
                **{v: int((sub["verdict"] == v).sum()) for v in VERDICTS},
            }
        )
    total = {
        "paper": "all",
        "claims": table["id"].nunique(),
        **{v: int((table["verdict"] == v).sum()) for v in VERDICTS},
    }
    return pd.DataFrame([*rows, total])


def _setups(rows: pd.DataFrame) -> str:
    return ", ".join(sorted(set(rows["setup"])))


def _count(rows: pd.DataFrame, verdict: str) -> int:
    return int((rows["verdict"] == verdict).sum())


def findings(table: pd.DataFrame) -> list[str]:
    """The five things the ledger says, each computed from its rows."""
    out = []
    exact = table[(table["kind"] == "exactness") & (table["verdict"] != UNTESTABLE)]
    if len(exact):
        low = exact["setup"].str.contains("-bf16", regex=False)  # the setup name's dtype
        fp32, low = exact[~low], exact[low]
        n, of = int(fp32["_n"].sum()), int(fp32["_of"].sum())
        text = (
            f"Exactness holds: {n} of {of} outputs of the lossless decoders (FAFO, TriForce, LongSpec) equal "
            f"vanilla greedy in fp32 over {len(fp32)} setup checks (FAFO's paper: 157 of 160)"
        )
        if len(low):
            diverged, ties = int(low["_diverged"].sum()), int(low["_ties"].sum())
            text += (
                f"; in bf16 {diverged} outputs diverge, {ties} of them at a near-tie of two logits (rounding)"
            )
        out.append(text + ".")
    speed = table[(table["kind"] == "speed") & (table["verdict"] == DIFFERS)]
    curve = speed[speed["why"].str.startswith("cost curve")]
    if len(curve):
        lo, hi = curve["_cost"].min(), curve["_cost"].max()
        out.append(
            f"Speed claims fail on the CPU for one reason: {len(curve)} of {len(speed)} speed verdicts that "
            f"differ are the cost curve. A multi-row forward costs {lo:.1f}-{hi:.1f}x a one-row step there, "
            "so a tau above vanilla's (and above Lookahead's) still loses in wall-clock."
        )
    gpu = table[(table["kind"] == "speed") & table["setup"].str.startswith("`h")]
    if len(gpu):
        each = "; ".join(f"{r['id']} {r['verdict']} ({r['margin']})" for _, r in gpu.iterrows())
        out.append(f"On a GPU ({_setups(gpu)}) the speed verdicts are: {each}.")
    tau = table[(table["kind"] == "tau") & (table["verdict"] != UNTESTABLE)]
    if len(tau):
        out.append(
            f"Most acceptance orderings cannot be told apart here: {_count(tau, NOISE)} of {len(tau)} tau "
            f"and acceptance verdicts are within noise ({_count(tau, HOLDS)} hold, "
            f"{_count(tau, DIFFERS)} differ): "
            "2-16 samples per run give intervals wider than the papers' margins."
        )
    quality = table[(table["kind"] == "quality") & (table["verdict"] == DIFFERS)]
    untestable = table[table["verdict"] == UNTESTABLE]
    if len(quality):
        out.append(
            f"Possibly real: {'; '.join(sorted(set(quality['claim'])))}: differs in {_setups(quality)}, and "
            f"the records do not explain it by scale. {len(untestable)} claims are not testable here (see "
            "the ledger for each reason)."
        )
    return [f"{i}. {text}" for i, text in enumerate(out, 1)]


def summary_section(table: pd.DataFrame) -> list[str]:
    return [
        "## Summary",
        "",
        prose(
            f"{table['id'].nunique()} claims of the five papers (FAFO's two versions as one) checked on "
            "the records, per setup (environment and scale): holds, differs, within noise (our 95% intervals "
            "over samples overlap) or not testable here. A claim is counted once per setup that tests it; "
            "the [Claims ledger](#claims-ledger) gives each verdict with its margin and, where it differs, "
            "why."
        ),
        "",
        markdown(counts(table)),
        "",
        "What to take away:",
        "",
        *findings(table),
        "",
    ]


def ledger_section(table: pd.DataFrame) -> list[str]:
    shown = table.drop(columns=["paper", "depends on"])
    return [
        "## Claims ledger",
        "",
        prose(
            "Each claim (`analysis/claims_table.py`) with its kind (tau and quality depend on the model, "
            "speed on the hardware, memory on both, exactness on the numerics) and its verdict per setup "
            "(`analysis.claims`): the margin is ours (95% interval over samples) against the other side or "
            "the paper's threshold; `why` is the records' evidence where a claim differs (the cost curve: "
            "tau over speedup, each forward's price in vanilla steps; policy inactive; model size against "
            "the other models that ran it; numerics: divergences at near-ties)."
        ),
        "",
        markdown(shown),
        "",
    ]


def _numbers(text: str) -> set[tuple[str, int]]:
    """("Table", 1), ("Table", 2) from "Tables 1-2"; ("Figure", 6) from "Figure 6"."""
    out = set()
    for word, nums in re.findall(r"(Table|Figure)s?\s+([\d ,\-and]+)", text):
        for part in re.split(r",|and", nums):
            bounds = [int(n) for n in re.findall(r"\d+", part)]
            if bounds:
                out |= {(word, n) for n in range(bounds[0], bounds[-1] + 1)}
    return out


ORDERINGS = "Tables 2, 11, 12"  # what the FAFO orderings section reads


def verdict_line(table: pd.DataFrame, paper: str, title: str) -> str:
    """The verdict line ending a reproduced table: its claims' verdicts, counted over setups."""
    wanted = _numbers(ORDERINGS if title == "orderings" else title)
    covers = pd.Series([bool(_numbers(w) & wanted) for w in table["where"]], index=table.index, dtype=bool)
    rows = table[(table["paper"] == paper) & covers]
    if rows.empty or not wanted:
        return "**Verdict**: no claim of the paper rests on this table (ours, or its shape only)."
    parts = []
    for claim_id, claim in rows.groupby("id", sort=False):
        tally = ", ".join(
            f"{v} {int((claim['verdict'] == v).sum())}" for v in VERDICTS if (claim["verdict"] == v).any()
        )
        parts.append(f"{claim_id} {tally}")
    return (
        "**Verdict** (claims in the [ledger](#claims-ledger), counted per setup): " + "; ".join(parts) + "."
    )
