"""Research probes: one-off measurements behind the notes in research/. Not part of the harness:
product code never imports this package and `make test` does not run its tests."""

import os
from pathlib import Path

# a probe's printed tables are recorded beside the probes, not among the product's benchmarks
os.environ.setdefault("HARNESS_BENCH_OUT", str(Path(__file__).resolve().parent / "results"))
