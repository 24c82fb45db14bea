"""The end-of-run table printed to the terminal."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def run_summary(samples: pd.DataFrame) -> dict[str, float]:
    ok = samples[samples["error"].isna()]
    wall = ok["wall_s"].sum()
    audited = ok["matches_vanilla"].dropna()
    return {
        "samples": ok["sample_id"].nunique(),
        "turns": len(ok),
        "failed": int(samples["error"].notna().sum()),
        "new_tokens": int(ok["new_tokens"].sum()),
        "tau": ok["committed"].sum() / ok["forwards"].sum() if ok["forwards"].sum() else float("nan"),
        "tok_s": ok["new_tokens"].sum() / wall if wall else float("nan"),
        "prefill_s": ok["prefill_s"].sum(),
        "decode_s": ok["decode_s"].sum(),
        "peak_mem_mb": ok["peak_mem_mb"].max(),
        "match_rate": audited.astype(float).mean() if len(audited) else float("nan"),
    }


def print_summary(run_path: Path) -> None:
    path = run_path / "samples.parquet"
    if not path.exists():
        return
    s = run_summary(pd.read_parquet(path))
    runs = pd.read_parquet(run_path / "runs.parquet").iloc[0]
    print(
        f"\n{runs['decoder']} + kv={runs['kv']} on {runs['task']}  ({runs['model']}, {runs['dtype']}, "
        f"{runs['device_name']})"
    )
    table = pd.DataFrame(
        [
            {
                "samples": s["samples"],
                "turns": s["turns"],
                "failed": s["failed"],
                "new tokens": s["new_tokens"],
                "tau": round(s["tau"], 3),
                "tok/s": round(s["tok_s"], 2),
                "prefill s": round(s["prefill_s"], 2),
                "decode s": round(s["decode_s"], 2),
                "peak mem MB": round(s["peak_mem_mb"], 1),
                "matches vanilla": round(s["match_rate"], 3),
            }
        ]
    )
    print(table.to_string(index=False))
    print(f"records: {run_path}/{{runs,samples,steps,scores}}.parquet")
