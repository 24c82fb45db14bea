"""The end-of-run table printed to the terminal, and what it must not let a reader miss: failed
samples, a KV policy that restricted nothing, and how the run compares with vanilla."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def run_summary(samples: pd.DataFrame) -> dict[str, float]:
    ok = samples[samples["error"].isna()]
    wall = ok["wall_s"].sum()
    audited = ok["matches_vanilla"].dropna()
    forwards = ok["forwards"].sum()
    out = {
        "samples": ok["sample_id"].nunique(),
        "turns": len(ok),
        "failed": int(samples.loc[samples["error"].notna(), "sample_id"].nunique()),
        "new_tokens": int(ok["new_tokens"].sum()),
        "tau": ok["committed"].sum() / forwards if forwards else float("nan"),
        "tok_s": ok["new_tokens"].sum() / wall if wall else float("nan"),
        "prefill_s": ok["prefill_s"].sum(),
        "decode_s": ok["decode_s"].sum(),
        "peak_mem_mb": ok["peak_mem_mb"].max(),
        "match_rate": audited.astype(float).mean() if len(audited) else float("nan"),
    }
    if "restricted_frac" in ok.columns and forwards:
        weights = ok["forwards"].astype(float)
        out["restricted_frac"] = float((ok["restricted_frac"] * weights).sum() / weights.sum())
        out["visible_frac"] = float((ok["visible_frac"] * weights).sum() / weights.sum())
    return {k: float(v) if not isinstance(v, str) else v for k, v in out.items()}


def kv_note(runs: pd.Series, samples: pd.DataFrame, summary: dict[str, float]) -> str | None:
    """One line when a lossy KV policy restricted nothing (the run then equals kv=full)."""
    if bool(runs.get("lossless", False)) or runs.get("kv") == "full" or "restricted_frac" not in summary:
        return None
    if summary["restricted_frac"] > 0:
        return None
    ok = samples[samples["error"].isna()]
    budget = ok["kv_budget"].dropna()
    context = int((ok["prompt_tokens"] + ok["new_tokens"]).max()) if len(ok) else 0
    told = f"budget {int(budget.max())}" if len(budget) else "its budget"
    return (
        f"note: kv={runs['kv']} restricted attention in none of the decode forwards ({told}; longest "
        f"context here {context} tokens): this run is kv=full under another name. A budget that bites "
        "at this scale: kv.budget_frac=<fraction of the context> (the kv=*_ctx10 presets use 0.1)."
    )


def print_summary(run_path: Path) -> None:
    path = run_path / "samples.parquet"
    if not path.exists():
        return
    samples = pd.read_parquet(path)
    s = run_summary(samples)
    runs = pd.read_parquet(run_path / "runs.parquet").iloc[0]
    print(
        f"\n{runs['decoder']} + kv={runs['kv']} on {runs['task']}  ({runs['model']}, {runs['dtype']}, "
        f"{runs['device_name']})"
    )
    row = {
        "samples": int(s["samples"]),
        "turns": int(s["turns"]),
        "failed": int(s["failed"]),
        "new tokens": int(s["new_tokens"]),
        "tau": round(s["tau"], 3),
        "tok/s": round(s["tok_s"], 2),
        "prefill s": round(s["prefill_s"], 2),
        "decode s": round(s["decode_s"], 2),
        "peak mem MB": round(s["peak_mem_mb"], 1),
        "matches vanilla": round(s["match_rate"], 3),
    }
    if "restricted_frac" in s and runs.get("kv") != "full":
        row["kv restricted"] = f"{s['restricted_frac']:.0%}"
        row["kv visible"] = f"{s['visible_frac']:.0%}"
    print(pd.DataFrame([row]).to_string(index=False))
    if s["failed"]:
        print(f"FAILED: {int(s['failed'])} sample(s) have errors (column `error` of samples.parquet)")
    note = kv_note(runs, samples, s)
    if note:
        print(note)
    print(f"records: {run_path}/{{runs,samples,steps,scores}}.parquet")
