"""Run a chain of LongSpec training runs described by one YAML file (`conf/train/*.yaml`).

    python -m training.longspec.recipe conf/train/longspec_smollm2.yaml
    python -m training.longspec.recipe conf/train/longspec_smollm2.yaml --dry-run   # print the commands

A recipe holds `common` fields given to every run and a list of `runs`, each with its `name`, its own
`fields` (any `training.longspec` field, YAML values) and optionally:
- `init: previous` to continue the previous run's draft, or a draft folder;
- `continuations: <file>` or `previous`: the target's continuations the run starts from (copied to
  the run's `generated.json` unless one is there: they take long to decode and the trainer checks
  they continue its prompts);
- `record: <folder>`: copy the run's `log.csv` and `draft/training.json` there (committed logs).
Top level, `out: <folder>` holds the runs (`<out>/<name>`), and `ship: <folder>` receives the last
run's draft with its logs and every run's `config.json` (`train_config*.json`, in order).
Each run resumes where it stopped, so rerunning the recipe continues it.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from core.types import HarnessError

RUN_KEYS = {"name", "fields", "init", "continuations", "record"}
TOP_KEYS = {"out", "common", "runs", "ship"}


def load(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise HarnessError(f"training.longspec.recipe: no recipe file {path}")
    recipe = yaml.safe_load(path.read_text())
    if not isinstance(recipe, dict) or not isinstance(recipe.get("runs"), list) or not recipe["runs"]:
        raise HarnessError(f"training.longspec.recipe: {path} needs a non-empty list `runs`")
    unknown = set(recipe) - TOP_KEYS
    if unknown:
        raise HarnessError(f"training.longspec.recipe: unknown top-level keys {sorted(unknown)} in {path}")
    names = [run.get("name") for run in recipe["runs"]]
    if len(set(names)) != len(names) or not all(isinstance(n, str) and n for n in names):
        raise HarnessError(f"training.longspec.recipe: every run needs a distinct name, got {names}")
    for run in recipe["runs"]:
        bad = set(run) - RUN_KEYS
        if bad:
            raise HarnessError(f"training.longspec.recipe: run {run['name']}: unknown keys {sorted(bad)}")
    if recipe["runs"][0].get("init") == "previous":
        raise HarnessError("training.longspec.recipe: the first run has no previous run to continue")
    return recipe


def _value(v: Any) -> str:
    """A field value as `training.longspec` parses it (YAML flow style for lists and mappings)."""
    if isinstance(v, (list, dict)):
        return yaml.safe_dump(v, default_flow_style=True, width=10_000).strip()
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def commands(recipe: dict[str, Any]) -> list[tuple[dict[str, Any], Path, list[str]]]:
    """(run, its out folder, its `training.longspec` arguments) for every run, in order."""
    out_root = Path(recipe.get("out", "outputs/longspec_recipe"))
    plan, previous = [], None
    for run in recipe["runs"]:
        out = out_root / run["name"]
        fields = {**(recipe.get("common") or {}), **(run.get("fields") or {}), "out": str(out)}
        if run.get("continuations") == "previous":
            if previous is None:
                raise HarnessError(
                    f"training.longspec.recipe: run {run['name']}: no previous run's continuations"
                )
            run = {**run, "continuations": str(previous / "generated.json")}
        init = run.get("init")
        if init == "previous":
            fields["init"] = str(previous / "draft")
        elif init is not None:
            fields["init"] = str(init)
        plan.append((run, out, [f"{k}={_value(v)}" for k, v in fields.items()]))
        previous = out
    return plan


def ship(recipe: dict[str, Any], plan: list[tuple[dict[str, Any], Path, list[str]]]) -> Path:
    dest = Path(recipe["ship"])
    last = plan[-1][1]
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(last / "draft", dest)
    for name in ("log.csv", "eval.csv"):
        shutil.copy(last / name, dest / name)
    for i, (_, out, _) in enumerate(plan):
        suffix = "" if i == 0 else "_continued" if i == 1 else f"_continued_{i}"
        shutil.copy(out / "config.json", dest / f"train_config{suffix}.json")
    return dest


def main(argv: list[str] | None = None) -> int:
    from training.longspec.train import main as train

    parser = argparse.ArgumentParser(
        prog="python -m training.longspec.recipe", description=__doc__.split("\n")[0]
    )
    parser.add_argument("recipe", type=Path)
    parser.add_argument("--dry-run", action="store_true", help="print each run's command, run nothing")
    args = parser.parse_args(argv)
    try:
        recipe = load(args.recipe)
        plan = commands(recipe)
        for run, out, argv_run in plan:
            print("python -m training.longspec " + " ".join(argv_run), flush=True)
            if args.dry_run:
                continue
            if run.get("continuations") and not (out / "generated.json").exists():
                out.mkdir(parents=True, exist_ok=True)
                shutil.copy(run["continuations"], out / "generated.json")
            if train(argv_run) != 0:
                return 2
            if run.get("record"):
                record = Path(run["record"])
                record.mkdir(parents=True, exist_ok=True)
                shutil.copy(out / "log.csv", record / "log.csv")
                shutil.copy(out / "draft" / "training.json", record / "training.json")
        if recipe.get("ship") and not args.dry_run:
            print(f"shipped to {ship(recipe, plan)}")
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
