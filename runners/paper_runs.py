"""The runs behind the paper report, run or rerun by slice (`conf/paper_runs.yaml`).

    python -m runners.paper_runs                      # every cpu entry; complete runs are skipped
    python -m runners.paper_runs --group slice8 qwen  # other groups
    python -m runners.paper_runs --stale              # the slices whose records mix code versions or
                                                      # come from uncommitted code, each listed
    python -m runners.paper_runs --rerun --stale --max-minutes 60   # replace them, slice by slice

A slice is every entry sharing (experiment, model, scale): the runs of one table's rows in one setup.
Only CPU records are considered: GPU records come from scripts/gpu_checks.sh on a GPU.
A rerun deletes the slice's records, then runs its entries, so the slice ends at one commit; the
runner refuses to write under results/paper/ from a tree with uncommitted changes, so that commit is
the code that made them. Run the rerun, `make paper`, and commit the records and the report together.
`--max-minutes` starts no new slice once that many minutes have passed (the slices' own length comes
from their records' prefill and decode seconds, printed with `--stale`).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml
from omegaconf import OmegaConf

from core.types import HarnessError
from runners.records import DAMAGE, why
from runners.schemas import register_schemas

REPO = Path(__file__).resolve().parents[1]
PLAN = REPO / "conf" / "paper_runs.yaml"
RECORDS = Path("results/paper/records")


@dataclass(frozen=True)
class Entry:
    group: str
    experiment: str
    args: tuple[str, ...]
    sweep: bool

    def command(self, records: Path) -> list[str]:
        sweep = ["-m"] if self.sweep else []
        return [
            sys.executable,
            "run.py",
            *sweep,
            f"experiment={self.experiment}",
            *self.args,
            f"run.out_dir={records}",
        ]


Slice = tuple[str, str, str]  # (experiment, model, scale) as the records name them


def load_plan(path: Path = PLAN) -> list[Entry]:
    plan = yaml.safe_load(path.read_text())
    entries = []
    for group, items in plan.items():
        for item in items:
            unknown = set(item) - {"experiment", "args", "sweep"}
            if unknown or "experiment" not in item:
                raise HarnessError(
                    f"{path.name}: entry {item} of {group}: needs experiment, may have args, sweep"
                )
            entries.append(
                Entry(
                    group,
                    item["experiment"],
                    tuple(str(item.get("args", "")).split()),
                    bool(item.get("sweep")),
                )
            )
    return entries


def slice_of(entry: Entry) -> Slice:
    """The (experiment, model, scale) the entry's runs record, from its composed config (a swept value
    stands for its first choice: every choice records the same three)."""
    from hydra import compose, initialize_config_dir

    overrides = [f"experiment={entry.experiment}"] + [a.split(",")[0] if "=" in a else a for a in entry.args]
    register_schemas()
    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    return entry.experiment, str(cfg.hydra.runtime.choices.model), str(OmegaConf.select(cfg, "scale.name"))


def record_slices(records: Path) -> pd.DataFrame:
    """One row per CPU run recorded: its folder, slice, code version and prefill + decode seconds."""
    rows = []
    for run_file in sorted((records / "runs").glob("*/runs.parquet")):
        samples = run_file.parent / "samples.parquet"
        secs = 0.0
        try:
            run = pd.read_parquet(run_file).iloc[0]
            if samples.exists():
                timed = pd.read_parquet(samples, columns=["prefill_s", "decode_s"])
                secs = float(timed.sum().sum())
        except (*DAMAGE, IndexError, KeyError) as exc:
            raise HarnessError(
                f"damaged record {run_file.parent} ({why(exc)}): restore it (git checkout -- <that folder>) "
                "or remove it"
            ) from None
        if not str(run["device_name"]).startswith("cpu"):
            continue  # GPU records come from the GPU check script, never rerun here
        rows.append(
            {
                "folder": run_file.parent,
                "slice": (str(run["experiment"]), str(run["model"]), str(run.get("scale") or "paper")),
                "git_sha": str(run["git_sha"]),
                "seconds": secs,
            }
        )
    return pd.DataFrame(rows, columns=["folder", "slice", "git_sha", "seconds"])


def stale(runs: pd.DataFrame) -> dict[Slice, str]:
    """Slices whose records come from uncommitted code or from more than one commit, with why."""
    out = {}
    for key, group in runs.groupby("slice", sort=True):
        versions = sorted(set(group["git_sha"]))
        dirty = sum("-dirty" in v for v in group["git_sha"])
        if dirty or len(versions) > 1:
            why = f"{len(versions)} code versions" + (
                f", {dirty} runs from uncommitted code" if dirty else ""
            )
            out[key] = why
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m runners.paper_runs", description=__doc__.split("\n")[0])
    ap.add_argument("--group", nargs="+", default=["cpu"], help="groups of conf/paper_runs.yaml")
    ap.add_argument("--experiment", nargs="+", default=None, help="only these experiments' slices")
    ap.add_argument("--stale", action="store_true", help="only slices that mix code versions or are -dirty")
    ap.add_argument("--rerun", action="store_true", help="delete each chosen slice's records, then run it")
    ap.add_argument("--max-minutes", type=float, default=0.0, help="start no slice after this many minutes")
    ap.add_argument("--dry-run", action="store_true", help="print the slices and commands, run nothing")
    ap.add_argument("--records", type=Path, default=RECORDS)
    args = ap.parse_args(argv)
    try:
        plan = load_plan()
        groups = {e.group for e in plan}
        if set(args.group) - groups:
            raise HarnessError(f"--group takes {', '.join(sorted(groups))}; got {' '.join(args.group)}")
        entries = [e for e in plan if e.group in args.group]
        if args.experiment:
            entries = [e for e in entries if e.experiment in args.experiment]
        slices: dict[Slice, list[Entry]] = {}
        for entry in entries:
            slices.setdefault(slice_of(entry), []).append(entry)
        runs = record_slices(args.records)
        if args.stale:
            why = stale(runs)
            slices = {k: v for k, v in slices.items() if k in why}
            for key in slices:
                minutes = runs.loc[runs["slice"] == key, "seconds"].sum() / 60
                print(f"[paper-runs] stale {'/'.join(key)}: {why[key]} (~{minutes:.0f} min of decoding)")
        start = time.monotonic()
        for key, members in slices.items():
            if args.max_minutes and time.monotonic() - start > 60 * args.max_minutes:
                print(
                    f"[paper-runs] --max-minutes {args.max_minutes:g} passed: stopping before {'/'.join(key)}"
                )
                break
            old = runs.loc[runs["slice"] == key, "folder"].tolist()
            if args.rerun:
                print(f"[paper-runs] rerun {'/'.join(key)}: {len(old)} recorded runs replaced", flush=True)
                if not args.dry_run:
                    for folder in old:
                        shutil.rmtree(folder)
            for entry in members:
                cmd = entry.command(args.records)
                print("[paper-runs] " + " ".join(cmd[1:]), flush=True)
                if not args.dry_run and subprocess.run(cmd, cwd=REPO).returncode != 0:
                    return 1
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
