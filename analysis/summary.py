"""Print speedup vs vanilla, tau, KV-policy activity and scores, one row per run; save one figure.

Every run is compared only with the vanilla kv=full run of its own environment (analysis.metrics);
a comparison that would pool or pair different environments is refused with one `error:` line.

python -m analysis.summary [--root DIR] [--figure PNG]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from analysis.load import load_runs, load_table  # noqa: E402
from analysis.metrics import AnalysisError, summarize  # noqa: E402

CONFIG = Path(__file__).resolve().parents[1] / "conf" / "config.yaml"
COLUMNS = [
    "model",
    "dtype",
    "task",
    "method",
    "kv_activity",
    "samples",
    "turns",
    "tau",
    "tok_s",
    "speedup",
    "speedup_lo",
    "speedup_hi",
    "decode_speedup",
    "forward_share",
    "kv_mb_per_token",
    "kv_bound_speedup",
    "pred_speedup",
    "pred_H100",
    "match_rate",
    "match_or_tie_rate",
    "peak_mem_mb",
    "note",
]


def default_root() -> str:
    """The config's `run.out_dir` (where `python run.py` writes), "results" if unreadable."""
    try:
        from omegaconf import OmegaConf

        return str(OmegaConf.load(CONFIG).run.out_dir)
    except Exception:  # noqa: BLE001
        return "results"


def speedup_figure(table: pd.DataFrame, path: Path) -> Path:
    """Bars of speedup vs vanilla (95% interval), one panel per (task, environment) in a grid; bars
    carry short labels M1..Mk, the legend below maps them to the full method names."""
    table = table.dropna(subset=["speedup"]).copy()
    methods = sorted(table["method"].unique())
    short = {m: f"M{i + 1}" for i, m in enumerate(methods)}
    panels = list(table.groupby(["task", "model", "dtype", "device_name"], sort=True))
    cols = min(3, len(panels))
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(
        rows, cols, figsize=(4.2 * cols, 2.8 * rows + 0.25 * len(methods)), squeeze=False
    )
    for ax in axes.flat[len(panels) :]:
        ax.axis("off")
    for ax, ((task, model, dtype, device), t) in zip(axes.flat, panels):
        t = t.sort_values("speedup")
        y = list(range(len(t)))
        err = [t["speedup"] - t["speedup_lo"], t["speedup_hi"] - t["speedup"]]
        ax.barh(y, t["speedup"], xerr=err, color="tab:blue", alpha=0.8)
        ax.set_yticks(y, [f"{short[m]} (tau {tau:.2f})" for m, tau in zip(t["method"], t["tau"])], fontsize=7)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xlabel("speedup vs vanilla", fontsize=7)
        ax.set_title(f"{task}\n{model} {dtype}, {device}"[:90], fontsize=7)
    legend = "\n".join(f"{short[m]}: {m}" for m in methods)
    fig.text(0.01, 0.005, legend, fontsize=6, va="bottom", family="monospace")
    fig.tight_layout(rect=(0, 0.02 + 0.022 * len(methods) / rows, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def with_predictions(table: pd.DataFrame, root: Path) -> pd.DataFrame:
    """Add the speedups the cost model predicts from each run's blocks (analysis.cost_model): on the
    curve measured in the run's environment (`pred_speedup`, NaN when none is committed) and on the
    H100 roofline (`pred_H100`)."""
    from analysis.cost_model import BENCH, committed_curves, run_predictions

    try:
        pred = run_predictions(root, committed_curves(BENCH))
    except (KeyError, ValueError):
        pred = pd.DataFrame()
    if pred.empty or "run_id" not in table.columns:
        return table.assign(pred_speedup=math.nan, pred_H100=math.nan)
    pred = pred.set_index("run_id")[["predicted_here", "roofline_H100-SXM"]]
    pred.columns = ["pred_speedup", "pred_H100"]
    return table.merge(pred, left_on="run_id", right_index=True, how="left")


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
    runs = load_runs(args.root)
    if runs.empty:
        sys.exit(f"error: no complete runs under {args.root}/runs; run `python run.py` first")
    try:
        table = summarize(load_table(args.root, "samples", runs), load_table(args.root, "scores", runs))
    except AnalysisError as exc:
        sys.exit(f"error: {exc}")
    table = with_predictions(table, Path(args.root))
    cols = [c for c in COLUMNS if c in table.columns] + [c for c in table.columns if c.startswith("score.")]
    with pd.option_context(
        "display.width", 250, "display.max_columns", 40, "display.float_format", "{:.3f}".format
    ):
        print(table[cols].to_string(index=False))
    if table["speedup"].notna().any():
        figure = Path(args.figure or Path(args.root) / "figures" / "summary.png")
        print(f"figure: {speedup_figure(table, figure)}")
    return table


if __name__ == "__main__":
    main()
