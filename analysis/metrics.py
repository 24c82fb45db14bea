"""Speedup vs vanilla (ratio of totals with a bootstrap interval), tau, quality next to speed.

Speedup = sum of vanilla wall time / sum of method wall time over the SAME (sample, turn) set, for
runs with the same model, dtype, device and task (never across hardware). The baseline is
`decoder=vanilla kv=full`. The interval resamples samples (all turns of a sample together).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

ENV = ["model", "dtype", "linear", "device_name", "task", "max_new_tokens"]


def method_label(row: pd.Series) -> str:
    params = sorted(k for k in row.index if k.startswith("decoder.") and pd.notna(row[k]))

    def fmt(v: object) -> str:
        return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)

    shown = ",".join(f"{k.split('.', 1)[1]}={fmt(row[k])}" for k in params)
    return f"{row['decoder']}{f'[{shown}]' if shown else ''}+{row['kv']}"


def bootstrap_ratio(
    num: pd.Series, den: pd.Series, groups: pd.Series, n: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """95% interval of sum(num)/sum(den) resampling `groups` (sample ids) with replacement."""
    by = pd.DataFrame({"num": num.values, "den": den.values, "g": groups.values}).groupby("g").sum()
    if len(by) < 2:
        r = by["num"].sum() / by["den"].sum()
        return r, r
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(by), size=(n, len(by)))
    ratios = by["num"].values[idx].sum(1) / by["den"].values[idx].sum(1)
    return float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))


def summarize(samples: pd.DataFrame, scores: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per run: tau, tok/s, speedup vs vanilla (+95% CI), match rate, mean scores."""
    ok = samples[samples["error"].isna()].copy()
    ok["method"] = ok.apply(method_label, axis=1)
    out = []
    if "linear" not in ok.columns:
        ok = ok.assign(linear="aten")
    for env, group in ok.groupby(ENV, dropna=False):
        base = group[(group["decoder"] == "vanilla") & (group["kv"] == "full")]
        base = base.drop_duplicates(["sample_id", "turn"], keep="last").set_index(["sample_id", "turn"])
        for run_id, run in group.groupby("run_id"):
            row = dict(zip(ENV, env))
            row.update(
                run_id=run_id,
                method=run["method"].iloc[0],
                decoder=run["decoder"].iloc[0],
                kv=run["kv"].iloc[0],
                samples=run["sample_id"].nunique(),
                turns=len(run),
                new_tokens=int(run["new_tokens"].sum()),
                tau=run["committed"].sum() / max(run["forwards"].sum(), 1),
                tok_s=run["new_tokens"].sum() / run["wall_s"].sum(),
                peak_mem_mb=run["peak_mem_mb"].max(),
                match_rate=run["matches_vanilla"].dropna().astype(float).mean(),
            )
            paired = run.set_index(["sample_id", "turn"]).join(
                base[["wall_s", "decode_s"]], rsuffix="_base", how="inner"
            )
            if len(paired):
                row["speedup"] = paired["wall_s_base"].sum() / paired["wall_s"].sum()
                row["speedup_lo"], row["speedup_hi"] = bootstrap_ratio(
                    paired["wall_s_base"], paired["wall_s"], paired.index.get_level_values(0).to_series()
                )
                row["decode_speedup"] = paired["decode_s_base"].sum() / paired["decode_s"].sum()
                row["paired_turns"] = len(paired)
            out.append(row)
    table = pd.DataFrame(out)
    if scores is not None and len(scores) and len(table):
        means = scores.pivot_table(index="run_id", columns="metric", values="value", aggfunc="mean")
        table = table.merge(means.add_prefix("score."), left_on="run_id", right_index=True, how="left")
    return table
