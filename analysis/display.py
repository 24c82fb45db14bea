"""Terminal text that reads clean: short run labels naming only what differs between the runs shown
(everything else in a legend under the table), tables split to fit `WIDTH` columns, and the
exactness of an audited run as counts (exact / within a numerical tie / diverged).

Shared by the end-of-run table (`runners.report`) and `python -m analysis.summary`.
"""

from __future__ import annotations

import json
import math
import re
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import pandas as pd

from analysis.metrics import TIE_GAP

WIDTH = 120
GAP = "  "  # between two columns of a table
MAX_VALUE = 24  # a label value longer than this is named by an alias (`<field>#<i>`) defined in the legend
MAX_LABEL = 40  # method parameters that would make a label longer are named `<method>#<i>` instead
PARAM_PREFIXES = ("decoder.", "kv.", "draft.")
# environment fields shown by value alone in a label or a block header; the others as `name=value`
BARE = ("task", "model", "dtype", "device_name")
FIRST = ("task", "max_new_tokens", "model", "dtype", "device_name")
DERIVED = ("task_params", "task_version", "sample_set")  # left out where the fields shown imply them
SHORT = {
    "max_new_tokens": "tokens",
    "device_name": "device",
    "prefill_chunk": "chunk",
    "task_version": "task_v",
    "cuda_graphs": "graphs",
}
# per-sample counters shown when the records hold them: column, header, format; each is a
# forwards-weighted mean over the run's turns (a turn with more forwards says more about the run)
COUNTERS = (
    ("static_frac", "static", "{:.0%}"),
    ("draft_static_frac", "draft static", "{:.0%}"),
    ("syncs_per_step", "syncs/step", "{:.2f}"),
    ("host_ms_per_forward", "host ms/fwd", "{:.2f}"),
    ("critical_ms_per_forward", "critical ms/fwd", "{:.2f}"),
)


# --- values -----------------------------------------------------------------------------------------
def text(v: object) -> str | None:
    """A record value as label text; None for a missing one."""
    if v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA or v is pd.NaT:
        return None
    if isinstance(v, float):
        return str(int(v)) if v.is_integer() else f"{v:g}"
    if isinstance(v, (list, dict)):
        return json.dumps(v)
    s = str(v)
    return None if s in ("None", "nan", "<NA>") else s


def method_name(row: Mapping[str, object]) -> str:
    """decoder, then `+<kv policy>` unless the full cache, then `+<draft>` when the run has one."""
    name = str(row.get("decoder"))
    kv = text(row.get("kv"))
    if kv and kv != "full":
        name += f"+{kv}"
    draft = text(row.get("draft"))
    if draft and draft != "none":
        name += f"+{draft}"
    return name


def field_name(field: str) -> str:
    return SHORT.get(field, field)


def env_order(fields: Iterable[str]) -> list[str]:
    """`fields` with the ones a reader looks for first (`FIRST`) leading."""
    fields = list(fields)
    return sorted(fields, key=lambda f: (FIRST.index(f) if f in FIRST else len(FIRST), fields.index(f)))


class Aliases:
    """Short stand-ins (`task_params#1`) for values longer than `MAX_VALUE`, defined in the legend."""

    def __init__(self) -> None:
        self.names: dict[tuple[str, str], str] = {}

    def part(self, field: str, value: str, shown: str | None) -> str:
        """`shown=value` (the bare value when `shown` is None), or the value's alias when it is long."""
        if len(value) > MAX_VALUE:
            key = (field, value)
            if key not in self.names:
                n = sum(1 for f, _ in self.names if f == field) + 1
                self.names[key] = f"{field.split('.')[-1]}#{n}"
            return self.names[key]
        return value if shown is None else f"{shown}={value}"

    def legend(self) -> list[str]:
        return [f"{alias} = {value}" for (_, value), alias in self.names.items()]


# --- labels -----------------------------------------------------------------------------------------
def varying(table: pd.DataFrame, fields: Iterable[str]) -> tuple[list[str], list[str]]:
    """(fields whose value differs between the rows, fields with one value), of those present."""
    differ, same = [], []
    for f in fields:
        if f not in table.columns:
            continue
        values = {text(v) for v in table[f]}
        if values == {None}:
            continue
        (differ if len(values) > 1 else same).append(f)
    shown = "model_name" in differ + same and "model" in table.columns
    if shown and determined(table, ["model"], "model_name"):  # a model's config name already names it
        differ, same = [f for f in differ if f != "model_name"], [f for f in same if f != "model_name"]
    return differ, same


