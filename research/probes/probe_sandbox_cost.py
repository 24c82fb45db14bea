"""What does the HumanEval sandbox cost per problem? Its canonical solutions, run in turn through the
sandbox of a baseline commit and through this tree's (with and without namespaces).

    python -m research.probes.probe_sandbox_cost [--limit 164] [--baseline b827ea4]

Each problem runs under every sandbox one after the other, so a machine whose load drifts charges them
alike. Prints per sandbox the mean and median seconds per problem and the problems that did not pass
(every canonical solution must pass under each).
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tasks import sandbox
from tasks.humaneval import HumanEval

REPO = Path(__file__).resolve().parents[2]


def baseline_sandbox(commit: str) -> Callable[..., object]:
    """`run_python` of tasks/sandbox.py as it was at `commit` (loaded from `git show`)."""
    source = subprocess.run(
        ["git", "show", f"{commit}:tasks/sandbox.py"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    folder = Path(tempfile.mkdtemp(prefix="sandbox-baseline-"))
    (folder / "baseline_sandbox.py").write_text(source)
    spec = importlib.util.spec_from_file_location("baseline_sandbox", folder / "baseline_sandbox.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["baseline_sandbox"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.run_python


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=164)
    ap.add_argument("--baseline", default="b827ea4", help="the commit whose sandbox is the baseline")
    args = ap.parse_args(argv)
    task = HumanEval()
    old = baseline_sandbox(args.baseline)
    sandboxes = {
        f"{args.baseline}": lambda p: old(p, timeout_s=task.timeout_s),
        "this tree": lambda p: sandbox.run_python(p, timeout_s=task.timeout_s),
        "this tree, isolation=process": lambda p: sandbox.run_python(
            p, timeout_s=task.timeout_s, isolation="process"
        ),
    }
    print(f"this tree's layers: {'+'.join(sandbox.sandbox_layers())}")
    seconds: dict[str, list[float]] = {name: [] for name in sandboxes}
    failed: dict[str, list[str]] = {name: [] for name in sandboxes}
    for sample in task.load()[: args.limit]:
        program = task.program(sample, sample.reference["canonical_solution"])
        for name, run in sandboxes.items():
            start = time.perf_counter()
            result = run(program)
            seconds[name].append(time.perf_counter() - start)
            if not result.passed:
                failed[name].append(sample.sample_id)
    for name, values in seconds.items():
        print(
            f"{name:30s} n={len(values)} mean {statistics.mean(values) * 1000:.1f} ms, "
            f"median {statistics.median(values) * 1000:.1f} ms; not passed: {failed[name] or 'none'}"
        )


if __name__ == "__main__":
    main()
