"""LongSpec's Table 1 from our runs, with the paper's numbers side by side (the LongSpec paper).

`table1`: per method (vanilla, LongSpec with the paper's tree, the small tree and the chain (CPU
presets), MagicDec = decoder=selfspec kv=streaming, and, ours, Lookahead, FAFO and prompt lookup on the
same samples): tau, wall-clock speedup vs the vanilla run of the same environment (paired per sample),
speedup vs MagicDec (the ratio of the two paired speedups), rows per verifying forward (root + drafted
tokens), whether every output equals vanilla's, and the paper's tau and speedup vs Vanilla FA for the
same method as the mean and range over its 25 Table 1 cells (5 targets x 5 LongBench tasks;
RepoBench-P's speedups are the derived ones). `table2`: the Anchor-Offset ablation, two
drafts trained on the same data and schedule, one with plain position ids. `tau_over_prompts` (ours):
the paper tree's tau per prompt against Lookahead's, FAFO's, prompt lookup's and our LongSpec variants',
on long outputs (PG-19 continuation) and on long-context QA.
Tables are made within one setup, one run per cell.

python -m analysis.longspec_paper [--root DIR]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pandas as pd

from analysis.fafo_base import one_setup, render
from analysis.load import default_root, from_experiments, load_samples
from analysis.metrics import (
    ENV,
    AnalysisError,
    baseline_of,
    check_one_run,
    paired_speedup,
    set_caption,
    with_env,
)

PAPER_CSV = Path(__file__).resolve().parents[1] / "results" / "curated" / "paper_tables_longspec.csv"
EXPERIMENTS = ("longspec_table1_cpu", "longspec_table1_magicdec_cpu", "longspec_table1_draftless_cpu")
# the draftless decoders run beside LongSpec on its Table 1 samples (not in the paper's table)
DRAFTLESS = {"lookahead": "Lookahead (ours, not in the paper's table)",
             "fafo": "FAFO, fumble rows over the full cache (ours, not in the paper's table)",
             "pld": "prompt lookup (ours, not in the paper's table)"}  # fmt: skip
TABLE2 = "longspec_table2_cpu"
FIGURE3 = "longspec_figure3_cpu"
TAU_PROMPTS = "longspec_tau_prompts_cpu"
TAU_QA = "longspec_tau_qa_cpu"
TAU_SUMMARY = "longspec_tau_summary_cpu"
# what the prompts of each tau-over-prompts experiment are, for its caption
TAU_PROMPT_SETS = {
    TAU_PROMPTS: "PG-19 stand-in windows (Paul Graham essays held out from the draft's training text)",
    TAU_QA: "RULER-style QA prompts over HotpotQA, 32 new tokens (questions of rows left out of the draft's "
    "training text; their distractor paragraphs may come from any row)",
    TAU_SUMMARY: "summarisation prompts over whole essays held out from the draft's training text "
    "(LongBench's summarisation prompt, an offline stand-in, not LongBench), 256 new tokens",
}
PAPER_WIDTHS = "[4, 16, 16, 16, 16]"
# the tau-over-prompts table's short column names of the draftless decoders
TAU_DRAFTLESS = {"lookahead": "Lookahead", "fafo": "FAFO (full cache)", "pld": "prompt lookup"}
PAPER_TREE = "LongSpec (paper tree)"


def is_longspec(frame: pd.DataFrame) -> pd.Series:
    """Per row: a run of decoder=longspec or one of its presets (longspec_small, longspec_lookup, ...)."""
    return frame.get("decoder", pd.Series("", index=frame.index)).astype(str).str.startswith("longspec")


def method_of(row: pd.Series) -> str:
    decoder = str(row["decoder"])
    if decoder == "selfspec" and str(row["kv"]).startswith("streaming"):
        return "MagicDec"
    if decoder == "vanilla":
        return "Vanilla"
    if decoder.startswith("longspec"):  # longspec and its presets longspec_small / longspec_chain
        widths = str(row.get("decoder.widths", ""))
        vocab = row.get("decoder.draft_vocab")
        restricted = vocab is not None and str(vocab) not in ("", "nan", "None", "null")
        auto = str(row.get("decoder.block", "")) == "auto"  # blocks sized by cost: ours
        lookup = _lookup_tokens(row.get("decoder.lookup"))  # prompt lookup in the tree: ours
        if widths == PAPER_WIDTHS and not restricted and not auto:
            return f"LongSpec, paper tree + prompt lookup {lookup} (ours)" if lookup else "LongSpec"
        shape = "chain" if widths == "[1, 1, 1, 1]" else f"tree {widths}"
        extras = "".join(
            [
                f", draft vocab {int(float(vocab))}" if restricted else "",
                ", block=auto" if auto else "",
                f", lookup {lookup}" if lookup else "",
            ]
        )
        return f"LongSpec {shape} (CPU preset{extras})"
    if decoder in DRAFTLESS and str(row["kv"]) == "full":
        return DRAFTLESS[decoder]
    return f"{decoder} kv={row['kv']}"


def _lookup_tokens(value: object) -> int:
    """decoder.lookup of a record (absent or NaN in runs made before it existed: 0)."""
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return 0
    return int(number) if number == number else 0


PAPER_METHOD = {"Vanilla": "Vanilla FA", "LongSpec": "LongSpec", "MagicDec": "MagicDec"}


def paper_summary(paper_csv: Path | str = PAPER_CSV) -> dict[tuple[str, str], tuple[float, float, float]]:
    """(paper method, metric) -> (mean, min, max) over the Table 1 cells; metric tau or speedup."""
    paper = pd.read_csv(paper_csv)
    paper = paper[paper["table"] == "Table 1"]
    paper = paper.assign(metric=paper["metric"].replace({"speedup_derived": "speedup"}))
    out = {}
    for (method, metric), cells in paper.groupby(["method", "metric"]):
        if metric in ("tau", "speedup"):
            out[(method, metric)] = (cells["value"].mean(), cells["value"].min(), cells["value"].max())
    return out


def _cell(summary: dict, method: str, metric: str) -> str:
    got = summary.get((PAPER_METHOD.get(method, ""), metric))
    return "" if got is None else f"{got[0]:.2f} ({got[1]:.2f}-{got[2]:.2f})"


def _drafts(df: pd.DataFrame) -> str:
    """The LongSpec runs' draft labels (checkpoint@weights digest)."""
    col = "decoder.draft" if "decoder.draft" in df.columns else "decoder.checkpoint"
    if col not in df.columns:
        return "?"
    labels = df.loc[is_longspec(df), col].dropna().astype(str)
    return ", ".join(sorted(set(labels))) or "?"


