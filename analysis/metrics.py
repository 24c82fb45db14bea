"""Speedup vs vanilla (ratio of totals with a bootstrap interval), tau, quality next to speed, and the
rules that keep comparisons honest.

A method is compared only with the `decoder=vanilla kv=full` run of the SAME environment (`ENV`:
model, dtype, linear, device name, threads, prefill_chunk, task and its parameters and version,
max_new_tokens, seed, sampling, sample set), paired on (sample_id, turn). A missing environment field
(records older than the field) is the value "unknown": it never pairs with a known value. Anything
that would pool or pair runs of different environments is refused with an `AnalysisError` naming
the runs, never averaged:
- two distinct vanilla+full runs in one environment (which one is the baseline?);
- a table cell holding more than one run (`check_one_run`);
- a method whose (sample, turn) set the baseline does not cover (its speedup is left empty and the
  row says why).
Speedup = sum of vanilla wall time / sum of method wall time over the paired turns; the interval
resamples samples (all turns of a sample together). One function (`paired_speedup`) serves the
summary, the paper tables and the end-of-run report.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from analysis.load import load_runs
from runners.records import RunDir

# what a table may hold fixed across its cells (the hardware, the model, the numerics)
SETUP = [
    "model",
    "model_name",
    "dtype",
    "linear",
    "cuda_graphs",  # one-row decode steps replayed as a CUDA graph (run.cuda_graphs)
    "device_name",
    "threads",
    "prefill_chunk",
    "seed",
    "sampling",
    "scale",  # paper | cpu (conf/scale/): a CPU-sized slice is never compared with the paper protocol
]
# what a method and its baseline must share
ENV = [*SETUP, "task", "task_params", "task_version", "max_new_tokens", "sample_set"]
UNKNOWN = "unknown"


class AnalysisError(Exception):
    """A comparison the analysis refuses to make (the CLIs print it as one `error:` line)."""


def with_env(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with every ENV column present, as strings ("unknown" where a record lacks the field)."""
    df = df.copy()
    for col in ENV:
        if col not in df.columns:
            df[col] = UNKNOWN
        df[col] = df[col].astype(object).where(df[col].notna(), UNKNOWN).map(_as_text)
    return df


def _as_text(v: object) -> str:
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def temperature(samples: pd.DataFrame) -> pd.Series:
    """Each row's sampling temperature, read from its recorded `sampling` (0 = greedy: records without
    the field, or with it unknown, were made before sampling was recorded, all greedy)."""
    if "sampling" not in samples.columns:
        return pd.Series(0.0, index=samples.index)
    return samples["sampling"].map(_temperature)


def _temperature(sampling: object) -> float:
    if not isinstance(sampling, str) or not sampling.startswith("{"):
        return 0.0
    return float(json.loads(sampling).get("temperature", 0.0))


def is_baseline(df: pd.DataFrame) -> pd.Series:
    return (df["decoder"] == "vanilla") & (df["kv"] == "full")


def baseline_of(group: pd.DataFrame, run: pd.DataFrame | None = None) -> pd.DataFrame | None:
    """The vanilla+full samples of one environment's rows; refuses when two runs qualify. Given the
    `run` it is for, an experiment that ran its own vanilla run in this environment is paired with that
    one (timed minutes apart on the same box), not with another experiment's."""
    base = group[is_baseline(group)]
    if base.empty:
        return None
    if run is not None and len(run) and "experiment" in base.columns and "experiment" in run.columns:
        own = base[base["experiment"].astype(str) == str(run["experiment"].iloc[0])]
        base = own if len(own) else base
    if "run_id" in base.columns and base["run_id"].nunique() > 1:
        ids = ", ".join(sorted(base["run_id"].astype(str).unique()))
        raise AnalysisError(f"two vanilla kv=full runs share one environment ({ids}); remove one of them")
    return base


