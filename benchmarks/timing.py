"""The runner's clocks, for the benchmarks: `timed_generate` times one generation the way the runner
does (`runners.timing`), `StepClock` times every forward."""

from __future__ import annotations

from runners.timing import StepClock, Timed, timed_generate

__all__ = ["StepClock", "Timed", "timed_generate"]
