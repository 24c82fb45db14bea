"""The parts of the paper report that do not depend on which tables it holds: markdown and prose,
the setups' short names and legend, the rows of a table that no run fills (with their reason), and the
code versions of each table's runs (what rerunning it at one commit costs)."""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass

import pandas as pd

from analysis.metrics import (
    SETUP,
    UNKNOWN,
    is_dirty,
    scale_name,
    scale_text,
    version_counts,
    what_ran,
    with_env,
)

# Why a row of a paper's table has no run of ours in any setup, where "no run yet" is not the reason
# (paper, method) -> reason; rows not named here say which command makes their runs.
ROW_REASONS: dict[tuple[str, str], str] = {
    ("FAFO", "SWIFT"): "no run of this setup: `python run.py -m experiment=fafo_swift` (the cpu slice runs "
    "MT-Bench alone: the skip-set search costs 2-4 CPU-minutes per 64-token turn)",
    ("FAFO", "TriForce"): "no run of this setup: `python run.py -m experiment=fafo_triforce` "
    "(its PG-19 rows: FAFO Table 10)",
}
# the columns that name a table's row (the others hold numbers)
ROW_KEYS = ("method", "claim", "task", "decoder.k", "decoder.n", "kv.budget", "task.context_length")
# measure-free columns of ours: a row with only these is a row without a run
NOT_MEASURES = ("kv_activity", "note", "matches_vanilla", "approx")
DEFAULT_MODEL = "smollm2-135m"  # the embedded model: setup names leave it out
DTYPE_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
VENDOR_WORDS = {"amd", "intel", "intel(r)", "nvidia", "genuine", "cpu", "processor", "(r)", "(tm)"}


def markdown(table: pd.DataFrame) -> str:
    """A DataFrame as a GitHub markdown table (floats to 3 significant decimals, NaN as blank), without its
    `_*` columns (intervals the verdicts read)."""

    def cell(v: object) -> str:
        if isinstance(v, float):
            return "" if pd.isna(v) else f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"
        return "" if v is None else str(v).replace("|", "\\|")

    table = table[[c for c in table.columns if not str(c).startswith("_")]]  # `_*`: for the verdicts
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


def setup_name(key: dict[str, str], samples: pd.DataFrame | None = None) -> str:
    """A setup's short name: hardware and dtype (`cpu-epyc2-fp32`, `h200-bf16`), the model unless it is
    the embedded one, and `@<scale>`: the conf/scale preset, or, where runs labelled with the paper's
    protocol ran less of it, what they ran (`@2samples-64tok`; `analysis.metrics.scale_name`)."""
    dtype = DTYPE_SHORT.get(key.get("dtype", ""), key.get("dtype", UNKNOWN))
    model = key.get("model", UNKNOWN)
    name = "-".join([_hardware(key), dtype, *([model] if model != DEFAULT_MODEL else [])])
    scale = key.get("scale", UNKNOWN)
    return f"{name}@{scale if samples is None else scale_name(scale, samples)}"


def setups(samples: pd.DataFrame) -> list[Setup]:
    """The records split by setup, sorted by name. Two setups that would share a name are told apart
    by the SETUP fields in which they differ (`+linear=aten`)."""
    if samples.empty:
        return []
    env = with_env(samples)
    keys = [dict(zip(SETUP, row)) for row in env[SETUP].drop_duplicates().itertuples(index=False)]
    masks = [(env[SETUP] == pd.Series(key)).all(axis=1).to_numpy() for key in keys]
    names = [setup_name(k, samples[m]) for k, m in zip(keys, masks)]
    for name in set(names):
        clash = [k for k, n in zip(keys, names) if n == name]
        if len(clash) > 1:
            differ = [c for c in SETUP if len({k[c] for k in clash}) > 1]
            names = [
                n + "".join(f"+{_field_text(c, k[c])}" for c in differ) if n == name else n
                for k, n in zip(keys, names)
            ]
    out = [Setup(name, key, samples[mask]) for key, name, mask in zip(keys, names, masks)]
    return sorted(out, key=lambda s: s.name)


