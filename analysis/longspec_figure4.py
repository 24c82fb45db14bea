"""LongSpec's Figure 4 in shape (LongSpec §4.3): two drafts pretrained on short sequences, one with
Anchor-Offset position ids and one with plain ones, then trained the same way on long sequences (plain
positions, the same sequences, order and lags); their training loss on the long data, and how many
times fewer steps the Anchor-Offset draft needs to reach a loss both reach (the paper: 3.93x).

Reads the runs `make longspec-figure4` commits: `<folder>/<variant>/log.csv` (per-step training loss)
and `<variant>/training.json` (config, the draft it continued, evaluations). The two runs must share
their configuration but for `init` and `out`: anything else is refused, never compared.

python -m analysis.longspec_figure4 [--folder DIR] [--png FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

from analysis.metrics import AnalysisError, save_png
from analysis.report_parts import markdown

REPO = Path(__file__).resolve().parents[1]
FOLDER = REPO / "results" / "paper" / "training" / "longspec_figure4"
VARIANTS = ("anchor-offset", "no-anchor-offset")  # the pretrained pair, as named under ablations/
PAPER_SPEEDUP = 3.93  # the paper's LongSpec Fig 4, steps_to_same_loss_speedup
SMOOTH = 4  # optimizer steps in the trailing mean the loss levels are read from
RUN_SPECIFIC = ("init", "out", "max_minutes")  # config fields allowed to differ between the two runs


def smoothed(loss: pd.Series, window: int = SMOOTH) -> pd.Series:
    """The trailing mean over `window` steps (defined from the `window`-th step on)."""
    return loss.rolling(window, min_periods=window).mean()


def first_step_at(curve: pd.Series, level: float) -> int | None:
    """The first optimizer step (1-based, by position) whose smoothed loss is at or below `level`."""
    hits = (curve.to_numpy() <= level).nonzero()[0]
    return int(hits[0]) + 1 if len(hits) else None


def steps_to_same_loss(anchor: pd.Series, plain: pd.Series) -> float:
    """How many times fewer steps the Anchor-Offset curve needs than the plain one to first reach the
    loss level both reach (the higher of their final smoothed losses): > 1 when Anchor-Offset gets
    there first (the paper's 3.93x), < 1 when it gets there later."""
    a, p = smoothed(anchor), smoothed(plain)
    if a.dropna().empty or p.dropna().empty:
        raise AnalysisError(f"LongSpec Figure 4: fewer than {SMOOTH} steps per run")
    level = max(a.iloc[-1], p.iloc[-1])
    return first_step_at(p, level) / first_step_at(a, level)  # type: ignore[operator]


def paired_gap(anchor: pd.Series, plain: pd.Series) -> tuple[float, int]:
    """The two runs see the same sequences in the same order with the same lags, so their losses pair
    step by step: the mean of plain - Anchor-Offset (> 0: Anchor-Offset lower) and the number of steps
    at which Anchor-Offset's loss is the lower one."""
    diff = plain.to_numpy() - anchor.to_numpy()
    return float(diff.mean()), int((diff > 0).sum())


def load_run(folder: Path) -> tuple[pd.DataFrame, dict]:
    """One variant's per-step log and its training.json."""
    log, summary = folder / "log.csv", folder / "training.json"
    if not log.is_file() or not summary.is_file():
        raise AnalysisError(f"LongSpec Figure 4: {folder} lacks log.csv or training.json")
    return pd.read_csv(log), json.loads(summary.read_text())


def own_evals(summary: dict) -> pd.DataFrame:
    """This run's evaluations (training.json carries the continued draft's before them): from its
    last `start` evaluation on."""
    evals = pd.DataFrame(summary.get("evals") or [])
    if evals.empty or "start" not in set(evals["stage"]):
        return evals
    return evals.iloc[int((evals["stage"] == "start").to_numpy().nonzero()[0][-1]) :]


def _shared_config(summaries: dict[str, dict]) -> dict:
    configs = {
        v: {k: x for k, x in s["config"].items() if k not in RUN_SPECIFIC} for v, s in summaries.items()
    }
    first = next(iter(configs.values()))
    for v, cfg in configs.items():
        differ = sorted(k for k in first.keys() | cfg.keys() if first.get(k) != cfg.get(k))
        if differ:
            raise AnalysisError(
                f"LongSpec Figure 4: the runs differ in {', '.join(differ)} ({v}): not compared"
            )
    return first


def figure4(folder: Path = FOLDER, png: Path | None = None) -> pd.DataFrame:
    """One row per variant (empty when the runs are not there yet); the ratio sits on the Anchor-Offset
    row beside the paper's. Writes the loss curves to `png` when given."""
    if not all((folder / v).is_dir() for v in VARIANTS):
        return pd.DataFrame()
    runs = {v: load_run(folder / v) for v in VARIANTS}
    cfg = _shared_config({v: s for v, (_, s) in runs.items()})
    loss = {v: log["loss"] for v, (log, _) in runs.items()}
    if len({len(x) for x in loss.values()}) > 1:
        raise AnalysisError("LongSpec Figure 4: the runs have different step counts: not compared")
    ratio = steps_to_same_loss(loss[VARIANTS[0]], loss[VARIANTS[1]])
    gap, lower = paired_gap(loss[VARIANTS[0]], loss[VARIANTS[1]])
    comparison = {  # on the Anchor-Offset row only
        "paired_loss_gap": round(gap, 4), "steps_lower": f"{lower}/{len(loss[VARIANTS[0]])}",
        "steps_to_same_loss": round(ratio, 2), "paper_steps_to_same_loss": PAPER_SPEEDUP,
    }  # fmt: skip
    rows = []
    for v, (log, summary) in runs.items():
        evals, init = own_evals(summary), summary.get("continued_from") or {}
        curve = smoothed(log["loss"])
        rows.append(
            {"pretrained": v, "init_tokens": init.get("training_tokens"),
             "init_digest": str(init.get("weights_digest", ""))[:10], "steps": len(log),
             "tokens": int(log["tokens"].sum()), "loss_first": round(float(curve.dropna().iloc[0]), 3),
             "loss_last": round(float(curve.iloc[-1]), 3),
             "val_loss_start": round(float(evals["val_loss"].iloc[0]), 3) if len(evals) else None,
             "val_loss_end": round(float(evals["val_loss"].iloc[-1]), 3) if len(evals) else None,
             **(comparison if v == VARIANTS[0] else dict.fromkeys(comparison))}
        )  # fmt: skip
    table = pd.DataFrame(rows)
    stage, sources = cfg["stages"][0], ", ".join(cfg["sources"])
    notes = (
        f"Ours: {cfg['model']} ({cfg['dtype']}) target; the two drafts of "
        f"checkpoints/longspec/ablations/ (1024-token pretraining, with and without Anchor-Offset) each "
        f"trained on {stage['sequences']} sequences of {cfg['seq_len']} tokens of {sources} "
        f"with plain positions ({stage['labels']} labels, peak LR {stage['lr']:g}, batch {cfg['batch']}, "
        f"lag in [1, {cfg['max_lag']}]; the same sequences, order and lags). loss_first/loss_last: the "
        f"training loss, mean of the first/last {SMOOTH} steps; val_loss: the run's "
        f"{cfg['validation']} validation long sequences before and after; paired_loss_gap: the mean "
        f"per-step training loss of the plain draft minus the Anchor-Offset one (the same batches: > 0 "
        f"when Anchor-Offset is lower), steps_lower: at how many steps it is lower; steps_to_same_loss: "
        f"how many times fewer steps the Anchor-Offset draft needs to first reach the loss both reach "
        f"(below 1: it needs more). Paper: 7B drafts, SlimPajama then Prolong-64k, {PAPER_SPEEDUP}x."
    )
    title = "LongSpec Figure 4 in shape (from the two training logs, not from run records)"
    table.attrs.update(title=title, notes=notes, caption=f"{title}. {notes}")
    if png is not None:
        plot(loss, png)
    return table


def plot(loss: dict[str, pd.Series], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for v, series in loss.items():
        steps = range(1, len(series) + 1)
        line = ax.plot(steps, smoothed(series), label=f"pretrained {v}")[0]
        ax.plot(steps, series, color=line.get_color(), alpha=0.25, linewidth=0.8)
    ax.set_xlabel("optimizer step on long sequences")
    ax.set_ylabel(f"training loss (faint: per step; line: mean of {SMOOTH})")
    ax.legend()
    fig.tight_layout()
    save_png(fig, png)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--folder", default=str(FOLDER), help="holding <variant>/log.csv and training.json")
    ap.add_argument("--png", default=None, help="write the loss curves here")
    args = ap.parse_args(argv)
    try:
        table = figure4(Path(args.folder), Path(args.png) if args.png else None)
    except AnalysisError as exc:
        sys.exit(f"error: {exc}")
    if table.empty:
        sys.exit(f"error: no runs under {args.folder} (make longspec-figure4)")
    print(table.attrs["caption"] + "\n\n" + markdown(table))


if __name__ == "__main__":
    main()