def determined(table: pd.DataFrame, by: Sequence[str], field: str) -> bool:
    """Whether the values of `by` fix the value of `field` in every row of `table`."""
    seen: dict[tuple[str | None, ...], str | None] = {}
    for _, row in table.iterrows():
        value = text(row[field])
        if seen.setdefault(tuple(text(row[b]) for b in by), value) != value:
            return False
    return True


def independent(table: pd.DataFrame, fields: Sequence[str]) -> list[str]:
    """`fields` less the `DERIVED` ones the earlier ones already fix (a sample-set digest that follows
    from max_new_tokens says nothing more)."""
    kept: list[str] = []
    for f in fields:
        if not (f in DERIVED and kept and determined(table, kept, f)):
            kept.append(f)
    return kept


def env_part(row: Mapping[str, object], field: str, alias: Aliases) -> str | None:
    value = text(row.get(field))
    if value is None:
        return None
    return alias.part(field, value, None if field in BARE else field_name(field))


def param_parts(row: Mapping[str, object], params: Sequence[str], alias: Aliases) -> list[str]:
    """`key=value` of the given parameters; the bare key unless two groups share it (`kv.k`)."""
    bare = [p.split(".", 1)[1] for p in params]
    parts = []
    for p, key in zip(params, bare):
        value = text(row.get(p))
        if value is not None:
            parts.append(alias.part(p, value, key if bare.count(key) == 1 else p))
    return parts


@dataclass
class Layout:
    """How rows (one per run) are shown: each row's label and block header, and the legend."""

    labels: list[str]
    headers: list[str]
    legend: list[str]


def layout(table: pd.DataFrame, env: Sequence[str] = (), block: Sequence[str] = ()) -> Layout:
    """Labels, block headers and legend for the rows of `table` (one row per run).

    A row's label is its method name (`method_name`), the method parameters whose values differ
    between that method's rows (as `<name>#<i>` defined in the legend when they would make the label
    longer than `MAX_LABEL`), and the `env` fields that differ within the row's block (rows alike in
    the `block` fields). An `env` field that differs between blocks only is named in the block header
    (`telling`); one with a single value, and each method's fixed parameters, go to the legend; one
    that the fields before it (in `env_order`) fix is left out. Rows still alike (in a field not
    considered, e.g. the code version) get the code version, then `#<i>`."""
    alias = Aliases()
    rows = table.reset_index(drop=True)
    env_differ, env_same = varying(rows, env_order(env))
    env_differ = independent(rows, env_differ)
    legend = []
    if env_same:
        first = rows.iloc[0]
        legend.append("all runs: " + ", ".join(f"{field_name(f)} {text(first[f])}" for f in env_same))
    methods, method_legend = method_labels(rows, alias)
    labels, headers = [""] * len(rows), [""] * len(rows)
    keys = [rows[f].map(text).fillna("") for f in block if f in rows.columns]
    groups = rows.groupby(keys, sort=True) if keys else [((), rows)]
    for _, part in groups:
        inside, fixed = varying(part, env_differ)
        header = ", ".join(
            p for p in (env_part(part.iloc[0], f, alias) for f in telling(rows, part, fixed)) if p
        )
        inside = independent(part, inside)
        for i, row in part.iterrows():
            parts = [methods[int(i)], *(env_part(row, f, alias) for f in inside)]
            headers[int(i)] = header
            labels[int(i)] = " ".join(p for p in parts if p)
    return Layout(disambiguate(rows, labels, headers), headers, legend + method_legend + alias.legend())


def telling(rows: pd.DataFrame, part: pd.DataFrame, fields: Sequence[str]) -> list[str]:
    """The `fields` (one value in `part`) a block header names: all but a `DERIVED` one that does not
    set the block apart from the rows alike in the fields named before it."""
    named: list[str] = []
    for f in fields:
        alike = rows
        for g in named:
            alike = alike[alike[g].map(text) == text(part[g].iloc[0])]
        if f not in DERIVED or alike[f].map(text).nunique(dropna=False) > 1:
            named.append(f)
    return named


