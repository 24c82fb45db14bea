"""Print speedup vs vanilla, tau, exactness, KV-policy activity and scores, one row per run, in 120
columns; save one figure.

Every run is compared only with the vanilla kv=full run of its own environment (analysis.metrics);
a comparison that would pool or pair different environments is refused with one `error:` line.
Runs are shown in blocks of one setup and task (the block header names what sets it apart), each
under a short label naming only what differs between the runs shown; the legend at the end gives the
rest (analysis.display). `exact/tie/div` counts audited turns equal to vanilla, first differing at a
numerical tie, and diverged.

python -m analysis.summary [--root DIR] [--figure PNG]
"""

from __future__ import annotations

import argparse
import math
import sys
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from analysis import cost_model, display  # noqa: E402
from analysis.load import default_root, load_runs, load_table  # noqa: E402
from analysis.metrics import ENV, AnalysisError, summarize  # noqa: E402

# runs alike in these fields are shown as one block, under a header naming them; runs of one block
# that differ in max_new_tokens say so in their labels
BLOCK = [f for f in ENV if f != "max_new_tokens"]


def speedup_figure(table: pd.DataFrame, path: Path) -> Path:
    """Bars of speedup vs vanilla (95% interval), one panel per block of the printed summary in a grid,
    each row of panels as tall as its most bars need; bars carry the short labels of `analysis.display`
    (what differs between the panel's runs), panel titles what sets the panel apart, the legend below
    the rest."""
    lay = display.layout(table, ENV, BLOCK)  # of every row: the labels and legend of the printed summary
    table = table.reset_index(drop=True).assign(label=lay.labels, header=lay.headers)
    table = table.dropna(subset=["speedup"])
    panels = [t for _, t in table.groupby("header", sort=True)]
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    heights = [
        max(2.8, 1.0 + 0.13 * max(len(t) for t in panels[r * cols : (r + 1) * cols])) for r in range(rows)
    ]
    legend = display.legend_lines(lay.legend, width=60 * cols)
    legend_h = 0.2 + 0.105 * len(legend)  # inches: 6-point monospace lines
    fig, axes = plt.subplots(
        rows,
        cols,
        figsize=(4.2 * cols, sum(heights) + legend_h),
        squeeze=False,
        gridspec_kw={"height_ratios": heights},
    )
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    for ax, t in zip(axes.flat, panels):
        t = t.sort_values("speedup")
        y = list(range(len(t)))
        err = [t["speedup"] - t["speedup_lo"], t["speedup_hi"] - t["speedup"]]
        ax.barh(y, t["speedup"], xerr=err, color="tab:blue", alpha=0.8)
        ax.set_yticks(y, [f"{lab} (tau {tau:.2f})" for lab, tau in zip(t["label"], t["tau"])], fontsize=6)
        ax.set_ylim(-0.6, len(t) - 0.4)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xlabel("speedup vs vanilla", fontsize=7)
        ax.set_title(textwrap.fill(t["header"].iloc[0], 48), fontsize=7)
    fig.text(0.01, 0.005, "\n".join(legend), fontsize=6, va="bottom", family="monospace")
    fig.tight_layout(rect=(0, legend_h / (sum(heights) + legend_h), 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def with_predictions(table: pd.DataFrame, root: Path) -> pd.DataFrame:
    """Add the speedups the cost model predicts from each run's blocks (analysis.cost_model): on the
    curve measured in the run's environment (`pred_speedup`, NaN when none is committed) and on the
    H100 roofline (`pred_H100`)."""
    try:
        pred = cost_model.run_predictions(root, cost_model.committed_curves(cost_model.BENCH))
    except (KeyError, ValueError):
        pred = pd.DataFrame()
    if pred.empty or "run_id" not in table.columns:
        return table.assign(pred_speedup=math.nan, pred_H100=math.nan)
    pred = pred.set_index("run_id")[["predicted_here", "roofline_H100-SXM"]]
    pred.columns = ["pred_speedup", "pred_H100"]
    return table.merge(pred, left_on="run_id", right_index=True, how="left")


def with_run_details(table: pd.DataFrame, runs: pd.DataFrame, samples: pd.DataFrame) -> pd.DataFrame:
    """Add what the labels and the printed table need: each run's draft and method parameters (from
    `runs`), its exactness counts, KV restriction and the per-sample counters its records hold."""
    params = ["draft", *(c for c in runs.columns if c.startswith(display.PARAM_PREFIXES))]
    keep = ["run_id", *(c for c in params if c in runs.columns and c not in table.columns)]
    table = table.merge(runs[keep], on="run_id", how="left")
    rows = []
    for run_id, run in samples[samples["error"].isna()].groupby("run_id"):
        exact, tie, diverged = display.exactness(run, str(run["dtype"].iloc[0]))
        rows.append(
            {
                "run_id": run_id,
                "exact": exact,
                "within_tie": tie,
                "diverged": diverged,
                "kv_restricted": display.restricted_text(run),
                **display.counters(run),
            }
        )
    return table.merge(pd.DataFrame(rows), on="run_id", how="left") if rows else table


def cells(row: pd.Series, counters: list[str], scores: list[str]) -> dict[str, str]:
    """The printed columns of one run, as text (`-` where a value is missing)."""
    num = display.num

    def count(column: str) -> int:
        return int(row[column]) if pd.notna(row.get(column)) else 0

    kv = row.get("kv_restricted")
    return {
        "method": row["label"],
        "turns": str(int(row["turns"])),
        "tau": num(row["tau"]),
        "tok/s": num(row["tok_s"]),
        "speedup (95% CI)": display.interval(row["speedup"], row["speedup_lo"], row["speedup_hi"]),
        "decode x": num(row["decode_speedup"]),
        display.EXACT_HEADER: display.exactness_text(
            (count("exact"), count("within_tie"), count("diverged"))
        ),
        "kv restricted": kv if isinstance(kv, str) else "?",
        **display.counter_cells({c: row.get(c) for c in counters}, counters),
        "in fwd": num(row.get("forward_share"), "{:.0%}"),
        "pred x": num(row.get("pred_speedup")),
        "pred H100": num(row.get("pred_H100")),
        "peak MB": num(row.get("peak_mem_mb"), "{:.0f}"),
        "kv MB/tok": num(row.get("kv_mb_per_token"), "{:.3g}"),
        "kv-bound x": num(row.get("kv_bound_speedup")),
        **{c.removeprefix("score."): num(row[c], "{:.3f}") for c in scores},
    }


def report_lines(table: pd.DataFrame) -> list[str]:
    """The summary as lines of at most `display.WIDTH` columns: a block per environment (its header
    names what sets it apart), a row per run, notes under each block, the legend at the end."""
    lay = display.layout(table, ENV, BLOCK)
    table = table.reset_index(drop=True).assign(label=lay.labels, header=lay.headers)
    counters = [c for c, _, _ in display.COUNTERS if c in table.columns]
    scores = [c for c in table.columns if c.startswith("score.")]
    text = pd.DataFrame([cells(r, counters, scores) for _, r in table.iterrows()], index=table.index)
    order = sorted(
        table.index,
        key=lambda i: (
            table.at[i, "header"],
            table.at[i, "decoder"] != "vanilla",
            display.natural_key(table.at[i, "label"]),
        ),
    )
    lines: list[str] = []
    for header, idx in table.loc[order].groupby("header", sort=False).groups.items():
        if header:
            lines += ["", *display.wrap(f"== {header}")]
        block = text.loc[idx]  # without the columns no run of the block has
        lines += display.render(block[[c for c in block.columns if c == "method" or (block[c] != "-").any()]])
        lines += note_lines(table.loc[idx])
    return [*lines, "", *display.legend_lines(lay.legend)]


def note_lines(block: pd.DataFrame) -> list[str]:
    """A block's notes (e.g. why a speedup is missing), each once, naming its runs unless all."""
    if "note" not in block.columns:
        return []
    out = []
    for note, rows in block[block["note"].fillna("") != ""].groupby("note", sort=False):
        who = "" if len(rows) == len(block) else f" ({', '.join(rows['label'])})"
        out += display.wrap(f"note{who}: {note}")
    return out


def figure_path(value: str | None, root: str) -> Path:
    """`--figure` checked before anything is read or written: a file name with an image suffix that
    matplotlib writes (a folder, or `.txt`, is one `error:` line; matplotlib would write `<folder>.png`
    beside a folder, and fail with a traceback on `.txt`)."""
    if value is None:
        return Path(root) / "figures" / "summary.png"
    path = Path(value)
    if path.is_dir() or value.endswith(("/", "\\")):
        sys.exit(f"error: --figure {value} is a folder: give a file, e.g. {path / 'summary.png'}")
    formats = plt.figure().canvas.get_supported_filetypes()
    plt.close("all")
    suffix = path.suffix.lower().lstrip(".")
    if suffix not in formats:
        what = f".{suffix} is not" if suffix else "a name without a suffix is not"
        sys.exit(f"error: --figure {value}: {what} an image format; use .png, .pdf or .svg")
    return path


def main(argv: list[str] | None = None) -> pd.DataFrame:
    root_default = default_root()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--root",
        default=root_default,
        help=f"the folder holding runs/<run_id>/ (default: the config's run.out_dir, {root_default!r})",
    )
    ap.add_argument("--figure", default=None, help="PNG path (default <root>/figures/summary.png)")
    args = ap.parse_args(argv)
    figure = figure_path(args.figure, args.root)
    runs = load_runs(args.root)
    if runs.empty:
        sys.exit(f"error: no complete runs under {args.root}/runs; run `python run.py` first")
    samples = load_table(args.root, "samples", runs)
    try:
        table = summarize(samples, load_table(args.root, "scores", runs))
    except AnalysisError as exc:
        sys.exit(f"error: {exc}")
    table = with_run_details(with_predictions(table, Path(args.root)), runs, samples)
    table["label"] = display.layout(table, ENV, BLOCK).labels
    print("\n".join(report_lines(table)))
    if table["speedup"].notna().any():
        try:
            print(f"figure: {speedup_figure(table, figure)}")
        except OSError as exc:  # a read-only folder, a file where a folder should be
            sys.exit(f"error: cannot write the figure {figure} ({exc.strerror or exc})")
    return table


if __name__ == "__main__":
    main()
