"""The five papers' claims as data (`analysis/claims_table.py`), each checked on the committed records
per setup (environment + scale): holds, differs, within noise (our 95% intervals overlap), or not
testable here with the reason (`analysis.verdict`). A claim that differs carries the evidence the
records give for why: the KV policy restricted nothing, the answers' length, the model's size, the
cost curve (tau above 1 but each forward dearer than vanilla's), the baseline (eager vs graphed).

A claim names two sets of runs by their record fields (`a`, `b`: decoder, kv, experiment, task,
parameters) and a metric (tau, speedup, acceptance, match, score.<metric>); `kind` says what the
number depends on (tau and quality on the model, speed on the hardware, memory on both)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from analysis.metrics import (
    ENV,
    baseline_of,
    bootstrap_ratio,
    divergences_at_ties,
    paired_speedup,
    temperature,
    with_env,
)
from analysis.report_parts import setups
from analysis.verdict import DIFFERS, HOLDS, NOISE, UNTESTABLE, Measure, at_least, at_most, order

PAPERS = ("FAFO", "TriForce", "SFI", "LongSpec")


@dataclass(frozen=True)
class Claim:
    """One claim of a paper. `compare`: "order" (a above b), "at_least" (a at least `threshold`),
    "at_most" (a at most `threshold`), "parity" (a not below b beyond noise), "none" (not testable
    here: `untestable` says why)."""

    paper: str
    where: str
    statement: str
    kind: str  # tau | quality | speed | memory | exactness
    compare: str
    metric: str = ""
    a: dict = field(default_factory=dict)
    b: dict = field(default_factory=dict)
    threshold: float = math.nan
    untestable: str = ""
    why: tuple[str, ...] = ()  # the explanations a "differs" may carry, in order of preference


# why a speed claim may read otherwise at our scale (`explain`)
SPEED_WHY = ("cost curve", "baseline", "model size")
DEPENDS = {
    "tau": "the model",
    "quality": "the model",
    "exactness": "the numerics",
    "speed": "the hardware",
    "memory": "the model and the hardware",
}


# --- the runs a claim reads -----------------------------------------------------------------------
def _matches(runs: pd.DataFrame, sel: dict) -> pd.DataFrame:
    keep = pd.Series(True, index=runs.index)
    for col, want in sel.items():
        if col not in runs.columns:
            return runs.iloc[0:0]
        vals = want if isinstance(want, (list, tuple)) else [want]
        have = runs[col]
        numeric = pd.to_numeric(have, errors="coerce")
        ok = have.astype(str).isin([str(v) for v in vals])
        ok |= numeric.isin([float(v) for v in vals if isinstance(v, (int, float))])
        keep &= ok
    return runs[keep]


def run_table(samples: pd.DataFrame, scores: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per complete run: its setup's short name, record fields, and each metric with its 95%
    interval over samples (tau, acceptance, match, speedup vs its environment's vanilla run, scores)."""
    if samples.empty:
        return pd.DataFrame()
    ok = samples[samples["error"].isna()] if "error" in samples.columns else samples
    names = {}
    for s in setups(ok):
        names.update(dict.fromkeys(s.samples["run_id"].astype(str).unique(), s.name))
    env = with_env(ok)
    rows = []
    for _, group in env.groupby(ENV, sort=True):
        for run_id, run in group.groupby("run_id"):
            base = baseline_of(group, run)
            first = run.iloc[0]
            row = {
                c: first[c]
                for c in run.columns
                if c
                in (
                    "decoder",
                    "kv",
                    "task",
                    "experiment",
                    "model",
                    "lossless",
                    "dtype",
                    "device_name",
                    "cuda_graphs",
                    "max_new_tokens",
                )
                or c.startswith(("decoder.", "kv.", "task.", "draft."))
            }
            row["run_id"], row["setup"] = str(run_id), names.get(str(run_id), "?")
            row["temperature"] = float(temperature(run).iloc[0])  # 0 = greedy (claims on sampling read it)
            sid = run["sample_id"]
            row["tau"] = run["committed"].sum() / run["forwards"].sum()
            row["tau_lo"], row["tau_hi"] = bootstrap_ratio(run["committed"], run["forwards"], sid)
            if "drafted" in run and run["drafted"].fillna(0).sum() > 0:
                row["acceptance"] = run["accepted"].sum() / run["drafted"].sum()
                row["acceptance_lo"], row["acceptance_hi"] = bootstrap_ratio(
                    run["accepted"], run["drafted"], sid
                )
            audited = run[run["matches_vanilla"].notna()] if "matches_vanilla" in run else run.iloc[0:0]
            row["match_n"], row["match_of"] = int(audited["matches_vanilla"].astype(bool).sum()), len(audited)
            if len(audited):
                row["match"] = row["match_n"] / row["match_of"]
            paired = paired_speedup(run, base) if first["decoder"] != "vanilla" else {}
            row["vanilla_peak_mem"] = float(base["peak_mem_mb"].max()) if base is not None else math.nan
            for key in ("speedup", "speedup_lo", "speedup_hi"):
                row[key] = paired.get(key, math.nan)
            row["tokens_per_turn"] = float(run["new_tokens"].mean())
            row["peak_mem"] = float(run["peak_mem_mb"].max()) if "peak_mem_mb" in run else math.nan
            row["diverged"], row["ties"] = divergences_at_ties(run, str(first.get("dtype")))
            row["restricted"] = (
                float((run["restricted_frac"].astype(float) * run["forwards"]).sum() / run["forwards"].sum())
                if "restricted_frac" in run
                else math.nan
            )
            rows.append(row)
    out = pd.DataFrame(rows)
    if scores is not None and len(scores):
        for (run_id, metric), s in scores.groupby(["run_id", "metric"]):
            ones = pd.Series(1.0, index=s.index)
            lo, hi = bootstrap_ratio(s["value"], ones, s["sample_id"])
            hit = out["run_id"] == str(run_id)
            out.loc[hit, f"score.{metric}"] = float(s["value"].mean())
            out.loc[hit, f"score.{metric}_lo"], out.loc[hit, f"score.{metric}_hi"] = lo, hi
    return out