def method_labels(rows: pd.DataFrame, alias: Aliases) -> tuple[list[str], list[str]]:
    """Each row's method name with the parameters that differ between that method's rows, and the
    legend entries: each method's fixed parameters, and the parameter sets too long for a label."""
    names = rows.apply(method_name, axis=1) if len(rows) else pd.Series(dtype=str)
    params = sorted(c for c in rows.columns if c.startswith(PARAM_PREFIXES))
    labels, legend = [""] * len(rows), []
    for name in sorted(set(names)):
        group = rows[names == name]
        differ, same = varying(group, params)
        if same:
            first = group.iloc[0]
            legend.append(f"{name}: " + " ".join(f"{p}={text(first[p])}" for p in same))
        shown = {int(i): " ".join(param_parts(row, differ, alias)) for i, row in group.iterrows()}
        long = sorted({v for v in shown.values() if len(name) + 1 + len(v) > MAX_LABEL})
        legend += [f"{name}#{n}: {v}" for n, v in enumerate(long, 1)]
        for i, v in shown.items():
            labels[i] = f"{name}#{long.index(v) + 1}" if v in long else f"{name} {v}".strip()
    return labels, legend


def disambiguate(rows: pd.DataFrame, labels: list[str], headers: list[str]) -> list[str]:
    """`labels` made distinct within each block: by code version where that tells rows apart, else
    by `#<i>`."""
    out = list(labels)
    for label, header in set(zip(labels, headers)):
        idx = [i for i, lh in enumerate(zip(labels, headers)) if lh == (label, header)]
        if len(idx) < 2:
            continue
        codes = [text(rows.iloc[i].get("git_sha")) or "?" for i in idx]
        by_code = len({c[:10] for c in codes}) == len(idx)
        for n, i in enumerate(idx, 1):
            out[i] = f"{label} code={codes[n - 1][:10]}" if by_code else f"{label} #{n}"
    return out