def paired_speedup(method: pd.DataFrame, base: pd.DataFrame | None) -> dict[str, object]:
    """Speedup of `method` over `base` on their (sample_id, turn) pairs. Empty (NaN) with a `note`
    when there is no baseline or the baseline does not cover every turn of the method."""
    out: dict[str, object] = {
        "speedup": float("nan"),
        "speedup_lo": float("nan"),
        "speedup_hi": float("nan"),
        "decode_speedup": float("nan"),
        "paired_turns": 0,
        "note": "",
    }
    if base is None or base.empty:
        out["note"] = "no vanilla kv=full run of this environment"
        return out
    key = ["sample_id", "turn"]
    m = method.set_index(key)[["wall_s", "decode_s"]]
    b = base.drop_duplicates(key, keep="last").set_index(key)[["wall_s", "decode_s"]]
    paired = m.merge(b, left_index=True, right_index=True, how="inner", suffixes=("", "_base"))
    out["paired_turns"] = len(paired)
    missing = len(m) - len(paired)
    if missing:
        out["note"] = f"baseline lacks {missing} of the method's {len(m)} turns: no speedup"
        return out
    out["speedup"] = paired["wall_s_base"].sum() / paired["wall_s"].sum()
    out["speedup_lo"], out["speedup_hi"] = bootstrap_ratio(
        paired["wall_s_base"], paired["wall_s"], paired.index.get_level_values(0).to_series()
    )
    out["decode_speedup"] = paired["decode_s_base"].sum() / paired["decode_s"].sum()
    return out


def kv_bound_speedup(run: pd.DataFrame, base: pd.DataFrame | None) -> float:
    """Speedup if every forward cost its KV reads: vanilla's KV MB read per committed token over the
    method's (`kv_read_mb` counts the target's draft, middle and verification forwards)."""
    if base is None or base.empty or "kv_read_mb" not in run.columns:
        return float("nan")
    key = ["sample_id", "turn"]
    b = base.drop_duplicates(key, keep="last").set_index(key)
    m = run.set_index(key)
    common = m.index.intersection(b.index)
    if len(common) < len(m):
        return float("nan")
    num = float(b.loc[common, "kv_read_mb"].sum()) * float(m.loc[common, "new_tokens"].sum())
    den = float(m.loc[common, "kv_read_mb"].sum()) * float(b.loc[common, "new_tokens"].sum())
    return num / den if den > 0 else float("nan")


def kv_activity(run: pd.DataFrame) -> str:
    """How much a run's KV policy restricted attention, in words (a lossy policy that restricted
    nothing is said to be inactive: its numbers are the full cache's)."""
    if (run["kv"] == "full").all():
        return "-"
    if "restricted_frac" not in run.columns or run["restricted_frac"].isna().all():
        return UNKNOWN
    w = run["forwards"].astype(float).fillna(0.0)
    frac = float((run["restricted_frac"].astype(float) * w).sum() / w.sum()) if w.sum() else 0.0
    if frac == 0.0:
        return "inactive (restricted 0% of forwards)"
    return f"restricted {frac:.0%} of forwards"


def ours_setup(df: pd.DataFrame, threads: bool = False) -> str:
    """A caption's "ours" setup: model (dtype) on device[, threads unless the device name gives them]
    from the frame's first row, and every code version its runs were made with (`code_versions`)."""
    first = df.iloc[0] if len(df) else {}
    named = "threads" in str(first.get("device_name", ""))  # a CPU's device name already says them
    threads_text = f"{first.get('threads', '?')} threads, " if threads and not named else ""
    return (
        f"{first.get('model', '?')} ({first.get('dtype', '?')}) on {first.get('device_name', '?')}, "
        f"{threads_text}{code_versions(df)}"
    )


def version_counts(df: pd.DataFrame) -> dict[str, int]:
    """Runs per code version of the frame's runs, most runs first (ties by version, so the order does
    not depend on the order the records were read in)."""
    if "git_sha" not in df.columns or not len(df):
        return {}
    shas = df.assign(_sha=df["git_sha"].astype(str))
    runs = shas.groupby("_sha")
    counts = runs["run_id"].nunique() if "run_id" in df.columns else runs.size()
    return dict(sorted(((str(k), int(v)) for k, v in counts.items()), key=lambda kv: (-kv[1], kv[0])))


def is_dirty(version: str) -> bool:
    """A version made from uncommitted code (`runners.provenance.git_sha`'s `-dirty` suffix)."""
    return "-dirty" in version


def code_versions(df: pd.DataFrame) -> str:
    """ "code <sha>" when every run of the frame has one code version; otherwise each version (its sha's
    first 10 digits and any `-dirty-<digest>` suffix) with its number of runs, most runs first."""
    counts = version_counts(df)
    if not counts:
        return "code ?"
    if len(counts) == 1:
        return f"code {next(iter(counts))}"
    parts = [f"{sha[:10]}{sha[40:]} ({n} run{'s' if n != 1 else ''})" for sha, n in counts.items()]
    return "code versions " + ", ".join(parts)