def table1(samples: pd.DataFrame, paper_csv: Path | str = PAPER_CSV, figure3: bool = False) -> pd.DataFrame:
    """Table 1's rows per environment; `figure3`: the runs sample at temperature 1 (the paper's Figure 3
    is a plot without numbers, so no paper column, and Table 1's greedy numbers are not shown beside)."""
    ok = samples[samples["error"].isna()] if "error" in samples.columns else samples
    df = one_setup(ok)
    df = df.assign(method=[method_of(r) for _, r in df.iterrows()])
    summary = paper_summary(paper_csv)
    rows = []
    for _, group in df.groupby(ENV, sort=True):
        base = baseline_of(group)
        speed: dict[str, float] = {}
        for method, run in group.groupby("method", sort=False):
            check_one_run(run, f"{method} on {run['task'].iloc[0]}")
            speed[method] = float(paired_speedup(run, base)["speedup"])
        for method, run in group.groupby("method", sort=False):
            magic = speed.get("MagicDec", float("nan"))
            first = run.iloc[0]
            rows.append(
                {
                    "task": first["task"],
                    "context": int(first.get("task.context_length", 0) or 0),
                    "method": method,
                    "tau": float(run["committed"].sum() / run["forwards"].sum()),
                    "verify_rows": 1 + float(run["drafted"].sum() / run["forwards"].sum()),
                    "speedup": speed[method],
                    "vs_magicdec": speed[method] / magic if magic == magic else float("nan"),
                    # sampled runs have no greedy audit to report (Figure 3: T 1)
                    **(
                        {}
                        if figure3
                        else {"matches_vanilla": bool(run["matches_vanilla"].fillna(True).all())}
                    ),
                    **(
                        {}
                        if figure3
                        else {
                            "paper_tau": _cell(summary, method, "tau"),
                            "paper_speedup_vs_FA": _cell(summary, method, "speedup"),
                        }
                    ),
                }
            )
    if figure3:
        return set_caption(
            pd.DataFrame(rows),
            df,
            "LongSpec Figure 3 (tau and speedup at temperature 1)",
            ours=f"draft {_drafts(df)}",
            paper="speedups at T=1 of 7B-13B targets on LongBench, A100 (a plot; no numbers to set beside)",
            notes="Speculative sampling over LongSpec's tree and MagicDec's chain; speedup vs the vanilla "
            "run at the same temperature.",
            threads=True,
        )
    return set_caption(
        pd.DataFrame(rows),
        df,
        "LongSpec Table 1 (tau, speedup vs vanilla and vs MagicDec)",
        ours=f"draft {_drafts(df)}",
        paper="mean (min-max) over 5 targets (Vicuna-7B/13B, LongChat-7B/13B, Llama-3-8B-262k) x 5 LongBench "
        "tasks, A100, fp16, speedup vs Vanilla FA",
        notes="Ours on the PG-19 stand-in: Paul Graham essays held out from the draft's training text.",
        threads=True,
    )