def natural_key(label: str) -> tuple[object, ...]:
    """Sort key that puts `x#2` before `x#10`."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", label))


def legend_lines(legend: Sequence[str], width: int = WIDTH) -> list[str]:
    """The legend under a table, each entry wrapped to `width` columns."""
    out = []
    for i, entry in enumerate(legend):
        head = "legend: " if i == 0 else "        "
        out += textwrap.wrap(entry, width, initial_indent=head, subsequent_indent=" " * 10)
    return out


def wrap(line: str, width: int = WIDTH) -> list[str]:
    return textwrap.wrap(line, width, subsequent_indent="  ", break_on_hyphens=False) or [""]


# --- tables -----------------------------------------------------------------------------------------
def render(table: pd.DataFrame, width: int = WIDTH) -> list[str]:
    """Lines of `table` (cells already text; the first column left-aligned, the others right-aligned).
    Columns that do not fit `width` continue in a further table that repeats the first column."""
    cells = table.astype(str)
    key, rest = cells.columns[0], list(cells.columns[1:])
    w = {c: max([len(str(c)), *(len(v) for v in cells[c])]) for c in cells.columns}
    w[key] = min(w[key], width // 2)
    chunks: list[list[str]] = [[]]
    used = w[key]
    for c in rest:
        need = len(GAP) + min(w[c], width - w[key] - len(GAP))
        if chunks[-1] and used + need > width:
            chunks.append([])
            used = w[key]
        chunks[-1].append(c)
        used += need
    lines: list[str] = []
    for n, chunk in enumerate(chunks):
        if n:
            lines.append("")
        for r in [None, *range(len(cells))]:
            first = str(key) if r is None else cells[key].iloc[r]
            row = [first[: w[key]].ljust(w[key])]
            for c in chunk:
                cw = min(w[c], width - w[key] - len(GAP))
                v = str(c) if r is None else cells[c].iloc[r]
                row.append(v[:cw].rjust(cw))
            lines.append(GAP.join(row).rstrip())
    return lines


# --- exactness and counters -------------------------------------------------------------------------
def exactness(samples: pd.DataFrame, dtype: str) -> tuple[int, int, int]:
    """(exact, within tie, diverged) over the audited turns of `samples`.

    Exact: the output equals vanilla greedy's. Within tie: it first differs where vanilla's top-2 logit
    gap (`divergence_gap`, measured by `runners.audit`) is at most `TIE_GAP[dtype]`, the dtype's
    rounding of a logit, so block and row forwards may rank the two tokens either way. Diverged: any
    other difference (a larger gap, no gap because one output stops early, or a dtype without one)."""
    if "matches_vanilla" not in samples.columns:
        return 0, 0, 0
    audited = samples[samples["matches_vanilla"].notna()]
    matches = audited["matches_vanilla"].astype(bool)
    differ = audited[~matches]
    tol = TIE_GAP.get(dtype)
    if tol is None or differ.empty or "divergence_gap" not in differ.columns:
        return int(matches.sum()), 0, len(differ)
    ties = int((differ["divergence_gap"].astype(float) <= tol).sum())
    return int(matches.sum()), ties, len(differ) - ties


def exactness_text(counts: tuple[int, int, int]) -> str:
    """`exact/tie/diverged`, or `-` for a run with no audited turn (lossy, sampled, or audit off)."""
    return "/".join(map(str, counts)) if sum(counts) else "-"


EXACT_HEADER = "exact/tie/div"


def weighted_mean(run: pd.DataFrame, column: str) -> float:
    """`column`'s mean over the run's turns, weighted by their forwards (NaN when none recorded)."""
    if column not in run.columns:
        return math.nan
    vals = run[column].astype(float)
    w = run["forwards"].astype(float).fillna(0.0) if "forwards" in run.columns else vals * 0 + 1
    keep = vals.notna() & (w > 0)
    return float((vals[keep] * w[keep]).sum() / w[keep].sum()) if keep.any() else math.nan


def counters(run: pd.DataFrame) -> dict[str, float]:
    """The `COUNTERS` the run's records hold a value of (records older than a counter lack its column,
    newer ones may hold NaN where it does not apply), by column name."""
    values = {c: weighted_mean(run, c) for c, _, _ in COUNTERS}
    return {c: v for c, v in values.items() if not math.isnan(v)}


def counter_cells(values: Mapping[str, float], present: Iterable[str]) -> dict[str, str]:
    """Header -> text of each counter in `present` (the columns some shown run records)."""
    shown = set(present)
    return {head: num(values.get(c), fmt) for c, head, fmt in COUNTERS if c in shown}


def restricted_text(run: pd.DataFrame) -> str:
    """The share of decode forwards in which the KV policy restricted attention: `-` for the full
    cache, `?` for records without it, `0% idle` for a policy that restricted nothing."""
    if "kv" in run.columns and (run["kv"] == "full").all():
        return "-"
    frac = weighted_mean(run, "restricted_frac")
    if math.isnan(frac):
        return "?"
    return "0% idle" if frac == 0 else f"{frac:.0%}"


def num(v: object, fmt: str = "{:.2f}") -> str:
    """`v` formatted, `-` when missing."""
    return "-" if v is None or v is pd.NA or (isinstance(v, float) and math.isnan(v)) else fmt.format(v)


def interval(mid: float, lo: float, hi: float) -> str:
    """`1.23 (1.10-1.40)`: a speedup with its 95% interval."""
    if math.isnan(mid):
        return "-"
    return f"{mid:.2f} ({lo:.2f}-{hi:.2f})" if not math.isnan(lo) else f"{mid:.2f}"


def flat_params(run: Mapping[str, object]) -> dict[str, object]:
    """A run row's decoder, KV-policy and draft parameters (`decoder_params` etc., JSON) as
    `decoder.<name>` columns, the form `analysis.load.load_runs` gives them."""
    out: dict[str, object] = {}
    for group in ("decoder", "kv", "draft"):
        blob = run.get(f"{group}_params")
        try:
            params = json.loads(blob) if isinstance(blob, str) else {}
        except json.JSONDecodeError:
            params = {}
        out.update({f"{group}.{k}": v for k, v in (params or {}).items() if k not in ("_target_", "method")})
    return out
