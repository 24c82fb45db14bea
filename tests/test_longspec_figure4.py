"""analysis.longspec_figure4: LongSpec Figure 4 from two training runs' logs, the steps-to-same-loss
ratio, and the refusals (runs of different configurations or lengths are not compared)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from analysis import longspec_figure4 as fig4
from analysis.metrics import AnalysisError
from analysis.paper import longspec_figure4_section

CONFIG = {
    "out": "x", "init": "y", "model": "smollm2-135m", "dtype": "float32", "seq_len": 4096,
    "sources": ["essays"], "batch": 2, "max_lag": 5, "validation": 2,
    "stages": [{"name": "long_data", "sequences": 16, "labels": "data", "lr": 5e-4}],
}  # fmt: skip


def write_variant(folder, variant: str, losses: list[float], **config) -> None:
    d = folder / variant
    d.mkdir(parents=True)
    pd.DataFrame({"step": range(1, len(losses) + 1), "loss": losses, "tokens": [100] * len(losses)}).to_csv(
        d / "log.csv", index=False
    )
    evals = [  # the continued draft's evaluations come first in training.json
        {"step": 0, "stage": "start", "val_loss": 9.0},
        {"step": 5, "stage": "pretrain", "val_loss": 8.0},
        {"step": 0, "stage": "start", "val_loss": losses[0]},
        {"step": len(losses), "stage": "long_data", "val_loss": losses[-1]},
    ]
    summary = {
        "config": {**CONFIG, "out": str(d), "init": f"ablations/{variant}", **config},
        "continued_from": {"training_tokens": 1000, "weights_digest": "abcdef0123456789"},
        "evals": evals,
    }
    (d / "training.json").write_text(json.dumps(summary))


def descending(start: float, per_step: float, n: int = 12) -> list[float]:
    return [start - per_step * i for i in range(n)]


def test_steps_to_same_loss_both_ways():
    fast, slow = pd.Series(descending(6.0, 0.2)), pd.Series(descending(6.0, 0.1))
    # the level both reach is slow's final mean of 4 (5.2, 5.1, 5.0, 4.9: 5.05), first reached at its
    # step 12; fast's trailing mean first drops to it at step 8 (6.0 - 0.2 * 5.5 = 4.9; step 7: 5.1)
    assert fig4.steps_to_same_loss(fast, slow) == pytest.approx(12 / 8)
    assert fig4.steps_to_same_loss(fast, slow) > 1
    assert fig4.steps_to_same_loss(slow, fast) == pytest.approx(8 / 12)
    assert fig4.steps_to_same_loss(slow, slow) == 1


def test_paired_gap_pairs_the_same_steps():
    plain = pd.Series([5.0, 5.4, 4.8, 5.2])
    anchor = plain - pd.Series([0.02, 0.01, -0.01, 0.02])  # lower at three of the four batches
    gap, lower = fig4.paired_gap(anchor, plain)
    assert gap == pytest.approx(0.01) and lower == 3
    assert fig4.paired_gap(plain, plain) == (0.0, 0)


def test_first_step_at_is_one_based_on_the_smoothed_curve():
    curve = fig4.smoothed(pd.Series([4.0, 4.0, 4.0, 4.0, 0.0]))
    assert fig4.first_step_at(curve, 4.0) == 4  # defined from the 4th step on
    assert fig4.first_step_at(curve, 3.0) == 5
    assert fig4.first_step_at(curve, -1.0) is None


def test_figure4_table_and_plot(tmp_path):
    write_variant(tmp_path, "anchor-offset", descending(6.0, 0.2))
    write_variant(tmp_path, "no-anchor-offset", descending(6.0, 0.1))
    png = tmp_path / "fig" / "f4.png"
    table = fig4.figure4(tmp_path, png)
    assert list(table["pretrained"]) == ["anchor-offset", "no-anchor-offset"]
    anchor, plain = table.iloc[0], table.iloc[1]
    assert anchor["steps_to_same_loss"] > 1 and pd.isna(plain["steps_to_same_loss"])
    assert anchor["paper_steps_to_same_loss"] == fig4.PAPER_SPEEDUP
    assert anchor["val_loss_start"] == 6.0  # this run's own start, not the continued draft's
    assert anchor["loss_last"] == pytest.approx(sum(descending(6.0, 0.2)[-4:]) / 4, abs=1e-3)
    assert anchor["tokens"] == 1200 and anchor["init_digest"] == "abcdef0123"
    assert anchor["steps_lower"] == "11/12" and anchor["paired_loss_gap"] == pytest.approx(0.55, abs=1e-3)
    assert "4096 tokens of essays" in table.attrs["caption"]
    assert png.stat().st_size > 0


def test_runs_of_other_configurations_are_refused(tmp_path):
    write_variant(tmp_path, "anchor-offset", descending(6.0, 0.2))
    write_variant(tmp_path, "no-anchor-offset", descending(6.0, 0.1), seq_len=2048)
    with pytest.raises(AnalysisError, match="differ in seq_len"):
        fig4.figure4(tmp_path)
    text = "\n".join(longspec_figure4_section(tmp_path / "out", tmp_path))
    assert "Not made from these runs" in text and "seq_len" in text


def test_runs_of_other_lengths_are_refused(tmp_path):
    write_variant(tmp_path, "anchor-offset", descending(6.0, 0.2))
    write_variant(tmp_path, "no-anchor-offset", descending(6.0, 0.1, n=10))
    with pytest.raises(AnalysisError, match="different step counts"):
        fig4.figure4(tmp_path)


def test_no_runs_names_the_command(tmp_path):
    assert fig4.figure4(tmp_path).empty
    text = "\n".join(longspec_figure4_section(tmp_path / "out", tmp_path))
    assert "No runs yet: `make longspec-figure4`" in text
    write_variant(tmp_path, "anchor-offset", descending(6.0, 0.2))
    assert fig4.figure4(tmp_path).empty  # one of the pair is not a figure


def test_cli_prints_the_table_or_one_error_line(tmp_path, capsys):
    with pytest.raises(SystemExit, match="^error: no runs under"):
        fig4.main(["--folder", str(tmp_path)])
    write_variant(tmp_path, "anchor-offset", descending(6.0, 0.2))
    write_variant(tmp_path, "no-anchor-offset", descending(6.0, 0.1))
    fig4.main(["--folder", str(tmp_path)])
    assert "| anchor-offset |" in capsys.readouterr().out