def ablation_variant(checkpoint: str) -> str:
    """The ablation row a draft belongs to, read off its folder's name: `no-anchor` was trained with plain
    position ids; `layer<N>` reads target layer N instead of the last (ours, not in the paper's table)."""
    name = str(checkpoint)
    variant = "LongSpec w/o Anchor-Offset" if "no-anchor" in name else "LongSpec w/ Anchor-Offset"
    layer = re.search(r"layer(\d+)", name)
    return f"{variant}, target layer {layer.group(1)} (ours)" if layer else variant


def table2(samples: pd.DataFrame, paper_csv: Path | str = PAPER_CSV) -> pd.DataFrame:
    """The Anchor-Offset ablation: decoder=longspec runs by draft (a checkpoint whose path says
    `no-anchor` was trained with plain position ids), tau and speedup vs the vanilla run of the same
    environment, beside the paper's tau (mean over its two tasks)."""
    ok = samples[samples["error"].isna()] if "error" in samples.columns else samples
    df = one_setup(ok[ok["decoder"].isin(["longspec", "vanilla"])])
    paper = pd.read_csv(paper_csv)
    paper = paper[(paper["table"] == "Table 2") & (paper["metric"] == "tau")]
    rows = []
    for _, group in df.groupby(ENV, sort=True):
        base = baseline_of(group)
        runs = group[group["decoder"] == "longspec"]
        for (checkpoint, widths), run in runs.groupby(["decoder.checkpoint", "decoder.widths"], sort=True):
            variant = ablation_variant(checkpoint)
            check_one_run(run, f"{variant} ({checkpoint})")
            p = paper[paper["method"] == variant]["value"]
            rows.append(
                {
                    "task": run["task"].iloc[0],
                    "draft": variant,
                    "checkpoint": checkpoint,
                    "widths": widths,
                    "tau": float(run["committed"].sum() / run["forwards"].sum()),
                    "speedup": float(paired_speedup(run, base)["speedup"]),
                    "matches_vanilla": bool(run["matches_vanilla"].fillna(True).all()),
                    "paper_tau": float(p.mean()) if len(p) else float("nan"),
                }
            )
    layer_rows = any("target layer" in row["draft"] for row in rows)
    layer = ", one (ours, not the paper's ablation) reading another target layer's K/V than the last"
    return set_caption(
        pd.DataFrame(rows),
        df,
        "LongSpec Table 2 (Anchor-Offset ablation)",
        ours=f"{len(rows)} drafts{layer if layer_rows else ''}",
        paper="LLaMA-3.1-8B, Multi-News and RepoBench-P (mean of the two)",
        notes="The drafts are trained by training.longspec on the same data and schedule (~1M tokens: the "
        "first of the runs behind the shipped draft), one with plain position ids; 4096-token PG-19 "
        "stand-in prompts.",
    )


