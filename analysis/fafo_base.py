"""The FAFO paper tables' shared pieces (the FAFO paper): its setting and tasks, our side of a cell
(`aggregate`: one run per cell, paired with the vanilla run of its environment), the paper's side
(`paper_rows` from `results/curated/paper_tables_fafo.csv`, `_join_paper`), captions and plain-text
rendering. The tables themselves: `analysis.fafo_paper` (Tables 1, 2, 10-13), `analysis.fafo_by_task`
(Tables 4-6), `analysis.fafo_figure1` (Figure 1)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis.metrics import (
    ENV,
    SETUP,
    AnalysisError,
    baseline_of,
    bootstrap_ratio,
    check_one_run,
    kv_activity,
    paired_speedup,
    set_caption,
    temperature,
    with_env,
)

PAPER_CSV = Path(__file__).resolve().parents[1] / "results" / "curated" / "paper_tables_fafo.csv"
PAPER_ENV = "fp16, batch 1, 1x A100-80GB"
KV_LABEL = {"streaming": "Stream", "quest": "Quest", "snapkv": "SnapKV", "h2o": "H2O", "full": "Full"}
TASKS = {
    "mtbench": "MT-Bench",
    "gsm8k": "GSM8K",
    "humaneval": "HumanEval-Completion",
    "multi_if": "Multi-IF",
    "aime24": "AIME24",
}
# The setting each table holds fixed (the paper's best, conf/decoder/fafo.yaml + kv budget 760, and
# Lookahead's README G=7); a sweep frees its own column. Pass `fixed=` for other presets (e.g. CPU).
PAPER_SETTING = {"decoder.k": 6, "decoder.n": 40, "kv.budget": 760, "decoder.G": 7}
# The context the papers' absolute budgets are a share of (760 ~ 10% of their ~7.6k-token contexts):
# a run's budget fraction x this = the paper budget it stands for (Table 13 at scale=cpu).
PAPER_CONTEXT = 7600
PEAK_MEMORY = (
    "Peak memory (peak_mem_mb) is the process's peak RSS on a CPU but allocated GPU memory "
    "(torch.cuda.max_memory_allocated) on a GPU: compare it within one setup only."
)


# --- our side -------------------------------------------------------------------------------------
def method_of(decoder: str, kv: str) -> str:
    """Paper-style method label of one run: FAFO-<KV>, FAFO-2forward, Lookahead, PLD, ..."""
    d = str(decoder)
    if d.startswith("fafo"):
        return "FAFO-2forward" if "2forward" in d else f"FAFO-{KV_LABEL.get(str(kv), str(kv))}"
    return {
        "lookahead": "Lookahead",
        "pld": "PLD",
        "triforce": "TriForce",
        "vanilla": "Vanilla",
        "longspec": "LongSpec",
        "sfi": "SFI",
        "swift": "SWIFT",
    }.get(d, d)


def hold(samples: pd.DataFrame, fixed: dict[str, object]) -> pd.DataFrame:
    """Rows whose parameters equal `fixed` (a column a run does not have, or NaN, always passes)."""
    keep = pd.Series(True, index=samples.index)
    for col, val in fixed.items():
        if col in samples.columns:
            keep &= samples[col].isna() | (samples[col].map(_num) == _num(val))
    return samples[keep]


def one_setup(samples: pd.DataFrame) -> pd.DataFrame:
    """`samples` (with environment columns) if they come from one setup, else an AnalysisError."""
    df = with_env(samples)
    setups = df[SETUP].drop_duplicates()
    if len(setups) > 1:
        differ = [c for c in SETUP if setups[c].nunique() > 1]
        raise AnalysisError(
            f"these runs come from {len(setups)} setups (they differ in {', '.join(differ)}); a paper table "
            "is made per setup (python -m analysis.fafo_paper prints one set of tables per setup)"
        )
    return df


def greedy(samples: pd.DataFrame, sampled: bool = False) -> pd.DataFrame:
    """The greedy rows (`sampled=True`: the rows sampled at a temperature > 0): the paper's tables are
    greedy except Table 4, so a sampled run fills Table 4 alone."""
    return samples[(temperature(samples) > 0) == sampled]


def aggregate(samples: pd.DataFrame, by: list[str], sampled: bool = False) -> pd.DataFrame:
    """One row per (task environment, method, *by): tau, tok/s, KV activity, speedup vs the vanilla
    kv=full run of the same environment, peak memory. One run per cell, or an AnalysisError. Greedy runs
    only (`sampled=True`: sampled runs only, Table 4)."""
    df = one_setup(greedy(samples, sampled))
    if "error" in df.columns:
        df = df[df["error"].isna()]
    df["method"] = [method_of(d, k) for d, k in zip(df["decoder"], df["kv"])]
    if "committed" not in df.columns:
        df["committed"] = df["tau"] * df["forwards"]
    out = []
    for env_key, group in df.groupby(ENV, sort=True):
        keys = ["method", *by]
        for key, run in group[group["decoder"] != "vanilla"].groupby(keys, dropna=False):
            key = key if isinstance(key, tuple) else (key,)
            check_one_run(run, f"{dict(zip(keys, key))} on {run['task'].iloc[0]}")
            base = baseline_of(group, run)  # its own experiment's vanilla run where it made one
            row = dict(zip(ENV, env_key))
            row.update(dict(zip(keys, key)))
            fw = run["forwards"].sum()
            row.update(
                run_id=str(run["run_id"].iloc[0]) if "run_id" in run.columns else "",
                base_run_id=str(base["run_id"].iloc[0]) if base is not None and "run_id" in base else "",
                turns=len(run),
                tau=run["committed"].sum() / fw if fw else float("nan"),
                tok_s=run["new_tokens"].sum() / run["wall_s"].sum(),
                kv_activity=kv_activity(run),
            )
            if "peak_mem_mb" in run.columns:
                row["peak_mem_mb"] = run["peak_mem_mb"].max()
            paired = paired_speedup(run, base)
            row["speedup"], row["note"] = paired["speedup"], paired["note"]
            # 95% intervals over samples (hidden from the tables, read by the verdicts)
            row["_speedup_lo"], row["_speedup_hi"] = paired["speedup_lo"], paired["speedup_hi"]
            row["_tau_lo"], row["_tau_hi"] = bootstrap_ratio(
                run["committed"], run["forwards"], run["sample_id"]
            )
            out.append(row)
    columns = [*ENV, "method", *by, "run_id", "base_run_id", "turns", "tau", "tok_s", "kv_activity"]
    columns += ["speedup", "note"]
    return pd.DataFrame(out) if out else pd.DataFrame(columns=columns)


def _caption(
    out: pd.DataFrame, title: str, samples: pd.DataFrame, paper_model: str, fixed: dict | None = None, ours=""
) -> pd.DataFrame:
    """Captions `out` (`analysis.metrics.set_caption`) with our one setup (`one_setup` has refused
    anything else) and the code versions of the runs its rows show (`attrs["used"]`, set by
    `_join_paper`; every run of `samples` when the table shows none)."""
    df = one_setup(samples) if len(samples) else samples
    used = set(out.attrs.get("used", ()))
    if used and "run_id" in df.columns:
        df = df[df["run_id"].astype(str).isin(used)]
    held = ", ".join(f"{k.rpartition('.')[2]}={v}" for k, v in (fixed or {}).items())
    held = f"held fixed {held}" if held else ""
    return set_caption(
        out,
        df,
        f"FAFO {title}",
        ours="; ".join(p for p in (held, ours) if p),
        paper=f"{paper_model}, {PAPER_ENV}",
        notes=" ".join(
            n
            for n in (
                "Speedup = vanilla wall / method wall over the same (sample, turn) set.",
                PEAK_MEMORY if title.split(",")[0].split(" (")[0] in ("Table 1", "Figure 1") else "",
                str(out.attrs.get("tau_note", "")),
            )
            if n
        ),
        threads=True,
    )


# --- the paper's side ------------------------------------------------------------------------------
def paper_rows(table: str, path: Path | str = PAPER_CSV) -> pd.DataFrame:
    """The paper's rows of one table, with the `setting` items split into columns."""
    df = pd.read_csv(path, na_values=["NA"])
    df = df[df["table"] == table].copy()
    for i, setting in df["setting"].items():
        for item in str(setting).split(";"):
            if "=" in item:
                key, val = item.split("=", 1)
                df.loc[i, f"s.{key}"] = val
    return df


