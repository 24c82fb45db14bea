"""Sections of the paper report that are not a paper's table: the cost model's predicted vs measured
speedups, blocks sized by cost, and LongSpec Figure 4 from its training logs."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from analysis import cost_model as cm
from analysis import longspec_figure4 as longspec_fig4
from analysis.metrics import SETUP, AnalysisError, summarize, version_counts, with_env
from analysis.report_parts import Provenance, code_text, markdown, prose, run_rows, setups


def cost_section(
    root: Path,
    bench: Path | None = None,
    names: dict[str, str] | None = None,
    samples: pd.DataFrame | None = None,
) -> list[str]:
    """Predicted vs measured decode speedup of every run measured where a cost curve was committed
    (`python -m benchmarks.block_cost`), the roofline GPUs' predictions, and the roofline against
    the papers' own pairs. `names`: run id -> setup name, for a column naming each run's setup."""
    parts = ["## Cost model: predicted vs measured speedup", ""]
    curves = cm.committed_curves(cm.BENCH if bench is None else bench)
    table = cm.run_predictions(root, curves) if curves else pd.DataFrame()
    if len(table):
        table = table[table["predicted_here"].notna()]
    if table.empty:
        parts += [
            "No cost curve of these records' environment is committed: `python -m benchmarks.block_cost`.",
            "",
        ]
    else:
        measured = table[table["measured"].notna() & table["pred_over_measured"].notna()]
        within = int(((measured["pred_over_measured"] - 1).abs() <= 0.15).sum())
        unmeasured = len(table) - len(measured)
        count = f"{within} of {len(measured)} runs with a measured speedup within +-15%" + (
            f" ({unmeasured} without one: no paired vanilla run)" if unmeasured else ""
        )
        if names:
            table.insert(1, "setup", [f"`{names.get(str(r), '?')}`" for r in table["run_id"]])
        parts += [
            prose(
                "predicted_here = vanilla's 1-row steps / the run's own forwards, both priced on the cost "
                "curve measured on the runs' device (`benchmarks.block_cost`); measured = paired decode "
                "speedup. A ratio pred/measured far from 1 is time spent outside forwards (decoder "
                f"bookkeeping). {count}. roofline_* = the "
                "same blocks priced on A100/H100/H200 rooflines (`analysis.cost_model`)."
            ),
            "",
            markdown(table.sort_values(["experiment", "decoder", "kv", "run_id"]).reset_index(drop=True)),
            "",
        ]
    ratio, where = cm.eager_step_ratio(samples) if samples is not None else (float("nan"), "")
    eager = None if ratio != ratio else ratio  # NaN: no GPU record ran vanilla both ways
    pairs = cm.check_pairs(cm.GPUS["A100-80GB"], cm.SHAPES["llama-2-7b"], eager_ratio=eager)
    if len(pairs):
        big = pairs.loc[pairs["rows"].idxmax()]
        against = (
            f" and against an eager-like vanilla whose one-row step costs {ratio:.1f}x a graphed one, as "
            f"measured here ({where}): every step then pays the same host cost, so a {big['rows']}-row block "
            f"costs {big.get('cost_ratio_eager', 0):.2f} one-row steps, not {big['cost_ratio']:.2f} "
            "(cost_ratio_eager, predicted_eager)"
            if eager
            else " (no GPU record ran vanilla both eager and graphed: no eager-like pricing)"
        )
        parts += [
            prose(
                "Roofline check on the papers' own pairs (FAFO Table 2, Llama-2-7b fp16 on an A100): "
                "predicted "
                "= paper tau / the block's cost in one-row steps, against a bandwidth-bound vanilla "
                f"(cost_ratio, predicted){against}. Which baseline each speedup is against: ours on a CPU, "
                "eager vanilla (no graphs); ours on a GPU, the vanilla of the same setup (`cuda_graphs` in "
                "its name); FAFO's paper does not say how its vanilla runs; TriForce's speedups are over "
                "Hugging Face with CUDA graphs (TriForce, Section 1)."
            ),
            "",
            markdown(pairs),
            "",
        ]
        if eager:
            parts += [prose(_pair_errors(pairs)), ""]
    return parts


def _pair_errors(pairs: pd.DataFrame) -> str:
    """The roofline's error on the papers' pairs per method, against each baseline, in one sentence."""
    parts = []
    for method, rows in pairs.groupby("method", sort=True):
        bw, eager = rows["error_pct"], rows["error_pct_eager"]
        parts.append(
            f"{method} {bw.min():+.0f}% to {bw.max():+.0f}% against the bandwidth-bound vanilla, "
            f"{eager.min():+.0f}% to {eager.max():+.0f}% against the eager-like one"
        )
    many = pairs[pairs["cost_ratio"] > 1.5]  # blocks the bandwidth-bound pricing finds dear
    closer = len(many) and many["error_pct_eager"].abs().mean() < many["error_pct"].abs().mean()
    verdict = (
        " For the many-row blocks the eager-like baseline is the closer one: the papers' speedups fit a "
        "vanilla whose step costs several times its bandwidth limit."
        if closer
        else " Neither baseline fits the many-row blocks better."
    )
    return "Error of the prediction against the paper's speedup: " + "; ".join(parts) + "." + verdict


def block_auto_section(samples: pd.DataFrame, made: list[Provenance] | None = None) -> list[str]:
    """Ours, not a paper's: decoders with blocks sized by cost (experiment=block_auto) beside their
    fixed-size counterparts and vanilla (experiment=fafo_baselines), paired per environment. Its runs'
    provenance is added to `made`."""
    parts = ["## Blocks sized by cost (ours, not a paper's table)", ""]
    exp = samples.get("experiment", pd.Series("", index=samples.index)).fillna("")
    if not (exp == "block_auto").any():
        return parts + ["No runs yet: `python run.py -m experiment=block_auto scale=cpu`.", ""]
    sub = with_env(samples[exp.isin(["fafo_baselines", "block_auto"])])
    auto_setups = set(map(tuple, sub.loc[exp == "block_auto", SETUP].drop_duplicates().to_numpy()))
    sub = sub[[tuple(r) in auto_setups for r in sub[SETUP].to_numpy()]]  # baselines of other setups: out
    table = summarize(sub)
    table = table[table["task"].isin(sorted(set(sub.loc[exp == "block_auto", "task"])))]
    if not table.duplicated(["task", "decoder", "kv"]).any():  # the run's decoder and kv name it
        table = table.assign(method=table["decoder"] + "+" + table["kv"])
    cols = ["task", "method", "samples", "tau", "decode_speedup", "speedup", "speedup_lo", "speedup_hi"]
    names = [s.name for s in setups(sub)]
    runs = run_rows(sub, sorted(table["run_id"].astype(str)))
    if made is not None:
        made.append(Provenance("Blocks sized by cost", ", ".join(names), runs))
    shown = ", ".join(f"`{n}`" for n in names)
    parts += [
        f"**Blocks sized by cost** · setup {shown} · {code_text(version_counts(runs))}",
        "",
        prose(
            "`decoder=pld_auto|lookahead_auto|fafo_auto` size each block from the cost curve of the run's "
            "environment and the acceptance seen so far (`decoders/block_size.py`); the fixed rows are the "
            "README/paper settings. Speedups are paired with the vanilla run of the same environment. The "
            "auto and fixed runs may come from different sessions, and speed ratios of a shared CPU jitter "
            "by 10-30% between them: `benchmarks.bench_block_auto` repeats every method interleaved in one "
            "process (results/bench/)."
        ),
        "",
        markdown(table[cols].sort_values(["task", "method"]).reset_index(drop=True)),
        "",
    ]
    return parts


def longspec_figure4_section(stage: Path, folder: Path = longspec_fig4.FOLDER) -> list[str]:
    """LongSpec Figure 4 from its two training runs (`make longspec-figure4`), not from run records."""
    parts = ["### LongSpec Figure 4", ""]
    png = stage / "figures" / "longspec_figure4.png"
    try:
        table = longspec_fig4.figure4(folder, png)
    except AnalysisError as exc:
        return parts + [f"Not made from these runs: {exc}", ""]
    if table.empty:
        return parts + ["No runs yet: `make longspec-figure4`.", ""]
    rel = png.relative_to(stage).as_posix()
    caption = f"**{table.attrs['title']}**"
    figure = f"![LongSpec Figure 4]({rel})"
    return parts + [prose(table.attrs["notes"]), "", caption, "", markdown(table), "", figure, ""]