# How each preset of conf/scale/ departs from the paper's protocol (named in every caption).
SCALE_DIFFERENCES = {
    "cpu": "fewer samples and tokens, KV budgets as a fraction of each context",
    "paper_slice8": "the paper's settings on 8 of the task's samples",
    "cpu_experiment": "the CPU-sized setting of the experiment file (conf/experiment/*_cpu.yaml)",
}


def scale_text(scale: str) -> str:
    """Where a scale preset's setting is defined and how it departs from the paper's protocol."""
    if scale in ("paper", UNKNOWN):
        return "the paper's protocol"
    source = "conf/experiment" if scale == "cpu_experiment" else f"conf/scale/{scale}.yaml"
    return f"NOT the paper's setting ({source}: {SCALE_DIFFERENCES.get(scale, 'see that file')})"


def _ints(values: pd.Series) -> str:
    """`8` or `4-12`: the range of a per-run count."""
    lo, hi = int(values.min()), int(values.max())
    return str(lo) if lo == hi else f"{lo}-{hi}"


def what_ran(samples: pd.DataFrame) -> dict[str, object]:
    """What the runs of `samples` actually ran, read from the records, not from a preset's name: samples
    per run, new tokens per turn (`max_new_tokens`) against the task's own (`task.max_new_tokens`),
    KV budgets absolute or a fraction of each context, and whether that is the paper's protocol (every
    sample, the task's token count, absolute budgets)."""
    if samples.empty or "sample_id" not in samples.columns:
        return {"text": "no runs", "protocol": False}
    by = samples.groupby("run_id") if "run_id" in samples.columns else samples.groupby(lambda _: 0)
    n = by["sample_id"].nunique()
    tokens = pd.to_numeric(samples.get("max_new_tokens", pd.Series(dtype=float)), errors="coerce")
    task_tokens = pd.to_numeric(samples.get("task.max_new_tokens", pd.Series(dtype=float)), errors="coerce")
    limited = pd.to_numeric(samples.get("limit", pd.Series(dtype=float)), errors="coerce").notna().any()
    cut = bool(tokens.notna().any() and task_tokens.notna().any() and (tokens < task_tokens).any())
    frac = samples.get("kv.budget_frac", pd.Series(dtype=float))
    by_frac = bool(pd.to_numeric(frac, errors="coerce").notna().any())
    parts = [f"{_ints(n)} samples/run"]
    if tokens.notna().any():
        parts.append(
            f"{_ints(tokens.dropna())} new tokens"
            + (f" (task: {_ints(task_tokens.dropna())})" if cut else "")
        )
    if by_frac:
        parts.append("budgets a fraction of each context")
    return {"text": ", ".join(parts), "protocol": not (limited or cut or by_frac)}


def scale_name(scale: str, samples: pd.DataFrame) -> str:
    """A setup's scale as its name says it: the preset's name, unless the preset is the paper's protocol
    and the runs were not (fewer samples, fewer tokens): then what ran, `<n>samples-<t>tok`."""
    if scale not in ("paper", UNKNOWN) or samples.empty:
        return scale
    ran = what_ran(samples)
    if ran["protocol"]:
        return scale
    n = _ints(samples.groupby("run_id")["sample_id"].nunique()) if "run_id" in samples.columns else "?"
    tokens = pd.to_numeric(samples.get("max_new_tokens", pd.Series(dtype=float)), errors="coerce").dropna()
    return f"{n}samples-{_ints(tokens) if len(tokens) else '?'}tok"


def scale_label(samples: pd.DataFrame) -> str:
    """Empty for the paper's protocol, else a sentence naming the preset (conf/scale/<name>.yaml), or,
    for runs the paper preset labels that did not run the protocol, what they ran."""
    scales = sorted({str(v) for v in samples["scale"].dropna()}) if "scale" in samples.columns else []
    other = [s for s in scales if s not in ("paper", UNKNOWN)]
    if not other:
        ran = what_ran(samples) if "sample_id" in samples.columns else {"protocol": True}
        return "" if ran["protocol"] else f"NOT the paper's protocol: {ran['text']}. "
    what = "; ".join(
        f"{'conf/experiment' if s == 'cpu_experiment' else f'conf/scale/{s}.yaml'}: "
        f"{SCALE_DIFFERENCES.get(s, 'see that file')}"
        for s in other
    )
    return f"scale={', '.join(other)}: NOT the paper's setting ({what}). "