def tau_over_prompts(samples: pd.DataFrame, prompt_set: str = TAU_PROMPT_SETS[TAU_PROMPTS]) -> pd.DataFrame:
    """Tau per prompt of LongSpec's paper tree, of any other LongSpec variant run (by its Table 1 name)
    and of each draftless decoder on the same prompts (one run each, one setup), then their pooled tau
    (committed / forwards over every prompt), the median prompt's, the prompts on which the paper
    tree's tau is the higher, and whether every output equals vanilla's (`prompt_set`: what the prompts
    are, for the caption). Refuses runs that did not all finish the same prompts."""
    ok = samples[samples["error"].isna()] if "error" in samples.columns else samples
    ok = ok[(ok["decoder"].isin(TAU_DRAFTLESS) | is_longspec(ok)) & (ok["kv"] == "full")]
    df = one_setup(ok)
    df = df.assign(column=[_tau_column(r) for _, r in df.iterrows()])
    tau: dict[str, pd.Series] = {}
    pooled, matches = {}, {}
    for label, run in df.groupby("column", sort=False):
        check_one_run(run, str(label))
        by_prompt = run.groupby("sample_id")[["committed", "forwards"]].sum()
        tau[label] = by_prompt["committed"] / by_prompt["forwards"]
        pooled[label] = float(run["committed"].sum() / run["forwards"].sum())
        matches[label] = str(bool(run["matches_vanilla"].fillna(True).all()))
    prompts = {label: set(series.index) for label, series in tau.items()}
    if len({frozenset(p) for p in prompts.values()}) > 1:
        counts = ", ".join(f"{label} {len(p)}" for label, p in prompts.items())
        raise AnalysisError(f"tau over prompts needs every method on the same prompts (finished: {counts})")
    drafted = sorted(c for c in tau if c.startswith("LongSpec") and c != PAPER_TREE)
    labels = [c for c in (PAPER_TREE, *drafted, *TAU_DRAFTLESS.values()) if c in tau]
    wide = pd.DataFrame(tau)[labels].sort_index(key=lambda ids: ids.map(_prompt_order))
    above = {
        c: f"{int((wide[PAPER_TREE] > wide[c]).sum())}/{len(wide)}"
        if PAPER_TREE in wide and c != PAPER_TREE
        else ""
        for c in labels
    }
    out = pd.concat(
        [
            wide.astype(object),
            pd.DataFrame(
                [pooled, wide.median().to_dict(), above, matches],
                index=["pooled", "median prompt", "LongSpec higher on", "matches vanilla"],
            )[labels],
        ]
    )
    out = out.rename_axis("prompt").reset_index()
    return set_caption(
        out,
        df,
        f"Tau (tokens committed per target forward) over {len(wide)} prompts (ours, not a paper's table)",
        ours=f"draft {_drafts(df)}, kv=full",
        notes=f"Prompts: {prompt_set}. LongSpec's paper tree {PAPER_WIDTHS} against the draftless decoders "
        "(and variants of ours, named so) on the same prompts. Pooled = committed / forwards over every "
        "prompt, as in Table 1.",
        threads=True,
    )


