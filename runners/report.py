"""The end-of-run table printed to the terminal, and what it must not let a reader miss: failed
samples, a KV policy that restricted nothing, and how the run compares with vanilla."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from analysis import display
from analysis.metrics import (
    TIE_GAP,
    AnalysisError,
    divergences_at_ties,
    forward_share,
    paired_speedup,
    reference_run,
)


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
    share = forward_share(ok)
    if not math.isnan(share):  # the records time the forwards
        out["forward_share"] = share
    if "restricted_frac" in ok.columns and forwards:
        weights = ok["forwards"].astype(float)
        out["restricted_frac"] = float((ok["restricted_frac"] * weights).sum() / weights.sum())
        out["visible_frac"] = float((ok["visible_frac"] * weights).sum() / weights.sum())
    return {k: float(v) if not isinstance(v, str) else v for k, v in out.items()}


def kv_note(runs: pd.Series, samples: pd.DataFrame, summary: dict[str, float]) -> str | None:
    """One line when a KV policy restricted nothing (the run then equals kv=full; for a lossless
    decoder such as FAFO, its kv=full variant)."""
    if runs.get("kv") == "full" or "restricted_frac" not in summary:
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


def divergence_note(runs: pd.Series, samples: pd.DataFrame) -> str | None:
    """One line when audited turns diverged from vanilla: how many at a numerical tie (vanilla's top-2
    logit gap within the dtype's rounding, `analysis.metrics.TIE_GAP`) and how many beyond it."""
    ok = samples[samples["error"].isna()]
    dtype = str(runs.get("dtype"))
    diverged, ties = divergences_at_ties(ok, dtype)
    if not diverged:
        return None
    tol = TIE_GAP.get(dtype)
    if tol is None:
        return f"note: {diverged} turn(s) diverge from vanilla; no tie tolerance is known for {dtype}"
    line = (
        f"note: {diverged} turn(s) diverge from vanilla, {ties} of them first where vanilla's top-2 logits "
        f"are within {dtype} rounding (gap <= {tol:g}: a numerical tie, not a decoding error)"
    )
    if ties < diverged:
        beyond = diverged - ties
        if not bool(runs.get("lossless", True)):
            line += f"; {beyond} beyond it, as a lossy decoder or KV policy may"
        elif dtype == "float32":
            line += f"; {beyond} beyond it, unexpected of a lossless run (samples.parquet: first_divergence)"
        else:
            line += f"; {beyond} beyond it: compare in float32 (samples.parquet: divergence_gap)"
    return line


def capture_note(samples: pd.DataFrame) -> str | None:
    """One line when CUDA graphs were captured inside timed decodes: those turns' decode time holds the
    captures (a block size the warm-up did not meet)."""
    if "graph_captures" not in samples.columns:
        return None
    captures = samples.loc[samples["error"].isna(), "graph_captures"].dropna()
    if not (captures > 0).any():
        return None
    return (
        f"note: {int(captures.sum())} CUDA graph capture(s) fell inside the timed decode of "
        f"{int((captures > 0).sum())} turn(s) (samples.parquet: graph_captures), whose decode time holds "
        "them; a longer run.warmup_s meets more block sizes before timing"
    )


CPU_BLOCK_HINT = 64  # rows per forward above which a CPU pays for a block row by row


def comparison_lines(run_path: Path, runs: pd.Series, samples: pd.DataFrame) -> list[str]:
    """Speedup vs the vanilla kv=full run of the same environment when one exists (the one pairing
    rule of analysis.metrics), else how to get one; and a hint when the blocks are CPU-expensive."""
    lines = []
    if not (runs["decoder"] == "vanilla" and runs["kv"] == "full"):
        try:
            ref = reference_run(run_path.parent.parent, str(runs["run_id"]))
        except AnalysisError as exc:
            ref, lines = None, [f"note: no comparison with vanilla: {exc}"]
        ok = samples[samples["error"].isna()]
        if ref is not None:
            base = pd.read_parquet(ref / "samples.parquet")
            sp = paired_speedup(ok, base[base["error"].isna()])
            if sp["note"]:
                lines.append(f"vs vanilla ({ref.name}): {sp['note']}")
            else:
                lines.append(
                    f"vs vanilla ({ref.name}, same environment, {sp['paired_turns']} turns): speedup "
                    f"{sp['speedup']:.2f}x wall [{sp['speedup_lo']:.2f}-{sp['speedup_hi']:.2f}], "
                    f"{sp['decode_speedup']:.2f}x decode"
                )
        elif not lines:
            lines.append(
                "no vanilla kv=full run of this environment yet: the same command with decoder=vanilla "
                "kv=full gives one, and this table then shows the speedup"
            )
    steps_path = run_path / "steps.parquet"
    if str(runs.get("device_name", "")).startswith("cpu") and steps_path.exists():
        steps = pd.read_parquet(steps_path, columns=["block_tokens"])
        block = float(steps["block_tokens"].mean()) if len(steps) else 0.0
        if block > CPU_BLOCK_HINT:
            lines.append(
                f"note: {runs['decoder']} runs blocks of ~{block:.0f} rows per forward (the paper's GPU "
                "setting); on a CPU every row costs compute (python -m benchmarks.bench_block_cost), so it "
                "is slower than vanilla here: CPU-sized presets exist (e.g. decoder=fafo_cpu)"
            )
    return lines


def table_lines(runs: pd.Series, samples: pd.DataFrame, s: dict[str, float]) -> list[str]:
    """The run's one-row table, at most `display.WIDTH` columns wide (columns that do not fit continue
    below), and the legend that names the method's parameters."""
    ok = samples[samples["error"].isna()]
    lay = display.layout(pd.DataFrame([{**runs.to_dict(), **display.flat_params(runs)}]))
    row = {
        "method": lay.labels[0],
        "samples": str(int(s["samples"])),
        "turns": str(int(s["turns"])),
        "failed": str(int(s["failed"])),
        "new tokens": str(int(s["new_tokens"])),
        "tau": display.num(s["tau"], "{:.3f}"),
        "tok/s": display.num(s["tok_s"]),
        "prefill s": display.num(s["prefill_s"]),
        "decode s": display.num(s["decode_s"]),
        **({"in forwards": f"{s['forward_share']:.0%}"} if "forward_share" in s else {}),
        "peak MB": display.num(s["peak_mem_mb"], "{:.1f}"),
        display.EXACT_HEADER: display.exactness_text(display.exactness(ok, str(runs.get("dtype")))),
    }
    if "restricted_frac" in s and runs.get("kv") != "full":
        row["kv restricted"] = f"{s['restricted_frac']:.0%}"
        row["kv visible"] = f"{s['visible_frac']:.0%}"
    counters = display.counters(ok)
    row.update(display.counter_cells(counters, counters))
    return [*display.render(pd.DataFrame([row])), *display.legend_lines(lay.legend)]


def print_summary(run_path: Path) -> None:
    """The end-of-run report: what ran, its table, what a reader must not miss, the comparison with
    vanilla; every line at most `display.WIDTH` columns (a long one wraps)."""
    path = run_path / "samples.parquet"
    if not path.exists():
        return
    samples = pd.read_parquet(path)
    s = run_summary(samples)
    runs = pd.read_parquet(run_path / "runs.parquet").iloc[0]
    lines = [
        "",
        *display.wrap(
            f"{runs['decoder']} + kv={runs['kv']} on {runs['task']}  ({runs['model']}, {runs['dtype']}, "
            f"{runs['device_name']})"
        ),
        *table_lines(runs, samples, s),
    ]
    if s["failed"]:
        lines.append(f"FAILED: {int(s['failed'])} sample(s) have errors (column `error` of samples.parquet)")
    notes = [
        kv_note(runs, samples, s),
        divergence_note(runs, samples),
        capture_note(samples),
        *comparison_lines(run_path, runs, samples),
    ]
    for note in notes:
        if note:
            lines += display.wrap(note)
    lines += display.wrap(f"records: {shown_path(run_path)}/{{runs,samples,steps,scores}}.parquet")
    print("\n".join(lines))


def shown_path(path: Path) -> str:
    """`path` relative to the working directory when inside it (shorter, and no machine path)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)
