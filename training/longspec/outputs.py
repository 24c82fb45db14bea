"""What `training.longspec` writes besides the draft: per-step and evaluation CSVs and the loss curve."""

from __future__ import annotations

import csv
from pathlib import Path


def write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def plot_loss(log: list[dict], evals: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for name in dict.fromkeys(r["stage"] for r in log):
        rows = [r for r in log if r["stage"] == name]
        ax.plot([r["tokens_total"] for r in rows], [r["loss"] for r in rows], label=f"train ({name})")
    ax.plot(
        [e["tokens_total"] for e in evals], [e["val_loss"] for e in evals], "ko-", ms=3, label="validation"
    )
    ax.set_xlabel("training tokens")
    ax.set_ylabel("cross-entropy")
    ax.legend()
    ax2.plot([e["tokens_total"] for e in evals], [e["tau"] for e in evals], "o-")
    ax2.set_xlabel("training tokens")
    ax2.set_ylabel("tau (small tree, validation prompts)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
