"""`python -m tests.bad_inputs [-k TEXT]`: every case of `CASES` through run.py, one line each, then the
counts (the package's docstring says what each outcome means)."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import tests.bad_inputs as package
from tests.bad_inputs.cases import CASES
from tests.bad_inputs.running import run_case


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m tests.bad_inputs",
        description=package.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("-k", default="", help="only the cases whose arguments contain this text")
    args = ap.parse_args(argv)
    counts: dict[str, int] = {}
    for i, case in enumerate(c for c in CASES if args.k in c.id):
        with tempfile.TemporaryDirectory(prefix="bad-input-") as tmp:
            outcome, last = run_case(case, Path(tmp))
        counts[outcome] = counts.get(outcome, 0) + 1
        print(f"{i:3d} {outcome:9s} {case.id:45s} {last}", flush=True)
    print(" ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    return 0 if set(counts) <= {"clean", "skipped"} else 1


if __name__ == "__main__":
    sys.exit(main())
