"""FAFO's paper tables from our runs, with the paper's numbers side by side (the FAFO paper).

Every function takes the per-sample DataFrame of our runs (`analysis.load.load_samples`: one row per
(sample, turn) with at least decoder, kv, task, model, dtype, sample_id, turn, new_tokens, decode_s,
wall_s, forwards, tau, and the parameters as columns `decoder.k`, `decoder.n`, `kv.budget`, ...) and
returns a DataFrame whose `attrs["caption"]` names our model, dtype and hardware next to the paper's
(Llama-2-7b-chat etc., fp16, 1x A100-80GB). The paper's values come from
`results/curated/paper_tables_fafo.csv` (the paper's FAFO numbers; `NA` = a cell
lost in the paper's text extraction).

- `table1`   FAFO-Stream vs FAFO-2forward vs Lookahead (peak memory, speedup, tau), MT-Bench.
- `table2`   speedup and tau per method (FAFO-Stream/Quest/SnapKV/H2O, Lookahead, PLD, TriForce) x
             task (MT-Bench, GSM8K, HumanEval); FAFO-SnapKV's paper numbers are Table 8's.
- `table4`   the same when sampling (temperature > 0): FAFO-Stream, FAFO-Quest, Lookahead. Every other
             table reads greedy runs only (`greedy`), this one sampled runs only.
- `table5`, `table6`  the same three methods on AIME24 and on Multi-IF.
- `table10`  PG-19 by context length (1k-3k): FAFO-Stream, FAFO-Quest, Lookahead, TriForce.
- `table11`  k sweep (guess length), FAFO-Stream, MT-Bench.
- `table12`  n sweep (fumble streams), FAFO-Stream and FAFO-Quest.
- `table13`  Init+Local budget sweep (kv.budget), FAFO-Stream.
- `analysis.fafo_figure1.figure1`  FAFO vs Lookahead against the number of guesses (n resp. G); the
  paper gives a plot only. `analysis.fafo_orderings.orderings` checks the paper's orderings.
Speedup = sum of vanilla (kv=full) wall time / sum of the method's wall time over the same
(sample, turn) pairs in the same environment (`analysis.metrics`: one pairing rule for every table);
tau = committed / forwards. A table is made within one setup (model, dtype, device, threads, ...:
`analysis.metrics.SETUP`), a cell holds one run, and either rule broken is an `AnalysisError`, never
a pooled number. Every cell says how much its KV policy restricted (`kv_activity`: a policy that
restricted nothing is marked inactive). Paper cells from the prose's approximations are marked "~".
`python -m analysis.fafo_paper [--root DIR]` prints every table that has runs, once per setup.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from analysis.fafo_base import (
    PAPER_CONTEXT,
    PAPER_SETTING,
    TASKS,
    _caption,
    _join_paper,
    _num,
    aggregate,
    greedy,
    hold,
    method_of,
    paper_rows,
    render,
)
from analysis.fafo_by_task import table4, table5, table6
from analysis.fafo_figure1 import figure1
from analysis.load import default_root, experiments, from_experiments, load_samples
from analysis.metrics import SETUP, AnalysisError, scale_label, with_env

# re-exported: callers read the scale sentence of a caption, the tables and their helpers from here
__all__ = ["aggregate", "method_of", "render", "scale_label", "table4", "table5", "table6"]


# --- tables ----------------------------------------------------------------------------------------
def table1(samples: pd.DataFrame, task: str = "mtbench", fixed: dict | None = None) -> pd.DataFrame:
    """Table 1: peak memory, speedup and tau of FAFO-Stream, FAFO-2forward and Lookahead."""
    fixed = PAPER_SETTING if fixed is None else fixed
    ours = aggregate(hold(samples[samples["task"] == task], fixed), [])
    paper = paper_rows("Table 1")
    paper["method"] = paper["method"].str.replace(r"\(.*\)", "", regex=True)
    keys = [{"method": m} for m in ["FAFO-Stream", "FAFO-2forward", "Lookahead", "TriForce", "SWIFT"]]
    out = _join_paper(
        ours,
        keys,
        paper,
        {"peak_memory_MB": "peak_mem_mb", "speedup": "speedup", "tau": "tau"},
        {"method": "method"},
    )
    return _caption(out, f"Table 1 ({TASKS.get(task, task)})", samples, "Llama-2-7b-chat", fixed)


def table2(
    samples: pd.DataFrame,
    paper_model: str = "Llama-2-7b-chat",
    tasks: tuple[str, ...] = ("mtbench", "gsm8k", "humaneval"),
    fixed: dict | None = None,
) -> pd.DataFrame:
    """Table 2 (+ Table 8 for FAFO-SnapKV): speedup and tau per method x task."""
    fixed = PAPER_SETTING if fixed is None else fixed
    ours = aggregate(hold(samples[samples["task"].isin(tasks)], fixed), [])
    ours["paper_task"] = ours["task"].map(lambda t: TASKS.get(t, t))
    t2, t8 = paper_rows("Table 2"), paper_rows("Table 8")
    t8["task"] = t8["task"].replace({"HumanEval": "HumanEval-Completion"})
    methods = [
        "FAFO-Stream",
        "FAFO-Quest",
        "FAFO-SnapKV",
        "FAFO-H2O",
        "Lookahead",
        "PLD",
        "TriForce",
        "SWIFT",
    ]
    rows = []
    for method in methods:
        paper = t8 if method == "FAFO-SnapKV" else t2[t2["model"] == paper_model]
        src = "Table 8, Llama-3-8B-Instruct" if method == "FAFO-SnapKV" else f"Table 2, {paper_model}"
        keys = [{"method": method, "task": TASKS.get(t, t)} for t in tasks]
        part = _join_paper(
            ours,
            keys,
            paper,
            {"speedup": "speedup", "tau": "tau"},
            {"method": "method", "task": "paper_task"},
        )
        has_paper = part.filter(regex=r"^paper_(speedup|tau)$").notna().any(axis=1)
        part["paper_source"] = [src if h else "- (no paper cell)" for h in has_paper]
        rows.append(part)
    used = sorted({r for part in rows for r in part.attrs["used"]})
    out = pd.concat(rows, ignore_index=True)
    out = out[
        out.filter(like="ours_").notna().any(axis=1)
        | out.filter(regex=r"^paper_(speedup|tau)$").notna().any(axis=1)
    ].reset_index(drop=True)
    out.attrs["used"] = used
    return _caption(out, "Tables 2 and 8", samples, paper_model, fixed)


def _sweep(
    samples: pd.DataFrame,
    table: str,
    param: str,
    paper_key: str,
    methods: list[str],
    task: str | None,
    fixed: dict,
) -> pd.DataFrame:
    df = samples if task is None else samples[samples["task"] == task]
    df = hold(df, {k: v for k, v in fixed.items() if k != param})
    if param in df.columns:
        df = df.assign(**{param: df[param].map(_num)})
    ours = aggregate(df, [param] if param in df.columns else [])
    paper = paper_rows(table)
    if table == "Table 12":  # approximate prose values fill the cells the extraction lost
        prose = paper_rows("Table 12 (prose)")
        prose["metric"] = prose["metric"].str.replace("_approx", "")
        prose["approx"] = True  # the prose's "~" values: shown, and marked approximate
        paper = pd.concat([paper.dropna(subset=["value"]), prose], ignore_index=True)
    mine = ours.loc[ours["method"].isin(methods), param] if param in ours.columns else pd.Series(dtype=str)
    values = sorted(
        ({v for v in paper[f"s.{paper_key}"].dropna()} | set(mine.dropna())) - {"nan"},
        key=lambda v: float(v),
    )  # a run without the swept parameter (another method) adds no column
    keys = [{"method": m, f"s.{paper_key}": v} for m in methods for v in values]
    out = _join_paper(
        ours, keys, paper, {"speedup": "speedup", "tau": "tau"}, {"method": "method", f"s.{paper_key}": param}
    )
    used = out.attrs["used"]
    out = out.rename(columns={f"s.{paper_key}": param})
    out.attrs["used"] = used
    out.attrs["fixed"] = {k: v for k, v in fixed.items() if k != param}
    return out


def table11(samples: pd.DataFrame, task: str = "mtbench", fixed: dict | None = None) -> pd.DataFrame:
    """Table 11: guess length k sweep, FAFO-Stream."""
    out = _sweep(
        samples,
        "Table 11",
        "decoder.k",
        "k_gram_len",
        ["FAFO-Stream"],
        task,
        PAPER_SETTING if fixed is None else fixed,
    )
    return _caption(
        out, f"Table 11, k sweep ({TASKS.get(task, task)})", samples, "Llama-2-7b-chat", out.attrs["fixed"]
    )


def table12(samples: pd.DataFrame, task: str = "mtbench", fixed: dict | None = None) -> pd.DataFrame:
    """Table 12: number of fumble streams n, FAFO-Stream and FAFO-Quest (paper cells lost in the
    extraction are filled with the prose's approximate values where it gives them)."""
    out = _sweep(
        samples,
        "Table 12",
        "decoder.n",
        "num_guesses",
        ["FAFO-Stream", "FAFO-Quest"],
        task,
        PAPER_SETTING if fixed is None else fixed,
    )
    return _caption(
        out, f"Table 12, n sweep ({TASKS.get(task, task)})", samples, "Llama-2-7b-chat", out.attrs["fixed"]
    )


def table13(samples: pd.DataFrame, task: str | None = "multi_if", fixed: dict | None = None) -> pd.DataFrame:
    """Table 13: StreamingLLM Init+Local budget sweep on Multi-IF, as in the paper. Runs that set the
    budget as a fraction of each context (experiment=fafo_table13_frac, for scale=cpu) are shown under
    the paper budget they stand for: fraction x PAPER_CONTEXT. A setup whose FAFO-Stream runs are all on
    other tasks is refused with that said (their runs are Tables 1, 2 and 10's, not this one's)."""
    samples = greedy(samples)
    stream = samples[samples["decoder"].astype(str).str.startswith("fafo") & (samples["kv"] == "streaming")]
    if task is not None and len(stream) and not (stream["task"] == task).any():
        others = ", ".join(TASKS.get(t, t) for t in sorted(set(stream["task"])))
        raise AnalysisError(
            f"no FAFO-Stream run on {TASKS.get(task, task)} in this setup (its runs are on {others}: "
            "other tables' runs, not a budget sweep on this task)"
        )
    frac = "kv.budget_frac"
    by_frac = frac in samples.columns and samples.loc[samples["decoder"] != "vanilla", frac].notna().any()
    if by_frac:
        equiv = (pd.to_numeric(samples[frac], errors="coerce") * PAPER_CONTEXT).round()
        samples = samples.assign(
            **{"kv.budget": equiv.where(samples[frac].notna(), samples.get("kv.budget"))}
        )
    out = _sweep(
        samples,
        "Table 13",
        "kv.budget",
        "init_plus_local_tokens",
        ["FAFO-Stream"],
        task,
        PAPER_SETTING if fixed is None else fixed,
    )
    note = f"kv.budget = kv.budget_frac x {PAPER_CONTEXT} (a fraction of each context)" if by_frac else ""
    return _caption(
        out,
        f"Table 13, Init+Local budget sweep ({TASKS.get(task, task)})",
        samples,
        "Llama-2-7b-chat",
        out.attrs["fixed"],
        ours=note,
    )


def table10(samples: pd.DataFrame, fixed: dict | None = None) -> pd.DataFrame:
    """Table 10: PG-19 continuation at 1k-3k contexts (`task.context_length`): FAFO-Stream, FAFO-Quest,
    Lookahead and TriForce (TriForce's setting, 256 new tokens in the paper). Ours names the TriForce
    rows' draft model (the offline self-draft is not the paper's JackFram/llama-68m)."""
    fixed = PAPER_SETTING if fixed is None else fixed
    args = ("Table 10", "task.context_length", "context_len")
    ours = _sweep(samples, *args, ["FAFO-Stream", "FAFO-Quest", "Lookahead"], "pg19", fixed)
    # TriForce's own budget and gammas are not FAFO's setting: its rows hold nothing fixed
    tri_rows = _sweep(
        samples[samples["decoder"].isin(["triforce", "vanilla"])], *args, ["TriForce"], "pg19", {}
    )
    out = pd.concat([ours, tri_rows], ignore_index=True)
    out.attrs["fixed"] = ours.attrs["fixed"]
    out.attrs["used"] = sorted({*ours.attrs["used"], *tri_rows.attrs["used"]})
    tri = samples[(samples["decoder"] == "triforce") & (samples["task"] == "pg19")]
    label = "draft.label" if "draft.label" in tri.columns else "draft"
    drafts = sorted({str(v) for v in tri[label].dropna()}) if label in tri.columns else []
    out.attrs["tau_note"] = triforce_full_middle_note(tri)
    return _caption(
        out,
        "Table 10, PG-19 by context length",
        samples,
        "Yarn-Llama-2-7b-128k",
        out.attrs["fixed"],
        ours=f"TriForce rows' draft {'; '.join(drafts)}" if drafts else "",
    )


def triforce_full_middle_note(tri: pd.DataFrame) -> str:
    """Why TriForce's tau is exactly gamma2 + 1 where its retrieval cache keeps every entry: the middle
    level is then the target itself, so every drafted token is accepted (read from the records)."""
    need = {"restricted_frac", "decoder.gamma2", "drafted", "accepted", "committed", "forwards"}
    if tri.empty or not need <= set(tri.columns):
        return ""
    drafted, accepted = int(tri["drafted"].sum()), int(tri["accepted"].sum())
    tau = float(tri["committed"].sum() / tri["forwards"].sum())
    gamma2 = float(tri["decoder.gamma2"].iloc[0])
    if tri["restricted_frac"].fillna(1).max() > 0 or accepted != drafted or tau != gamma2 + 1:
        return ""
    return (
        f"TriForce's tau is exactly gamma2 + 1 = {tau:g}: its retrieval budget keeps every entry of these "
        f"contexts (restricted 0% of forwards), so the middle level is the target itself and accepted "
        f"{accepted} of {drafted} drafted tokens; each verification commits gamma2 + 1 (policy inactive, "
        "not a better draft)."
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=default_root(), help="the folder holding runs/ (default: run.out_dir)")
    ap.add_argument(
        "--figure", default=None, help="PNG for Figure 1 (default <root>/figures/fafo_figure1[-<n>].png)"
    )
    args = ap.parse_args(argv)
    samples = load_samples(args.root)
    if samples.empty:
        sys.exit(f"error: no complete runs under {args.root}/runs")
    samples = from_experiments(samples, experiments("fafo_"))
    setups = list(with_env(samples).groupby(SETUP, sort=True))
    try:
        for i, (setup, part) in enumerate(setups):
            if len(setups) > 1:
                print(f"=== setup {i + 1} of {len(setups)}: {dict(zip(SETUP, setup))}\n")
            for fn in (table1, table2, table4, table5, table6, table10, table11, table12, table13):
                print(render(fn(part)), end="\n\n")
            stem = "fafo_figure1" + (f"-{i + 1}" if len(setups) > 1 else "")
            figure = args.figure or Path(args.root) / "figures" / f"{stem}.png"
            print(render(figure1(part, figure)))
    except AnalysisError as exc:
        sys.exit(f"error: {exc}")


if __name__ == "__main__":
    main()
