"""FAFO's orderings (FAFO Tables 2, 11, 12): the paper's claims by tau and by speed, checked on our runs
(`analysis.fafo_paper` makes the tables they read) with each cell's 95% interval over samples: a claim
holds, differs, or is within noise (the intervals overlap), with its margin (`analysis.verdict`)."""

from __future__ import annotations

import pandas as pd

from analysis.fafo_base import _caption
from analysis.fafo_paper import table2, table11, table12
from analysis.verdict import DIFFERS, Measure, order

TAU_WHY = "tau at this scale: 64-token answers of a 135M model, budgets of 10% of short contexts"
SPEED_WHY = (
    "cost curve: a FAFO forward here runs hundreds of rows and on a CPU every row costs compute "
    "(benchmarks.block_cost), so the ordering by tau does not carry over to wall-clock"
)


def measure(row: pd.Series, metric: str) -> Measure:
    """Our value of `metric` in a paper-table row, with its interval."""
    return Measure(
        float(row[f"ours_{metric}"]),
        float(row.get(f"_ours_{metric}_lo", float("nan"))),
        float(row.get(f"_ours_{metric}_hi", float("nan"))),
    )


def _claim(claim: str, paper: str, verdict: tuple[str, str], why: str = "") -> dict:
    return {
        "claim": claim,
        "paper (A vs B)": paper,
        "verdict": verdict[0],
        "ours (A vs B, 95% interval)": verdict[1],
        "why it differs": why if verdict[0] == DIFFERS else "",
    }


def _peak(t: pd.DataFrame, col: str, metric: str) -> pd.Series | None:
    sub = t.dropna(subset=[metric])
    return None if sub.empty else sub.loc[sub[metric].astype(float).idxmax()]


def orderings(samples: pd.DataFrame, fixed: dict | None = None) -> pd.DataFrame:
    """The paper's orderings by tau (hardware-independent) and by speed, checked on our runs: FAFO-Stream
    above Lookahead and FAFO-Stream above FAFO-Quest per task (Table 2), where the k and n sweeps peak
    (Tables 11-12). Each claim's verdict rests on our intervals (`analysis.verdict.order`)."""
    t2 = table2(samples, fixed=fixed)
    rows, used = [], set(t2.attrs["used"])
    for task in sorted(set(t2["task"])):
        cell = t2[t2["task"] == task].set_index("method")
        for a, b in (("FAFO-Stream", "Lookahead"), ("FAFO-Stream", "FAFO-Quest")):
            if a not in cell.index or b not in cell.index:
                continue
            for metric in ("tau", "speedup"):
                pa, pb = cell.loc[a, f"paper_{metric}"], cell.loc[b, f"paper_{metric}"]
                if pd.isna(pa) or pd.isna(pb) or not pa > pb:
                    continue  # the paper claims no ordering here
                ma, mb = measure(cell.loc[a], metric), measure(cell.loc[b], metric)
                if ma.missing or mb.missing:
                    continue  # no run of ours on one side: the claims ledger says so
                verdict = order(ma, mb)
                rows.append(
                    _claim(
                        f"{task}: {a} > {b} by {metric}",
                        f"{pa:.2f} vs {pb:.2f}",
                        verdict,
                        SPEED_WHY if metric == "speedup" else TAU_WHY,
                    )
                )
    for name, fn, col in (("k", table11, "decoder.k"), ("n", table12, "decoder.n")):
        t = fn(samples, fixed=fixed)
        used |= set(t.attrs["used"])
        t = t[t["method"] == "FAFO-Stream"]
        paper_best, ours_best = _peak(t, col, "paper_tau"), _peak(t, col, "ours_tau")
        if paper_best is None or ours_best is None:
            continue
        claim = f"MT-Bench: the {name} sweep's tau peaks at {name}={paper_best[col]}"
        at_paper = t[t[col] == paper_best[col]].dropna(subset=["ours_tau"])
        if len(t.dropna(subset=["ours_tau"])) < 2 or at_paper.empty:
            continue  # a sweep that did not reach the paper's peak says nothing about it
        if ours_best[col] == paper_best[col]:
            others = t.dropna(subset=["ours_tau"])
            others = others[others[col] != paper_best[col]]
            runner_up = others.loc[others["ours_tau"].astype(float).idxmax()]
            verdict = order(measure(at_paper.iloc[0], "tau"), measure(runner_up, "tau"))
            label = f"{name}={paper_best[col]} vs the next best {name}={runner_up[col]}: "
        else:
            verdict = order(measure(at_paper.iloc[0], "tau"), measure(ours_best, "tau"))
            label = f"{name}={paper_best[col]} vs our peak {name}={ours_best[col]}: "
        rows.append(_claim(claim, f"peak at {paper_best[col]}", (verdict[0], label + verdict[1]), TAU_WHY))
    out = pd.DataFrame(rows)
    out.attrs["used"] = sorted(used)
    title = "orderings (the paper's claims, checked on ours)"
    return _caption(out, title, samples, "Llama-2-7b-chat", fixed)