def _paper_match(paper: pd.DataFrame, metric: str, **match: object) -> pd.DataFrame:
    sel = paper[paper["metric"] == metric]
    for col, val in match.items():
        sel = sel[sel[col].astype(str) == str(val)]
    return sel


def _join_paper(
    ours: pd.DataFrame,
    keys: list[dict],
    paper: pd.DataFrame,
    metrics: dict[str, str],
    ours_key: dict[str, str],
) -> pd.DataFrame:
    """Rows = `keys` (paper-side column values); ours matched by `ours_key` (paper col -> our col). A cell
    takes the one run that matches (`check_one_run`: two are an AnalysisError, never a mean); a paper
    cell is marked `~ (prose)` only when its value is the prose's approximation."""
    rows, used = [], set()
    for key in keys:
        row = dict(key)
        mine = ours
        for paper_col, our_col in ours_key.items():
            if our_col not in mine.columns:
                mine = mine.iloc[0:0]
                continue
            mine = mine[mine[our_col].astype(str) == str(key[paper_col])]
        check_one_run(mine, ", ".join(f"{k}={v}" for k, v in key.items()), rows_are_runs=True)
        for col in ("run_id", "base_run_id"):
            used |= {str(v) for v in mine.get(col, pd.Series(dtype=str)).dropna() if str(v)}
        for metric, ours_col in metrics.items():
            row[f"ours_{ours_col}"] = (
                float(mine[ours_col].iloc[0]) if len(mine) and ours_col in mine else float("nan")
            )
            for end in ("lo", "hi"):  # the cell's interval, hidden from the markdown (a leading _)
                col = f"_{ours_col}_{end}"
                has = len(mine) and col in mine
                row[f"_ours_{ours_col}_{end}"] = float(mine[col].iloc[0]) if has else float("nan")
            sel = _paper_match(paper, metric, **key).dropna(subset=["value"])
            row[f"paper_{metric}"] = float(sel["value"].iloc[0]) if len(sel) else float("nan")
            approx = bool(
                len(sel) and "approx" in sel.columns and sel["approx"].fillna(False).astype(bool).iloc[0]
            )
            row[f"paper_{metric}_approx"] = "~ (prose)" if approx else None
        row["ours_kv_activity"] = mine["kv_activity"].iloc[0] if len(mine) and "kv_activity" in mine else ""
        row["ours_note"] = mine["note"].iloc[0] if len(mine) and "note" in mine else ""
        rows.append(row)
    out = pd.DataFrame(rows)
    marks = [c for c in out.columns if c.endswith("_approx")]
    out = out.drop(columns=[c for c in marks if out[c].isna().all()])  # a table without prose cells
    out.attrs["used"] = sorted(used)  # the runs (and baselines) behind the table's cells, for its caption
    return out


def _num(v: object) -> str:
    """Sweep values as the paper writes them (6, not 6.0)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return str(v)
    return str(int(f)) if f.is_integer() else str(f)


def render(table: pd.DataFrame) -> str:
    """Plain-text table with its caption."""
    with pd.option_context(
        "display.width", 200, "display.max_columns", 40, "display.float_format", "{:.2f}".format
    ):
        return f"{table.attrs.get('caption', '')}\n{table.to_string(index=False)}"
