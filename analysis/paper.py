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
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis.claims import ledger
from analysis.claims_report import ledger_section, summary_section, verdict_line
from analysis.claims_table import CLAIMS
from analysis.load import DamagedRecord, load_runs, load_samples, load_table
from analysis.metrics import (
    ENV,
    AnalysisError,
    version_counts,
    with_env,
)
from analysis.paper_tables import NOT_REPRODUCED, REPRODUCED, TableFn
from analysis.report_extras import block_auto_section, cost_section, longspec_figure4_section
from analysis.report_parts import (
    NOT_MEASURES,
    Gap,
    Provenance,
    Setup,
    code_section,
    code_text,
    gaps_table,
    has_ours,
    legend,
    markdown,
    prose,
    run_rows,
    setup_name,
    setups,
    split_rows,
)

# the report's building blocks, importable from here as before
__all__ = ["NOT_MEASURES", "block_auto_section", "cost_section", "setup_name", "main", "build_report"]

REPO = Path(__file__).resolve().parents[1]
SCALE_NOTE = "Same protocol, other scale: compare shapes and orderings, not absolute numbers."


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
        if table.empty or not has_ours(table):
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


def unshown_runs(samples: pd.DataFrame, made: list[Provenance], names: dict[str, str]) -> list[str]:
    """The runs no table above shows (the cost section aside), per setup and experiment, with why: a
    vanilla run with no method run of its environment is a baseline nothing pairs with."""
    shown = {str(r) for p in made for r in p.runs["run_id"]}
    runs = samples.drop_duplicates("run_id") if len(samples) else samples
    left = runs[~runs["run_id"].astype(str).isin(shown)] if len(runs) else runs
    if left.empty:
        return []
    env = with_env(samples)
    methods = env[env["decoder"] != "vanilla"][ENV].drop_duplicates()
    paired = {tuple(r) for r in methods.itertuples(index=False)}
    rows = []
    for _, run in with_env(left).iterrows():
        alone = run["decoder"] == "vanilla" and tuple(run[ENV]) not in paired
        why = (
            "a vanilla baseline with no method run in its environment"
            if alone
            else "a vanilla run its experiment's table does not pair with (that table shows no speedup)"
            if run["decoder"] == "vanilla"
            else "no table of the report holds its experiment (see `analysis.summary`)"
        )
        rows.append(
            {
                "setup": f"`{names.get(str(run['run_id']), '?')}`",
                "experiment": run.get("experiment", ""),
                "run": f"{run['decoder']}+{run['kv']} on {run['task']}",
                "why": why,
            }
        )
    table = (
        pd.DataFrame(rows)
        .groupby(["setup", "experiment", "why"], as_index=False)
        .agg(runs=("run", "count"), example=("run", "first"))
    )
    return [
        "## Runs in no table",
        "",
        prose(
            f"{len(left)} of {len(runs)} complete runs appear in no table above, per setup and experiment:"
        ),
        "",
        markdown(table[["setup", "experiment", "runs", "example", "why"]]),
        "",
    ]


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
    stage = out if stage is None else stage
    samples = load_samples(root, strict=True)
    claims = ledger(samples, CLAIMS, load_table(root, "scores"))
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
        body += built.lines + [verdict_line(claims, name, title), ""]
        gaps += built.gaps
        made += built.made
    body += longspec_figure4_section(stage)  # LongSpec is REPRODUCED's last paper: its section goes on
    body += [verdict_line(claims, "LongSpec", "Figure 4"), ""]
    body += ledger_section(claims)
    if len(samples):
        body += block_auto_section(samples, made)
    run_setup = {
        str(r): s.name for s in found for r in s.samples["run_id"].astype(str).unique()
    }  # each run's setup, for the cost section
    body += cost_section(root, names=run_setup, samples=samples)
    body += code_section(made)
    body += unshown_runs(samples, made, run_setup)
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
    summary = summary_section(claims)
    text_lines = head + summary + contents(summary + setup_part + body) + setup_part + body
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
    with tempfile.TemporaryDirectory(prefix="paper-") as tmp:
        text = build_report(root, out, Path(tmp))  # before anything is written: it may refuse the records
        out.mkdir(parents=True, exist_ok=True)
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
    # the report is rebuilt from every record and committed: one built without a damaged record would
    # lose its cells (and the pairings it is the baseline of) without anyone noticing, so it is refused
    try:
        load_runs(root, strict=True)
        report = write_report(root, out)
    except DamagedRecord as exc:
        sys.exit(
            f"error: {exc}; make paper needs every record intact: restore it (git checkout -- <that folder>) "
            "or remove it, then rerun"
        )
    print(f"wrote {report}")


if __name__ == "__main__":
    main()