def set_caption(
    table: pd.DataFrame,
    runs: pd.DataFrame,
    title: str,
    *,
    ours: str = "",
    paper: str = "",
    notes: str = "",
    threads: bool = False,
) -> pd.DataFrame:
    """Caption `table` in two forms. `attrs["caption"]`: one paragraph for the per-paper CLIs (the
    title, our setup and code versions, `ours`, the paper's setting, `notes`). The parts, for the paper
    report, which names the setup once in a legend: `title`, `ours` (what this setup's runs add: a
    draft, parameters held fixed), `paper`, `notes` (what the columns mean, setup-independent) and
    `run_ids` (the runs the table shows, with their baselines, whose code versions it states)."""
    ids = sorted(runs["run_id"].astype(str).unique()) if "run_id" in runs.columns else []
    table.attrs.update(title=title, ours=ours, paper=paper, notes=notes, run_ids=ids)
    extra = f", {ours}" if ours else ""
    paper_text = f" Paper: {paper}." if paper else ""
    table.attrs["caption"] = (
        f"{title}. {scale_label(runs)}Ours: {ours_setup(runs, threads=threads)}{extra}.{paper_text}"
        f"{f' {notes}' if notes else ''}"
    )
    return table


def save_png(fig: object, path: Path | str, dpi: int = 120) -> None:
    """`fig.savefig` as a PNG without matplotlib's `Software` stamp, so the same data and the same
    matplotlib give the same bytes (a rebuilt report leaves an unchanged figure unchanged)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=dpi, format="png", metadata={"Software": None})  # type: ignore[attr-defined]


def check_one_run(cell: pd.DataFrame, label: str, rows_are_runs: bool = False) -> None:
    """Refuse a table cell that holds more than one run (it would pool configurations or tasks). Every
    table calls it on each cell: on per-sample rows (runs told apart by `run_id`), or, with
    `rows_are_runs`, on aggregated rows of one run each."""
    if rows_are_runs:
        if len(cell) <= 1:
            return
        ids = [str(r) or "?" for r in cell.get("run_id", pd.Series(["?"] * len(cell)))]
    elif "run_id" not in cell.columns or cell["run_id"].nunique() <= 1:
        return
    else:
        ids = sorted(cell["run_id"].astype(str).unique())
    params = [
        c
        for c in cell.columns
        if c.startswith(("decoder.", "kv.", "draft.", "task"))
        and cell[c].astype(str).nunique(dropna=False) > 1
    ]
    differ = f" (they differ in {', '.join(params)})" if params else ""
    raise AnalysisError(
        f"cell {label} would pool {len(ids)} runs: {', '.join(ids)}{differ}; hold the differing "
        "parameter fixed or remove a run"
    )


def method_label(row: pd.Series) -> str:
    def fmt(v: object) -> str:
        return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)

    def shown(prefix: str) -> str:
        keys = sorted(k for k in row.index if k.startswith(prefix) and pd.notna(row[k]) and row[k] != "None")
        return ",".join(f"{k.split('.', 1)[1]}={fmt(row[k])}" for k in keys)

    dec, kv = shown("decoder."), shown("kv.")
    label = f"{row['decoder']}{f'[{dec}]' if dec else ''}+{row['kv']}{f'[{kv}]' if kv else ''}"
    draft = row.get("draft")
    if isinstance(draft, str) and draft not in ("", "none"):
        keys = ("layers", "name", "budget")
        shown_draft = ",".join(
            f"{k}={fmt(row[f'draft.{k}'])}" for k in keys if pd.notna(row.get(f"draft.{k}"))
        )
        label += f"+draft={draft}[{shown_draft}]" if shown_draft else f"+draft={draft}"
    return label


def bootstrap_ratio(
    num: pd.Series, den: pd.Series, groups: pd.Series, n: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """95% interval of sum(num)/sum(den) resampling `groups` (sample ids) with replacement."""
    frame = {"num": num.astype(float).to_numpy(), "den": den.astype(float).to_numpy(), "g": groups.to_numpy()}
    by = pd.DataFrame(frame).groupby("g").sum()
    if len(by) < 2:
        r = by["num"].sum() / by["den"].sum()
        return r, r
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(by), size=(n, len(by)))
    ratios = by["num"].values[idx].sum(1) / by["den"].values[idx].sum(1)
    return float(np.percentile(ratios, 2.5)), float(np.percentile(ratios, 97.5))


def forward_share(run: pd.DataFrame) -> float:
    """The share of decode time spent inside the target's forwards (`forward_s`); the rest is the
    decoder's own work between them. NaN for records made before `forward_s` was recorded."""
    if "forward_s" not in run.columns:
        return float("nan")
    timed = run[run["forward_s"].notna()]
    decode = timed["decode_s"].sum()
    return float(timed["forward_s"].sum() / decode) if len(timed) and decode > 0 else float("nan")


