"""FAFO Tables 4-6 from our runs beside the paper's (the FAFO paper): speedup and tau of FAFO-Stream,
FAFO-Quest and Lookahead per task, when sampling (Table 4), on AIME24 (Table 5) and on Multi-IF
(Table 6). `python -m analysis.fafo_paper` prints them with the other tables."""

from __future__ import annotations

import pandas as pd

from analysis.fafo_base import (
    PAPER_SETTING,
    TASKS,
    _caption,
    _join_paper,
    aggregate,
    greedy,
    hold,
    paper_rows,
)

METHODS_3 = ("FAFO-Stream", "FAFO-Quest", "Lookahead")  # the rows of FAFO Tables 4-6


def _by_task(
    samples: pd.DataFrame,
    table: str,
    tasks: tuple[str, ...],
    paper_model: str,
    fixed: dict | None,
    sampled: bool = False,
) -> pd.DataFrame:
    """Speedup and tau of FAFO-Stream, FAFO-Quest and Lookahead per task beside the paper's `table`
    (`paper_model`'s rows), each run paired with the vanilla run of its environment."""
    fixed = PAPER_SETTING if fixed is None else fixed
    ours = aggregate(hold(samples[samples["task"].isin(tasks)], fixed), [], sampled=sampled)
    ours["paper_task"] = ours["task"].map(lambda t: TASKS.get(t, t))
    paper = paper_rows(table)
    keys = [{"method": m, "task": TASKS.get(t, t)} for m in METHODS_3 for t in tasks]
    return _join_paper(
        ours,
        keys,
        paper[paper["model"] == paper_model],
        {"speedup": "speedup", "tau": "tau"},
        {"method": "method", "task": "paper_task"},
    )


def table4(
    samples: pd.DataFrame,
    paper_model: str = "Llama-2-7b-chat",
    tasks: tuple[str, ...] = ("mtbench", "gsm8k", "humaneval"),
    fixed: dict | None = None,
) -> pd.DataFrame:
    """Table 4: speedup and tau of FAFO-Stream, FAFO-Quest and Lookahead when sampling (the paper: its
    models' generation_config.json, Llama temperature 0.6, top-p 0.9), each paired with a vanilla run
    sampled at the same setting. Sampled runs only; the caption says their sampling setting."""
    out = _by_task(samples, "Table 4", tasks, paper_model, fixed, sampled=True)
    sampled = greedy(samples, sampled=True)
    settings = sorted(set(sampled["sampling"].astype(str))) if "sampling" in sampled.columns else []
    held = PAPER_SETTING if fixed is None else fixed
    ours = "; ".join(f"sampling {v}" for v in settings)
    return _caption(out, "Table 4 (sampling)", samples, paper_model, held, ours=ours)


def table5(
    samples: pd.DataFrame, paper_model: str = "DeepSeek-R1-Distill-Qwen-7B", fixed: dict | None = None
) -> pd.DataFrame:
    """Table 5: AIME24 (the paper: reasoning models' long chains of thought; ours: the task's offline
    copy under our model, whose short answers are not a reasoning trace)."""
    out = _by_task(samples, "Table 5", ("aime24",), paper_model, fixed)
    return _caption(out, "Table 5 (AIME24)", samples, paper_model, PAPER_SETTING if fixed is None else fixed)


def table6(
    samples: pd.DataFrame, paper_model: str = "Llama-2-7b-chat", fixed: dict | None = None
) -> pd.DataFrame:
    """Table 6: Multi-IF, multi-turn instruction following (three turns per conversation)."""
    out = _by_task(samples, "Table 6", ("multi_if",), paper_model, fixed)
    return _caption(
        out, "Table 6 (Multi-IF)", samples, paper_model, PAPER_SETTING if fixed is None else fixed
    )
