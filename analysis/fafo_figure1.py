"""FAFO's Figure 1 (the FAFO paper): speedup and tau against the number of n-gram guesses, FAFO (n) vs
Lookahead (G), from our runs; the paper plots it without numbers."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.fafo_base import PAPER_SETTING, TASKS, _caption, _num, aggregate, hold
from analysis.metrics import ENV, save_png


def figure1(
    samples: pd.DataFrame, path: Path | str | None = None, task: str = "mtbench", fixed: dict | None = None
) -> pd.DataFrame:
    """Figure 1: speedup and tau against the number of n-gram guesses, FAFO (n) vs Lookahead (G).
    The paper gives a plot only (no numbers); `path` saves our version as a PNG."""
    fixed = {
        k: v
        for k, v in (PAPER_SETTING if fixed is None else fixed).items()
        if k not in ("decoder.n", "decoder.G")
    }
    df = hold(samples[samples["task"] == task], fixed)
    parts, used = [], set()
    for decoder_prefix, col in (("fafo", "decoder.n"), ("lookahead", "decoder.G")):
        sub = df[df["decoder"].astype(str).str.startswith(decoder_prefix) | (df["decoder"] == "vanilla")]
        sub = sub[~sub["decoder"].astype(str).str.contains("2forward")]
        if col not in sub.columns or sub[col].isna().all():
            continue
        agg = aggregate(sub.assign(guesses=sub[col].map(_num)), ["guesses"])
        agg = agg.dropna(subset=["guesses"])
        used |= {str(r) for r in (*agg["run_id"], *agg["base_run_id"]) if str(r)}
        parts.append(agg)
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=["method", "guesses"])
    if len(out):
        out["guesses"] = out["guesses"].astype(float)
        out = out.sort_values(["method", "guesses"], ignore_index=True)
        # one setup: its caption names it, and the code versions of the runs
        out = out.drop(columns=[c for c in [*ENV, "run_id", "base_run_id"] if c in out.columns])
    out.attrs["used"] = sorted(used)
    title = f"Figure 1 ({TASKS.get(task, task)}; the paper plots it without numbers)"
    _caption(out, title, samples, "Llama-2-7b-chat", fixed)
    if path is not None and len(out):
        _plot_figure1(out, Path(path))
    return out


def _plot_figure1(table: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.5))
    for method, t in table.groupby("method"):
        axes[0].plot(t["guesses"], t["speedup"], marker="o", label=method)
        axes[1].plot(t["guesses"], t["tau"], marker="o", label=method)
    axes[0].set(xlabel="number of n-gram guesses", ylabel="speedup vs vanilla")
    axes[1].set(xlabel="number of n-gram guesses", ylabel="tau (tokens / forward)")
    axes[0].legend(fontsize=7)
    fig.suptitle(table.attrs.get("title", ""), fontsize=9)  # the report's caption names the setup
    fig.tight_layout()
    save_png(fig, path)
    plt.close(fig)