def _tau_column(row: pd.Series) -> str:
    """A run's column in the tau-over-prompts table: the paper tree, another LongSpec variant by its
    Table 1 name, or a draftless decoder's short name."""
    decoder = str(row["decoder"])
    if decoder in TAU_DRAFTLESS:
        return TAU_DRAFTLESS[decoder]
    method = method_of(row)
    return PAPER_TREE if method == "LongSpec" else method


def _prompt_order(sample_id: str) -> tuple[str, int]:
    """essays-10 after essays-9: a sample id's text, then its trailing number."""
    head, _, number = str(sample_id).rpartition("-")
    return (head, int(number)) if number.isdigit() else (str(sample_id), -1)


def load_tau_over_prompts(samples: pd.DataFrame, experiment: str = TAU_PROMPTS) -> pd.DataFrame:
    """The tau-over-prompts table over the runs of `experiment` (one of `TAU_PROMPT_SETS`); empty before
    they exist."""
    runs = from_experiments(samples, (experiment,))
    return tau_over_prompts(runs, TAU_PROMPT_SETS[experiment]) if is_longspec(runs).any() else pd.DataFrame()


def paired_with_baselines(runs: pd.DataFrame) -> pd.DataFrame:
    """The method runs plus only those vanilla runs that share an environment with one of them (the
    experiments' own baselines, not every vanilla run in the records)."""
    if runs.empty:
        return runs
    df = with_env(runs)
    key = df[ENV].astype(str).agg("|".join, axis=1)
    methods = df["decoder"] != "vanilla"
    return runs[(methods | key.isin(set(key[methods]))).to_numpy()]


def load_table2(samples: pd.DataFrame) -> pd.DataFrame:
    """Table 2 over the runs of its experiment and their vanilla baseline: the one its own slice recorded
    (so the table's runs share one code version), else Table 1's."""
    runs = from_experiments(samples, (*EXPERIMENTS, TABLE2))
    if "experiment" in runs.columns:
        own = runs["experiment"] == TABLE2
        vanilla = runs["decoder"] == "vanilla"
        runs = runs[own | (vanilla & ~(own & vanilla).any())]
    runs = paired_with_baselines(runs)
    has_ablation = runs.get("decoder.checkpoint", pd.Series(dtype=str)).astype(str).str.contains("no-anchor")
    return table2(runs) if has_ablation.any() else pd.DataFrame()


def load_table1(samples: pd.DataFrame) -> pd.DataFrame:
    """Table 1 over the runs of its experiments (and the vanilla baselines); empty before a LongSpec run."""
    runs = paired_with_baselines(from_experiments(samples, EXPERIMENTS))
    return table1(runs) if is_longspec(runs).any() else pd.DataFrame()


def load_figure3(samples: pd.DataFrame) -> pd.DataFrame:
    """Figure 3 (temperature 1) over the runs of experiment=longspec_figure3_cpu and its own vanilla runs."""
    runs = paired_with_baselines(from_experiments(samples, (FIGURE3,)))
    return table1(runs, figure3=True) if is_longspec(runs).any() else pd.DataFrame()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default=default_root(), help="the folder holding runs/ (default: run.out_dir)")
    args = ap.parse_args(argv)
    samples = load_samples(args.root)
    if samples.empty:
        sys.exit(f"error: no complete runs under {args.root}/runs")
    try:
        table = load_table1(samples)
    except AnalysisError as exc:
        sys.exit(f"error: {exc}")
    if table.empty:
        sys.exit("error: no LongSpec Table 1 runs (python run.py -m experiment=longspec_table1_cpu)")
    print(render(table))
    try:
        over_prompts = [load_tau_over_prompts(samples, experiment) for experiment in TAU_PROMPT_SETS]
    except AnalysisError as exc:
        sys.exit(f"error: {exc}")
    for table in over_prompts:
        if not table.empty:
            print("\n" + render(table))


if __name__ == "__main__":
    main()
