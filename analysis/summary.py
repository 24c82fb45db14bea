"""Print speedup vs vanilla, tau and scores per model x task x decoder x kv; save one figure.

python -m analysis.summary [--root results] [--figure results/figures/summary.png]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.load import load_runs, load_table  # noqa: E402
from analysis.metrics import summarize  # noqa: E402


def speedup_figure(table: pd.DataFrame, path: Path) -> Path:
    """Bars of speedup vs vanilla (95% bootstrap interval) per method, one panel per task."""
    tasks = sorted(table["task"].unique())
    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 4), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        t = table[table["task"] == task].sort_values("speedup")
        y = range(len(t))
        err = [t["speedup"] - t["speedup_lo"], t["speedup_hi"] - t["speedup"]]
        ax.barh(list(y), t["speedup"], xerr=err, color="tab:blue", alpha=0.8)
        ax.set_yticks(list(y), [f"{m}  (tau {tau:.2f})" for m, tau in zip(t["method"], t["tau"])], fontsize=7)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xlabel("speedup vs vanilla (ratio of total wall time)")
        ax.set_title(
            f"{task} - {t['model'].iloc[0]} {t['dtype'].iloc[0]}\n{t['device_name'].iloc[0]}", fontsize=8
        )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="results")
    ap.add_argument("--figure", default=None, help="PNG path (default <root>/figures/summary.png)")
    args = ap.parse_args(argv)
    runs = load_runs(args.root)
    if runs.empty:
        raise SystemExit(f"error: no complete runs under {args.root}/runs; run `python run.py` first")
    table = summarize(load_table(args.root, "samples", runs), load_table(args.root, "scores", runs))
    cols = [
        "model",
        "dtype",
        "task",
        "method",
        "samples",
        "turns",
        "tau",
        "tok_s",
        "speedup",
        "speedup_lo",
        "speedup_hi",
        "decode_speedup",
        "match_rate",
        "peak_mem_mb",
    ]
    cols += [c for c in table.columns if c.startswith("score.")]
    with pd.option_context(
        "display.width", 200, "display.max_columns", 30, "display.float_format", "{:.3f}".format
    ):
        print(table[[c for c in cols if c in table.columns]].to_string(index=False))
    if "speedup" in table.columns and table["speedup"].notna().any():
        fig = speedup_figure(
            table.dropna(subset=["speedup"]), Path(args.figure or Path(args.root) / "figures" / "summary.png")
        )
        print(f"figure: {fig}")
    return table


if __name__ == "__main__":
    main()