def summarize(samples: pd.DataFrame, scores: pd.DataFrame | None = None) -> pd.DataFrame:
    """One row per run: tau, tok/s, KV activity, speedup vs the vanilla run of its environment."""
    ok = with_env(samples[samples["error"].isna()])
    if "run_id" not in ok.columns:
        ok["run_id"] = ok["decoder"].astype(str) + "+" + ok["kv"].astype(str)
    out = []
    for env, group in ok.groupby(ENV, sort=True):
        for run_id, run in group.groupby("run_id"):
            base = baseline_of(group, run)
            first = run.iloc[0]
            row = dict(zip(ENV, env))
            fw = run["forwards"].sum()
            row.update(
                run_id=run_id,
                method=method_label(first),
                decoder=first["decoder"],
                kv=first["kv"],
                kv_activity=kv_activity(run),
                code_version=str(first.get("git_sha", UNKNOWN)),
                samples=run["sample_id"].nunique(),
                turns=len(run),
                new_tokens=int(run["new_tokens"].sum()),
                tau=run["committed"].sum() / fw if fw else float("nan"),
                tok_s=run["new_tokens"].sum() / run["wall_s"].sum(),
                forward_share=forward_share(run),
                peak_mem_mb=run["peak_mem_mb"].max(),
                match_rate=run["matches_vanilla"].dropna().astype(float).mean(),
                match_or_tie_rate=match_or_tie_rate(run, str(first.get("dtype"))),
                kv_mb_per_token=run["kv_read_mb"].sum() / run["new_tokens"].sum()
                if "kv_read_mb" in run.columns
                else float("nan"),
                kv_bound_speedup=kv_bound_speedup(run, base),
            )
            row.update(paired_speedup(run, base))
            out.append(row)
    table = pd.DataFrame(out)
    if scores is not None and len(scores) and len(table):
        means = scores.pivot_table(index="run_id", columns="metric", values="value", aggfunc="mean")
        table = table.merge(means.add_prefix("score."), left_on="run_id", right_index=True, how="left")
    return table


# Vanilla's top-2 logit gap at a first divergence within which the two runs differ only by rounding:
# fp32, the block-versus-row accumulation order (~1e-4 on logits ~1e1); bf16 and fp16, two units in
# the last place of a logit between 16 and 32 (the logits are rounded to the model's dtype, and a
# multi-row forward rounds differently from a 1-row one).
TIE_GAP = {"float32": 1e-4, "bfloat16": 0.25, "float16": 0.03}


def divergences_at_ties(samples: pd.DataFrame, dtype: str) -> tuple[int, int]:
    """(audited turns that diverged from vanilla, how many of them at a numerical tie for `dtype`)."""
    audited = samples[samples["matches_vanilla"].notna()]
    diverged = audited[~audited["matches_vanilla"].astype(bool)]
    tol = TIE_GAP.get(dtype)
    if tol is None or diverged.empty:
        return len(diverged), 0
    return len(diverged), int((diverged["divergence_gap"].astype(float) <= tol).sum())


def match_or_tie_rate(samples: pd.DataFrame, dtype: str) -> float:
    """Share of audited turns that equal vanilla's output or first differ at a numerical tie."""
    audited = int(samples["matches_vanilla"].notna().sum())
    diverged, ties = divergences_at_ties(samples, dtype)
    return (audited - diverged + ties) / audited if audited else float("nan")


def reference_run(root: Path | str, run_id: str) -> Path | None:
    """The complete vanilla+full run of the same environment as run `run_id` (None if there is none;
    an AnalysisError if two qualify)."""
    runs = load_runs(root, complete_only=False)
    if runs.empty or run_id not in set(runs["run_id"]):
        return None
    runs = with_env(runs)
    me = runs[runs["run_id"] == run_id].iloc[0]
    same = runs[(runs[ENV] == me[ENV]).all(axis=1) & is_baseline(runs)]
    same = same[[RunDir(Path(p).parent, Path(p).name).complete for p in same["path"]]]  # COMPLETE backed
    if len(same) > 1:
        raise AnalysisError(f"two vanilla kv=full runs share one environment ({', '.join(same['run_id'])})")
    return Path(same["path"].iloc[0]) if len(same) else None