def _measure(row: pd.Series, metric: str) -> Measure:
    value = row.get(metric, math.nan)
    value = math.nan if value is None or pd.isna(value) else float(value)
    return Measure(value, float(row.get(f"{metric}_lo", math.nan)), float(row.get(f"{metric}_hi", math.nan)))


# --- why a claim differs: the records' evidence ----------------------------------------------------
def explain(reason: str, a: pd.Series, b: pd.Series | None) -> str:
    """One line of evidence for `reason`, from the runs' numbers; "" where the records do not show it."""
    if reason == "policy inactive" and a.get("restricted") == 0:
        return (
            f"policy inactive: {a['kv']} restricted 0% of forwards (the budget keeps the whole short context)"
        )
    if reason == "cost curve" and a.get("speedup", 0) < 1 < a.get("tau", 0):
        dear = a["tau"] / a["speedup"]
        return (
            f"cost curve: tau {a['tau']:.2f} but speedup {a['speedup']:.2f}, so each forward costs "
            f"{dear:.1f}x a vanilla step on this hardware (its block's rows are paid in compute)"
        )
    if reason == "answer length":
        tokens = a["tokens_per_turn"]
        return f"answer length: {tokens:.0f} new tokens per turn (the papers' answers run to hundreds)"
    if reason == "memory floor" and not pd.isna(a.get("vanilla_peak_mem", math.nan)):
        return (
            f"memory floor: peak RSS {a['peak_mem']:.0f} MB against vanilla's {a['vanilla_peak_mem']:.0f} MB "
            "in the same setup: the process, not the streams' buffers of a 135M model, sets the peak"
        )
    if reason == "draft quality" and b is not None and not pd.isna(a.get("acceptance", math.nan)):
        return (
            f"draft quality: {a['decoder']}'s draft has {a['acceptance']:.0%} of its tokens accepted, "
            f"{b['decoder']}'s ({b['kv']} cache over the target itself) {b.get('acceptance', math.nan):.0%}"
        )
    if reason == "model size":
        return f"model size: {a['model']}, not the paper's 4B-30B targets"
    if reason == "baseline" and not bool(a.get("cuda_graphs", True)):
        return "baseline: eager vanilla on a GPU, whose steps cost several times a graphed one's"
    if reason == "restricted" and not pd.isna(a.get("restricted", math.nan)):
        return f"the draft cache saw a {a['restricted']:.0%} restricted share at a 135M-1.5B scale"
    return ""


def _why(claim: Claim, a: pd.Series, b: pd.Series | None) -> str:
    lines = [e for e in (explain(r, a, b) for r in claim.why) if e]
    return lines[0] if lines else "not explained by the records (may be real)"


def same_task(runs: pd.DataFrame, a: pd.Series, b_sel: dict) -> pd.DataFrame:
    """The runs on a's task with a's task parameters (context length, ...), except those side b names:
    a comparison pairs runs of one workload."""
    keep = pd.Series(True, index=runs.index)
    for col in [c for c in runs.columns if c == "task" or c.startswith("task.")]:
        if col not in b_sel:
            keep &= runs[col].map(str) == str(a.get(col))  # map: NaN as "nan", as str(a[col]) says it
    return runs[keep]


# --- a claim's verdict in one setup ----------------------------------------------------------------
WORST = {DIFFERS: 0, NOISE: 1, HOLDS: 2, UNTESTABLE: 3}