def _field_text(col: str, value: str) -> str:
    """A SETUP field that tells two setups apart, as a name shows it: sampling by its temperature (and
    top_p / top_k where they are not the defaults: `T=0.6`, `T=1,top_p=0.9`), any other as col=value."""
    if col != "sampling":
        return f"{col}={value}"
    try:
        cfg = json.loads(value)
    except (TypeError, ValueError):
        return f"{col}={value}"
    if not isinstance(cfg, dict):
        return f"{col}={value}"
    text = f"T={float(cfg.get('temperature', 0.0)):g}"
    if float(cfg.get("top_p", 1.0)) != 1.0:
        text += f",top_p={float(cfg['top_p']):g}"
    if int(cfg.get("top_k", 0) or 0):
        text += f",top_k={int(cfg['top_k'])}"
    return text


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
                "scale": s.key["scale"]
                + ("" if scale_name(s.key["scale"], s.samples) == s.key["scale"] else " preset, ran less"),
                "ran": what_ran(s.samples)["text"],
                "runs": len(runs),
                "code": code_text(version_counts(runs)).replace(", see [Code versions](#code-versions)", ""),
            }
        )
    same = ", ".join(f"{c}={found[0].key[c]}" for c in rest if c not in varying)
    scales = sorted({s.key["scale"] for s in found})
    cut = [s.name for s in found if s.key["scale"] == "paper" and not what_ran(s.samples)["protocol"]]
    cut_text = (
        " Setups recorded under the paper preset that ran less of it are named by what they ran ("
        + ", ".join(f"`{n}`" for n in cut)
        + "): NOT the paper's protocol."
        if cut
        else ""
    )
    return [
        markdown(pd.DataFrame(rows)),
        "",
        prose(
            f"Every setup: {same}. ran = samples per run and new tokens per turn, read from the records. "
            "Scales: " + "; ".join(f"{sc} = {scale_text(sc)}" for sc in scales) + "." + cut_text
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


def has_ours(table: pd.DataFrame) -> bool:
    ours = _measures(table)
    if not ours:
        return len(table) > 0
    return bool(table[ours].notna().any().any())


def rows_without_runs(table: pd.DataFrame) -> pd.Series:
    """Which rows hold none of our numbers: every `ours_*` measure empty, or an ordering whose claim has
    no run on our side."""
    if "verdict" in table.columns:
        return table["verdict"].isin(["no runs", "not testable"])
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


def _short(rows: str, limit: int = 160) -> str:
    """A long list of rows by their groups alone (`FAFO-Quest; FAFO-H2O`), so a line stays readable."""
    if len(rows) <= limit:
        return rows
    return re.sub(r" \([^)]*\)", "", rows) + " (every task of the table)"


def gaps_table(gaps: list[Gap]) -> list[str]:
    """The rows left out of the tables, the setups that lack the same rows for the same reason merged."""
    if not gaps:
        return []
    merged: dict[tuple[str, str, str, str], list[str]] = {}
    for g in gaps:
        merged.setdefault((g.paper, g.table, g.rows, g.reason), []).append(f"`{g.setup}`")
    rows = [
        {"paper": p, "table": t, "setups": ", ".join(s), "rows without a run": _short(r), "reason": why}
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


# a line that markdown would read as a list item, heading, table row or quote, not as running text
BLOCK_START = re.compile(r"^([-+*]\s|#|\||>|\d+[.)]\s)")


def prose(text: str, width: int = 110) -> str:
    """A paragraph wrapped at `width` (the same paragraph to markdown), unless a wrapped line would
    start a markdown block; then one line."""
    lines = textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)
    return text if any(BLOCK_START.match(line) for line in lines[1:]) else "\n".join(lines)
