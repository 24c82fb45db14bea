"""`make paper`: the seed papers' tables and figures that the harness reproduces, rebuilt from committed
records into one report, ours beside the paper's numbers.

    python -m analysis.paper [--root results/paper/records] [--out results/paper]

Reads only records (`<root>/runs/*`: parquet, no model, no network) and writes `<out>/REPORT.md` plus its
figures (PNG). Every table comes from the functions the per-paper CLIs use (`analysis.fafo_paper`,
`analysis.triforce_paper`, `analysis.sfi_paper`, `analysis.longspec_paper`), so the pairing and refusal
rules are the same: a table made of runs from several setups, a cell pooling runs or two baselines in one
environment is not printed; the report says why. A table with no runs yet names the command that makes
them. Tables the harness cannot reproduce, and rows of a table that no run of ours fills, are listed
with the reason, never skipped in silence and never left as empty rows.

The report reads at a glance: a table of contents; each setup (model, dtype, device, threads, linear
backend, scale) named once in a legend by a short name (`cpu-epyc2-fp32@cpu`, `h200-bf16@paper_slice8`);
each table's caption on one line (that name, the code version of its runs, `-dirty` when they were made
from uncommitted code); a Code versions section per table. A rebuild from the same records writes the
same bytes: relative paths only, sorted output, PNGs without a software stamp, and an unchanged file is
not rewritten.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import textwrap
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis import fafo_paper as fafo
from analysis import longspec_figure4 as longspec_fig4
from analysis import longspec_paper as longspec
from analysis import sfi_paper as sfi
from analysis import triforce_paper as tri
from analysis.fafo_figure1 import figure1 as fafo_figure1
from analysis.fafo_orderings import orderings as fafo_orderings
from analysis.load import experiments, from_experiments
from analysis.metrics import (
    SETUP,
    UNKNOWN,
    AnalysisError,
    is_dirty,
    scale_text,
    summarize,
    version_counts,
    with_env,
)

REPO = Path(__file__).resolve().parents[1]
SCALE_NOTE = "Same protocol, other scale: compare shapes and orderings, not absolute numbers."

# a table from one setup's records; the Path is the folder where it may write its figures
TableFn = Callable[[pd.DataFrame, Path], pd.DataFrame]


def _fafo(fn: Callable[..., pd.DataFrame]) -> TableFn:
    """A FAFO table over the runs of the fafo_* experiments (and the vanilla baselines)."""
    return lambda s, _out: fn(from_experiments(s, experiments("fafo_")))


def _triforce_table1(s: pd.DataFrame, _out: Path) -> pd.DataFrame:
    t1 = from_experiments(s, ("triforce_table1_cpu", "triforce_table1_qwen_cpu"))
    return tri.table1(t1[t1["decoder"] == "selfspec"])


def _triforce_figure6(s: pd.DataFrame, figures: Path) -> pd.DataFrame:
    f6 = from_experiments(s, ("triforce_figure6a_cpu", "triforce_figure6b_cpu"))
    f6 = f6[(f6["task"] == "pg19") & (f6["kv"] == "retrieval") & (f6["decoder"] == "selfspec")]
    return tri.figure6(f6, figures / "triforce_figure6.png") if len(f6) else pd.DataFrame()


def _triforce_table8(s: pd.DataFrame, _out: Path) -> pd.DataFrame:
    t8 = from_experiments(s, ("triforce_table8a_cpu", "triforce_table8b_cpu"))
    t8 = t8[(t8["task"] == "pg19") & t8["decoder"].isin(["triforce", "vanilla"])]
    return tri.table8(t8) if (t8["decoder"] == "triforce").any() else pd.DataFrame()


def _sfi_table4(s: pd.DataFrame, _out: Path) -> pd.DataFrame:
    from analysis.load import load_runs, load_table

    t4 = from_experiments(s, experiments("sfi_table4"))
    t4 = t4[t4["task"].astype(str).str.startswith("longbench")]
    if not (t4["decoder"] == "sfi").any():
        return pd.DataFrame()
    root = Path(str(t4["path"].iloc[0])).parents[1]
    return sfi.table4(t4, load_table(root, "scores", load_runs(root)))


def _sfi_ablation(fn: Callable[..., pd.DataFrame], names: tuple[str, ...]) -> TableFn:
    def make(s: pd.DataFrame, _out: Path) -> pd.DataFrame:
        from analysis.load import load_runs, load_table

        runs = from_experiments(s, names)
        runs = runs[runs["decoder"] == "sfi"]
        if runs.empty:
            return pd.DataFrame()
        root = Path(str(runs["path"].iloc[0])).parents[1]
        return fn(runs, load_table(root, "scores", load_runs(root)))

    return make


def _sfi_figure4(s: pd.DataFrame, _out: Path) -> pd.DataFrame:
    f4 = from_experiments(s, experiments("sfi_figure4"))
    return sfi.figure4(f4) if ((f4["decoder"] == "sfi") & (f4["task"] == "pg19")).any() else pd.DataFrame()


def _fafo_figure1(s: pd.DataFrame, figures: Path) -> pd.DataFrame:
    return fafo_figure1(from_experiments(s, experiments("fafo_")), figures / "fafo_figure1.png")


# (paper, table, function, the command that makes its runs)
REPRODUCED: list[tuple[str, str, TableFn, str]] = [
    (
        "FAFO",
        "orderings",
        _fafo(fafo_orderings),
        "python run.py -m experiment=fafo_table2 (+ fafo_table11, fafo_table12, fafo_baselines)",
    ),
    ("FAFO", "Table 1", _fafo(fafo.table1), "python run.py -m experiment=fafo_table1 (+ fafo_baselines)"),
    (
        "FAFO",
        "Tables 2 and 8",
        _fafo(fafo.table2),
        "python run.py -m experiment=fafo_table2 (+ fafo_baselines)",
    ),
    (
        "FAFO",
        "Table 10",
        _fafo(fafo.table10),
        "python run.py -m experiment=fafo_table10 (+ fafo_table10_baselines, fafo_table10_triforce)",
    ),
    ("FAFO", "Table 11", _fafo(fafo.table11), "python run.py -m experiment=fafo_table11"),
    ("FAFO", "Table 12", _fafo(fafo.table12), "python run.py -m experiment=fafo_table12"),
    (
        "FAFO",
        "Table 13",
        _fafo(fafo.table13),
        "python run.py -m experiment=fafo_table13 (scale=cpu: experiment=fafo_table13_frac scale=cpu)",
    ),
    (
        "FAFO",
        "Figure 1",
        _fafo_figure1,
        "python run.py -m experiment=fafo_figure1 (+ fafo_figure1_lookahead)",
    ),
    (
        "TriForce",
        "Table 1",
        _triforce_table1,
        "python run.py -m experiment=triforce_table1_cpu (model=qwen25-coder-0.5b: triforce_table1_qwen_cpu)",
    ),
    (
        "TriForce",
        "Table 8",
        _triforce_table8,
        "python run.py -m experiment=triforce_table8a_cpu (and 8b_cpu; experiment=triforce_pg19_vanilla_cpu)",
    ),
    (
        "TriForce",
        "Figure 6",
        _triforce_figure6,
        "python run.py -m experiment=triforce_figure6a_cpu (and 6b_cpu)",
    ),
    (
        "SFI",
        "Table 4",
        _sfi_table4,
        "python run.py -m experiment=sfi_table4_dense_cpu "
        "(and sfi_table4_sfi_cpu, sfi_table4_kvpress_cpu, sfi_table4_chunkkv_cpu)",
    ),
    (
        "SFI",
        "Table 6",
        _sfi_ablation(sfi.table6, ("sfi_table6_cpu",)),
        "python run.py -m experiment=sfi_table6_cpu",
    ),
    (
        "SFI",
        "Table 7",
        _sfi_ablation(sfi.table7, ("sfi_table7a_cpu", "sfi_table7b_cpu")),
        "python run.py -m experiment=sfi_table7a_cpu (and sfi_table7b_cpu)",
    ),
    (
        "SFI",
        "Figure 4",
        _sfi_figure4,
        "python run.py -m experiment=sfi_figure4_dense_cpu && python run.py -m experiment=sfi_figure4_cpu",
    ),
    (
        "LongSpec",
        "Table 1",
        lambda s, _out: longspec.load_table1(s),
        "python run.py -m experiment=longspec_table1_cpu (and longspec_table1_magicdec_cpu)",
    ),
    (
        "LongSpec",
        "Table 2",
        lambda s, _out: longspec.load_table2(s),
        "python run.py -m experiment=longspec_table2_cpu (needs the no-anchor-offset ablation draft)",
    ),
    (
        "LongSpec",
        "Tau over prompts (ours, not a paper's table)",
        lambda s, _out: longspec.load_tau_over_prompts(s),
        "python run.py -m experiment=longspec_tau_prompts_cpu",
    ),
    (
        "LongSpec",
        "Tau over QA prompts (ours, not a paper's table)",
        lambda s, _out: longspec.load_tau_over_prompts(s, longspec.TAU_QA),
        "python run.py -m experiment=longspec_tau_qa_cpu",
    ),
    (
        "LongSpec",
        "Tau over summarisation prompts (ours, not a paper's table)",
        lambda s, _out: longspec.load_tau_over_prompts(s, longspec.TAU_SUMMARY),
        "python run.py -m experiment=longspec_tau_summary_cpu",
    ),
]

NOT_REPRODUCED: list[tuple[str, str, str]] = [
    ("FAFO", "Table 3", "LongBench subsets on Llama-3.1-8B: the hub datasets and model (offline "
     "stand-ins exist "
     "as task=longbench_ruler_*; no experiment file yet)"),
    ("FAFO", "Table 4", "sampling-mode speedups: no experiment file yet (decoders support sampling)"),
    ("FAFO", "Tables 5-7", "AIME24 / Multi-IF / SCBench on 7-8B models: no experiment files yet"),
    ("FAFO", "Table 9", "NarrativeQA needs the dataset hub (no offline stand-in); most paper cells "
     "were lost"),
    ("TriForce", "Tables 2-5, 7", "speedups of a 7B model at 122k-127k contexts on an A100 or offloaded to "
     "RTX 4090s, batching: a hardware regime (KV reads dominate every forward) a 2-core CPU and a 135M model "
     "cannot show; Table 8's kv_bound_speedup column and benchmarks/bench_selfspec give the predicted "
     "speedup in that regime from our counts"),
    ("TriForce", "Table 6", "LWM-Text 256K/512K: models far beyond the embedded model's 8k context"),
    ("SFI", "Tables 1-3, 5", "vLLM kernels and B200 throughput at 8k-128k contexts with Qwen3 models "
     "(Figure 4's trend is reproduced in shape above)"),
    ("LongSpec", "Tables 3-4, Figures 3, 5-7", "EAGLE baseline, latency breakdown, T=1 speedups, QwQ-32B on "
     "AIME24, batch sizes: GPU kernels, 7B-32B targets and their released drafts (decoder.checkpoint="
     "sail/longspec-* loads them for users with the hub)"),
]  # fmt: skip


# Why a row of a paper's table has no run of ours in any setup, where "no run yet" is not the reason
# (paper, method) -> reason; rows not named here say which command makes their runs.
ROW_REASONS: dict[tuple[str, str], str] = {
    ("FAFO", "SWIFT"): "no SWIFT decoder in the harness (its layer-skipping self-draft is not implemented)",
    ("FAFO", "TriForce"): "no FAFO experiment runs decoder=triforce on the short chat tasks; its PG-19 rows "
    "are in FAFO Table 10 and TriForce's own tables",
}
# the columns that name a table's row (the others hold numbers)
ROW_KEYS = ("method", "claim", "task", "decoder.k", "decoder.n", "kv.budget", "task.context_length")
# measure-free columns of ours: a row with only these is a row without a run
NOT_MEASURES = ("kv_activity", "note", "matches_vanilla", "approx")
DEFAULT_MODEL = "smollm2-135m"  # the embedded model: setup names leave it out
DTYPE_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
VENDOR_WORDS = {"amd", "intel", "intel(r)", "nvidia", "genuine", "cpu", "processor", "(r)", "(tm)"}


def markdown(table: pd.DataFrame) -> str:
    """A DataFrame as a GitHub markdown table (floats to 3 significant decimals, NaN as blank)."""

    def cell(v: object) -> str:
        if isinstance(v, float):
            return "" if pd.isna(v) else f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
        return "" if v is None else str(v).replace("|", "\\|")

    cols = [str(c) for c in table.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


# --- setups: named once, in the legend ------------------------------------------------------------
@dataclass(frozen=True)
class Setup:
    """The runs of one setup (`analysis.metrics.SETUP`), under the short name the legend defines."""

    name: str
    key: dict[str, str]
    samples: pd.DataFrame


def _hardware(key: dict[str, str]) -> str:
    """`cpu-<chip><threads>[-<ISA features>]` or the GPU's model: the device name without its vendor
    words (a CPU's name carries, in brackets, the ISA features the kernels branch on)."""
    device = key.get("device_name", UNKNOWN)
    is_cpu = device.startswith("cpu")
    features = "".join(re.sub(r"[^a-z0-9]", "", f.lower()) for f in re.findall(r"\[([^\]]*)\]", device))
    words = re.sub(r"\[[^\]]*\]", "", re.sub(r"^cpu:\s*", "", device)).split()
    chip = next((w for w in words if w.lower() not in VENDOR_WORDS and not re.fullmatch(r"x\d+", w)), "")
    chip = re.sub(r"[^a-z0-9.]", "", chip.lower()) or ("cpu" if is_cpu else "gpu")
    return f"cpu-{chip}{key.get('threads', '')}" + (f"-{features}" if features else "") if is_cpu else chip


def setup_name(key: dict[str, str]) -> str:
    """A setup's short name: hardware and dtype (`cpu-epyc2-fp32`, `h200-bf16`), the model unless it is
    the embedded one, and `@<scale>` (the conf/scale preset)."""
    dtype = DTYPE_SHORT.get(key.get("dtype", ""), key.get("dtype", UNKNOWN))
    model = key.get("model", UNKNOWN)
    name = "-".join([_hardware(key), dtype, *([model] if model != DEFAULT_MODEL else [])])
    return f"{name}@{key.get('scale', UNKNOWN)}"


def setups(samples: pd.DataFrame) -> list[Setup]:
    """The records split by setup, sorted by name. Two setups that would share a name are told apart
    by the SETUP fields in which they differ (`+linear=aten`)."""
    if samples.empty:
        return []
    env = with_env(samples)
    keys = [dict(zip(SETUP, row)) for row in env[SETUP].drop_duplicates().itertuples(index=False)]
    names = [setup_name(k) for k in keys]
    for name in set(names):
        clash = [k for k, n in zip(keys, names) if n == name]
        if len(clash) > 1:
            differ = [c for c in SETUP if len({k[c] for k in clash}) > 1]
            names = [
                n + "".join(f"+{c}={k[c]}" for c in differ) if n == name else n for k, n in zip(keys, names)
            ]
    out = []
    for key, name in zip(keys, names):
        mask = (env[SETUP] == pd.Series(key)).all(axis=1).to_numpy()
        out.append(Setup(name, key, samples[mask]))
    return sorted(out, key=lambda s: s.name)


def _sha(version: str) -> str:
    """A code version as the legend shows it: the commit's first 10 digits and `-dirty` (uncommitted
    code; its digest of the diff left out)."""
    return version.split("-dirty")[0][:10] + ("-dirty" if is_dirty(version) else "")


def code_text(counts: dict[str, int]) -> str:
    """A caption's code version(s): one version by its commit, several by their count; `-dirty`
    (made from uncommitted code) always said."""
    if not counts:
        return "code ?"
    if len(counts) == 1:
        version = next(iter(counts))
        return f"code `{_sha(version)}`" + (" (uncommitted code)" if is_dirty(version) else "")
    dirty = sum(is_dirty(v) for v in counts)
    flag = f", {dirty} of them -dirty (uncommitted code)" if dirty else ""
    return f"code: {len(counts)} versions{flag}, see [Code versions](#code-versions)"


def legend(found: list[Setup]) -> list[str]:
    """The setups' table: each short name with its model, dtype, device, threads, linear backend, scale
    and code versions; the SETUP fields every setup shares are said once below it."""
    shown = ["model", "dtype", "device_name", "threads", "linear", "scale"]
    rest = [c for c in SETUP if c not in shown and c != "model_name"]
    varying = [c for c in rest if len({s.key[c] for s in found}) > 1]
    rows = []
    for s in found:
        runs = s.samples.drop_duplicates("run_id")
        rows.append(
            {
                "setup": f"`{s.name}`",
                **{c.replace("_name", ""): s.key[c] for c in shown},
                **{c: s.key[c] for c in varying},
                "runs": len(runs),
                "code": code_text(version_counts(runs)).replace(", see [Code versions](#code-versions)", ""),
            }
        )
    same = ", ".join(f"{c}={found[0].key[c]}" for c in rest if c not in varying)
    scales = sorted({s.key["scale"] for s in found})
    return [
        markdown(pd.DataFrame(rows)),
        "",
        prose(
            f"Every setup: {same}. Scales: " + "; ".join(f"{sc} = {scale_text(sc)}" for sc in scales) + "."
        ),
        "",
    ]


# --- a table's rows without runs ------------------------------------------------------------------
@dataclass
class Gap:
    """Rows of a paper's table that no run of ours fills, in one setup."""

    paper: str
    table: str
    setup: str
    rows: str
    reason: str


def _measures(table: pd.DataFrame) -> list[str]:
    return [c for c in table.columns if str(c).startswith("ours_") and not str(c).endswith(NOT_MEASURES)]


def _has_ours(table: pd.DataFrame) -> bool:
    ours = _measures(table)
    if not ours:
        return len(table) > 0
    return bool(table[ours].notna().any().any())


def rows_without_runs(table: pd.DataFrame) -> pd.Series:
    """Which rows hold none of our numbers: every `ours_*` measure empty, or an ordering whose claim has
    no run on our side."""
    if "verdict" in table.columns:
        return table["verdict"] == "no runs"
    ours = _measures(table)
    return table[ours].isna().all(axis=1) if ours else pd.Series(False, index=table.index)


def _row_label(row: pd.Series, keys: list[str]) -> tuple[str, str]:
    """(the row's group, what sets it apart in the group): a method and its task or swept value, or an
    ordering's task and claim."""
    if "claim" in keys:
        task, _, claim = str(row["claim"]).partition(": ")
        return f"{task} claims", claim
    first, rest = keys[0], keys[1:]
    detail = ", ".join(str(row[k]) if k in ("task", "method") else f"{k}={row[k]}" for k in rest)
    return str(row[first]), detail


def describe_rows(rows: pd.DataFrame) -> list[tuple[str, str]]:
    """The rows as (group, "group (details)") pairs, one per group, in table order."""
    keys = [c for c in rows.columns if c in ROW_KEYS]
    groups: dict[str, list[str]] = {}
    for _, row in rows.iterrows():
        group, detail = _row_label(row, keys) if keys else (str(row.iloc[0]), "")
        groups.setdefault(group, []).append(detail)
    out = []
    for group, details in groups.items():
        if group.endswith(" claims"):
            out.append((group, f"{group.removesuffix(' claims')}: {len(details)} claims"))
        else:
            shown = _compact([d for d in details if d])
            out.append((group, f"{group} ({shown})" if shown else group))
    return out


def _compact(details: list[str]) -> str:
    """`k=4, k=5` as `k=4, 5`: a swept parameter named once."""
    names = {d.partition("=")[0] for d in details}
    if len(names) == 1 and all("=" in d for d in details):
        return f"{names.pop()}=" + ", ".join(d.partition("=")[2] for d in details)
    return ", ".join(details)


def split_rows(
    table: pd.DataFrame, paper: str, title: str, setup: str, command: str
) -> tuple[pd.DataFrame, list[Gap]]:
    """(the table without the rows that hold no run of ours, those rows as Gaps with their reason)."""
    empty = rows_without_runs(table)
    if not empty.any():
        return table, []
    kept = table[~empty].reset_index(drop=True)
    kept.attrs = dict(table.attrs)
    by_reason: dict[str, list[str]] = {}
    for group, text in describe_rows(table[empty]):
        reason = ROW_REASONS.get((paper, group), f"no run of this setup: `{command}`")
        by_reason.setdefault(reason, []).append(text)
    return kept, [Gap(paper, title, setup, "; ".join(rows), why) for why, rows in by_reason.items()]


def gaps_table(gaps: list[Gap]) -> list[str]:
    """The rows left out of the tables, the setups that lack the same rows for the same reason merged."""
    if not gaps:
        return []
    merged: dict[tuple[str, str, str, str], list[str]] = {}
    for g in gaps:
        merged.setdefault((g.paper, g.table, g.rows, g.reason), []).append(f"`{g.setup}`")
    rows = [
        {"paper": p, "table": t, "setups": ", ".join(s), "rows without a run": r, "reason": why}
        for (p, t, r, why), s in merged.items()
    ]
    return [
        "Rows of the tables above that no run of ours fills (left out of the tables, not left empty):",
        "",
        markdown(pd.DataFrame(rows)),
        "",
    ]


# --- code versions and the cost of a rerun --------------------------------------------------------
@dataclass
class Provenance:
    """The runs one printed table shows in one setup."""

    table: str
    setup: str
    runs: pd.DataFrame  # one row per run: run_id, experiment, git_sha, seconds


def run_rows(samples: pd.DataFrame, run_ids: list[str] | None = None) -> pd.DataFrame:
    """One row per run of `samples` (or of `run_ids` among them): its experiment, code version and the
    prefill + decode seconds of its samples (what rerunning it costs, model loading aside)."""
    if samples.empty:
        return pd.DataFrame(columns=["run_id", "experiment", "git_sha", "seconds"])
    sub = samples if run_ids is None else samples[samples["run_id"].astype(str).isin(run_ids)]
    seconds = sub.get("prefill_s", 0).fillna(0) + sub.get("decode_s", 0).fillna(0)
    sub = sub.assign(seconds=seconds, experiment=sub.get("experiment", "").fillna(""))
    runs = sub.groupby("run_id", sort=True).agg(
        experiment=("experiment", "first"), git_sha=("git_sha", "first"), seconds=("seconds", "sum")
    )
    return runs.reset_index()


def _minutes(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 5400 else f"{max(seconds / 60, 0.1):.1f} min"


def _versions_cell(runs: pd.DataFrame) -> str:
    counts: dict[str, int] = {}
    for version, n in version_counts(runs).items():
        counts[_sha(version)] = counts.get(_sha(version), 0) + n
    return ", ".join(f"{v} ({n})" for v, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def code_section(made: list[Provenance]) -> list[str]:
    """Per printed table and setup: its runs' code versions (runs each), how many were made from
    uncommitted code, and the prefill + decode time its runs took (what a rerun at one commit costs)."""
    parts = ["## Code versions", ""]
    rows = []
    for p in made:
        if p.runs.empty:
            continue
        versions = version_counts(p.runs)
        rows.append(
            {
                "table": p.table,
                "setup": f"`{p.setup}`",
                "runs": len(p.runs),
                "code versions (runs)": _versions_cell(p.runs),
                "-dirty runs": int(sum(n for v, n in versions.items() if is_dirty(v))),
                "one commit": "yes" if len(versions) == 1 and not any(map(is_dirty, versions)) else "no",
                "prefill + decode": _minutes(float(p.runs["seconds"].sum())),
            }
        )
    if not rows:
        return parts + ["No table was made from runs.", ""]
    return parts + [
        prose(
            "A `-dirty` version is code that differed from its commit when the runs were made; records "
            "under results/paper/ are written only from a clean tree "
            "(`runners.provenance.require_clean_tree`). prefill + decode = the seconds the table's runs "
            "spent in them (what rerunning its experiments costs, model loading aside)."
        ),
        "",
        markdown(pd.DataFrame(rows)),
        "",
    ]


# --- sections -------------------------------------------------------------------------------------
def _caption_line(table: pd.DataFrame, fallback: str, setup: str, counts: dict[str, int]) -> str:
    """A table's caption on one line: its title, the setup's short name, the code version(s) of its
    runs, and what its runs add to the setup (a draft, parameters held fixed)."""
    ours = str(table.attrs.get("ours", ""))
    parts = [f"**{table.attrs.get('title') or fallback}**", f"setup `{setup}`", code_text(counts)]
    return " · ".join(parts + ([ours] if ours else []))


def _notes(table: pd.DataFrame) -> str:
    paper = str(table.attrs.get("paper", ""))
    notes = str(table.attrs.get("notes", ""))
    return prose(" ".join(p for p in (f"Paper: {paper}." if paper else "", notes) if p))


# a line that markdown would read as a list item, heading, table row or quote, not as running text
BLOCK_START = re.compile(r"^([-+*]\s|#|\||>|\d+[.)]\s)")


def prose(text: str, width: int = 110) -> str:
    """A paragraph wrapped at `width` (the same paragraph to markdown), unless a wrapped line would
    start a markdown block; then one line."""
    lines = textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)
    return text if any(BLOCK_START.match(line) for line in lines[1:]) else "\n".join(lines)


@dataclass
class Built:
    """What one paper table's section holds: its markdown, its rows without runs, its provenance."""

    lines: list[str] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    made: list[Provenance] = field(default_factory=list)


FIGURES = {"Figure 6": "triforce_figure6.png", "Figure 1": "fafo_figure1.png"}


def table_section(name: str, title: str, fn: TableFn, command: str, found: list[Setup], stage: Path) -> Built:
    """One paper table, per setup: a one-line caption, the table without rows that hold no run of
    ours (they become Gaps), its figure; the notes every setup shares said once, above."""
    built, notes, refused = Built(), [], []
    for setup in found:
        figures = figure_folder(stage, setup.name)
        try:
            table = fn(setup.samples, figures)
        except AnalysisError as exc:
            refused.append(f"`{setup.name}`: {exc}" if len(found) > 1 else str(exc))
            continue
        if table.empty or not _has_ours(table):
            continue
        table, gaps = split_rows(table, name, title, setup.name, command)
        built.gaps += gaps
        runs = run_rows(setup.samples, table.attrs.get("run_ids") or table.attrs.get("used"))
        built.made.append(Provenance(f"{name} {title}", setup.name, runs))
        note = _notes(table)
        if note and note not in notes:
            notes.append(note)
        built.lines += [_caption_line(table, f"{name} {title}", setup.name, version_counts(runs)), ""]
        built.lines += [markdown(table), ""]
        png = figures / FIGURES.get(title, "-")
        if png.exists():
            built.lines += [f"![{name} {title}, {setup.name}]({png.relative_to(stage).as_posix()})", ""]
    head = [f"### {name} {title}", ""] + [line for n in notes for line in (n, "")]
    built.lines = head + built.lines
    for why in refused:  # a setup whose runs this table refuses to combine
        built.lines += [f"Not made from these records: {why}", ""]
    if not built.made and not refused:
        built.lines += [f"No runs yet: `{command}`.", ""]
    return built


def cost_section(root: Path, bench: Path | None = None, names: dict[str, str] | None = None) -> list[str]:
    """Predicted vs measured decode speedup of every run measured where a cost curve was committed
    (`python -m benchmarks.block_cost`), the roofline GPUs' predictions, and the roofline against
    the papers' own pairs. `names`: run id -> setup name, for a column naming each run's setup."""
    from analysis import cost_model as cm

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
        off = table[(table["pred_over_measured"] - 1).abs() > 0.15]
        if names:
            table.insert(1, "setup", [f"`{names.get(str(r), '?')}`" for r in table["run_id"]])
        parts += [
            prose(
                "predicted_here = vanilla's 1-row steps / the run's own forwards, both priced on the cost "
                "curve measured on the runs' device (`benchmarks.block_cost`); measured = paired decode "
                "speedup. A ratio pred/measured far from 1 is time spent outside forwards (decoder "
                f"bookkeeping). {len(table) - len(off)} of {len(table)} runs within +-15%. roofline_* = the "
                "same blocks priced on A100/H100/H200 rooflines (`analysis.cost_model`)."
            ),
            "",
            markdown(table.sort_values(["experiment", "decoder", "kv", "run_id"]).reset_index(drop=True)),
            "",
        ]
    pairs = cm.check_pairs(cm.GPUS["A100-80GB"], cm.SHAPES["llama-2-7b"])
    if len(pairs):
        parts += [
            "Roofline check on the papers' own pairs (FAFO Table 2, Llama-2-7b fp16 on an A100): "
            "predicted = paper tau / roofline cost ratio of the block.",
            "",
            markdown(pairs),
            "",
        ]
    return parts


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


def figure_folder(out: Path, setup: str) -> Path:
    """Where the figures of one setup go: `out/figures/<setup's short name as a file name>`."""
    name = re.sub(r"[^A-Za-z0-9.]+", "-", setup).strip("-") or "all"
    return out / "figures" / name


def anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def contents(lines: list[str]) -> list[str]:
    """A table of contents of the `## ` and `### ` headings in `lines`, linked to their anchors."""
    out, seen = ["## Contents", ""], Counter[str]()
    for line in lines:
        level = len(line) - len(line.lstrip("#"))
        if level not in (2, 3) or not line.startswith("#" * level + " "):
            continue
        text = line[level + 1 :]
        slug = anchor(text)
        slug = f"{slug}-{seen[slug]}" if seen[slug] else slug
        seen[anchor(text)] += 1
        out.append(f"{'  ' * (level - 2)}- [{text}](#{slug})")
    return out + [""]


def _shown_path(path: Path, out: Path) -> str:
    """`path` as the report names it: relative to the repository, else to the report's folder (never
    the absolute path of the machine that built it)."""
    resolved = path.resolve()
    if resolved.is_relative_to(REPO):
        return resolved.relative_to(REPO).as_posix()
    return Path(os.path.relpath(resolved, out.resolve())).as_posix()


def build_report(root: Path, out: Path, stage: Path | None = None) -> str:
    """The report's markdown; its figures are written under `<stage>/figures/<setup>/` (`out` when no
    stage is given) and named relative to it."""
    from analysis.load import load_samples

    stage = out if stage is None else stage
    samples = load_samples(root)
    found = setups(samples)
    n_runs = samples["run_id"].nunique() if len(samples) else 0
    body: list[str] = []
    gaps: list[Gap] = []
    made: list[Provenance] = []
    paper = None
    for name, title, fn, command in REPRODUCED:
        if name != paper:
            body += [f"## {name}", ""]
            paper = name
        built = table_section(name, title, fn, command, found, stage)
        body += built.lines
        gaps += built.gaps
        made += built.made
    body += longspec_figure4_section(stage)  # LongSpec is REPRODUCED's last paper: its section goes on
    if len(samples):
        body += block_auto_section(samples, made)
    run_setup = {
        str(r): s.name for s in found for r in s.samples["run_id"].astype(str).unique()
    }  # each run's setup, for the cost section
    body += cost_section(root, names=run_setup)
    body += code_section(made)
    body += ["## Not reproduced, and why", "", "| paper | table | reason |", "|---|---|---|"]
    body += [f"| {p} | {t} | {why} |" for p, t, why in NOT_REPRODUCED]
    body += [""] + gaps_table(gaps)
    head = [
        "# Paper reproduction report",
        "",
        prose(
            f"Rebuilt by `make paper` (`python -m analysis.paper`) from the records under "
            f"`{_shown_path(root, out)}` ({n_runs} complete runs). {SCALE_NOTE} Each table's caption "
            "names its setup (defined once under Setups) and the code version of its runs; the paper's "
            "numbers come from `results/curated/` (cells marked `~` are the prose's approximations)."
        ),
        "",
    ]
    setup_part = ["## Setups", ""] + (legend(found) if found else ["No records.", ""])
    text_lines = head + contents(setup_part + body) + setup_part + body
    return "\n".join(text_lines).rstrip("\n") + "\n"


def sync_figures(stage: Path, out: Path) -> None:
    """Make `out/figures` hold exactly the figures of `stage/figures`, writing only those whose bytes
    changed (an unchanged figure keeps its file) and removing those no longer made."""
    src, dst = stage / "figures", out / "figures"
    made = {p.relative_to(src) for p in src.rglob("*") if p.is_file()} if src.is_dir() else set()
    for rel in sorted(made):
        target = dst / rel
        data = (src / rel).read_bytes()
        if not target.is_file() or target.read_bytes() != data:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    if dst.is_dir():
        for path in sorted(dst.rglob("*"), reverse=True):  # files before their folders
            if path.is_file() and path.relative_to(dst) not in made:
                path.unlink()
            elif path.is_dir() and not any(path.iterdir()):
                path.rmdir()


def write_report(root: Path, out: Path) -> Path:
    """Build the report with its figures in a scratch folder, then write REPORT.md (when its text
    changed) and sync the figures into `out`: a rebuild from the same records changes no file."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="paper-") as tmp:
        text = build_report(root, out, Path(tmp))
        sync_figures(Path(tmp), out)
    report = out / "REPORT.md"
    if not report.is_file() or report.read_text() != text:
        scratch = out / "REPORT.md.tmp"
        scratch.write_text(text)
        scratch.replace(report)
    return report


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--root", default=str(REPO / "results" / "paper" / "records"), help="folder holding runs/"
    )
    ap.add_argument("--out", default=str(REPO / "results" / "paper"), help="where REPORT.md and figures go")
    args = ap.parse_args(argv)
    root, out = Path(args.root), Path(args.out)
    if not (root / "runs").is_dir():
        sys.exit(f"error: no records under {root}/runs (make paper-runs, or --root <folder holding runs/>)")
    print(f"wrote {write_report(root, out)}")


if __name__ == "__main__":
    main()