def verdict_in(claim: Claim, runs: pd.DataFrame) -> dict | None:
    """The claim's verdict on one setup's runs (None when the setup holds no run of its side a)."""
    a_runs = _matches(runs, claim.a)
    if a_runs.empty:
        return None
    if claim.metric == "match":  # an exact count over every run of side a: no interval
        n, of = int(a_runs["match_n"].sum()), int(a_runs["match_of"].sum())
        if not of:
            return None
        v, margin = at_least(Measure(n / of), claim.threshold)
        margin = f"{n} of {of} outputs identical over {len(a_runs)} runs; {margin}"
        diverged, ties = int(a_runs["diverged"].sum()), int(a_runs["ties"].sum())
        why = ""
        if v == DIFFERS:
            dtypes = ", ".join(sorted({str(d) for d in a_runs.get("dtype", pd.Series(["?"]))}))
            why = (
                f"numerics: {ties} of {diverged} divergences at a near-tie of the two logits in {dtypes} "
                "(a multi-row forward rounds differently from a one-row one; exact in fp32)"
            )
        return {
            "verdict": v,
            "margin": margin,
            "why": why,
            "_n": n,
            "_of": of,
            "_diverged": diverged,
            "_ties": ties,
        }
    found = []
    for _, a in a_runs.iterrows():
        if claim.compare in ("at_least", "at_most"):
            bound = at_least if claim.compare == "at_least" else at_most
            v, margin = bound(_measure(a, claim.metric), claim.threshold)
            found.append((v, margin, a, None))
            continue
        for _, b in _matches(same_task(runs, a, claim.b), claim.b).iterrows():
            if b["run_id"] == a["run_id"]:
                continue
            ma, mb = _measure(a, claim.metric), _measure(b, claim.metric)
            v, margin = order(ma, mb)
            if claim.compare == "parity" and v in (HOLDS, NOISE):
                v = HOLDS
            found.append((v, margin, a, b))
    found = [f for f in found if f[0] != UNTESTABLE]
    if not found:
        return None
    v, margin, a, b = min(found, key=lambda f: WORST[f[0]])
    pairs = len(found)
    note = f" (worst of {pairs} run pairs)" if pairs > 1 and len({f[0] for f in found}) > 1 else ""
    cost = a["tau"] / a["speedup"] if claim.metric == "speedup" and a.get("speedup", 0) > 0 else math.nan
    why = _why(claim, a, b) if v == DIFFERS else ""
    return {"verdict": v, "margin": margin + note, "why": why, "_cost": cost, "_value": a.get(claim.metric)}


def ledger(samples: pd.DataFrame, claims: list[Claim], scores: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every claim's verdict per setup that has runs for it; a claim no setup can test is one row `not
    testable` with its reason."""
    runs = run_table(samples, scores)
    rows = []
    for i, claim in enumerate(claims, 1):
        head = {
            "id": f"{claim.paper[0]}{i}",
            "paper": claim.paper,
            "where": claim.where,
            "claim": claim.statement,
            "kind": claim.kind,
            "depends on": DEPENDS[claim.kind],
        }
        tested = []
        if claim.compare != "none" and len(runs):
            for setup, part in runs.groupby("setup", sort=True):
                got = verdict_in(claim, part)
                if got is not None:
                    tested.append({**head, "setup": f"`{setup}`", **got})
        if not tested:
            reason = claim.untestable or "no run of ours on its side of the comparison"
            tested = [{**head, "setup": "-", "verdict": UNTESTABLE, "margin": "", "why": reason}]
        rows += _model_evidence(tested, runs)
    return pd.DataFrame(rows)


def _model_evidence(tested: list[dict], runs: pd.DataFrame) -> list[dict]:
    """A "model size" explanation is backed by the records when the claim does not differ in a setup
    with another model; say which, or that no other model ran it."""
    models = (
        dict(runs.drop_duplicates("setup")[["setup", "model"]].astype(str).to_numpy()) if len(runs) else {}
    )
    for row in tested:
        if not str(row.get("why", "")).startswith("model size"):
            continue
        mine = models.get(row["setup"].strip("`"), "")
        seen = {
            models.get(r["setup"].strip("`"), ""): r["verdict"]
            for r in tested
            if models.get(r["setup"].strip("`")) != mine
        }
        fine = sorted(f"{m}: {v}" for m, v in seen.items() if v in (HOLDS, NOISE))
        if fine:
            row["why"] += f"; with another model it does not differ ({', '.join(fine)})"
        elif seen:
            row["why"] = (
                f"differs with every model that ran it ({', '.join(sorted([mine, *seen]))}): the records do "
                "not show the model's size as the cause (may be real)"
            )
        else:
            row["why"] += "; no other model ran it, so the records cannot tell size from a real difference"
    return tested
