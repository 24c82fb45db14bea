"""One generation timed the way the runner times it: `runners.timing.SampleClock`, split at the end of
the prefill.

A decoder only reports counts; `Counts.on_prefill_done` marks the end of its prefill, so the time after
the last mark is decode time. Benchmarks that compare decoders time them through `timed_generate`
instead of each keeping its own copy of the stamp-and-subtract pattern.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass

from core.types import Counts
from runners.timing import SampleClock, StepClock

__all__ = ["StepClock", "Timed", "timed_generate"]


@dataclass
class Timed:
    """One generation: its output ids, its counts, and its wall-clock seconds before and after the end
    of the prefill."""

    output: list[int]
    counts: Counts
    prefill_s: float
    decode_s: float

    @property
    def wall_s(self) -> float:
        return self.prefill_s + self.decode_s


def timed_generate(
    dec,
    prompt: list[int],
    new: int,
    stop: Collection[int] = (),
    *,
    keep_steps: bool = True,
    on_prefill_done: Callable[[], None] | None = None,
    on_finish: Callable[[], None] | None = None,
) -> Timed:
    """`dec.generate(prompt, new, stop)` on the runner's clock (device-synchronised stamps; the last
    prefill mark splits prefill from decode). `on_prefill_done` runs right after each mark (e.g. a
    forward clock starts counting decode forwards); `on_finish` runs once generation has stopped, also
    when it raised (e.g. hooks are removed)."""
    clock = SampleClock(dec.engine.device)
    marked: list[bool] = []

    def prefill_done() -> None:
        clock.prefill_done()
        marked.append(True)
        if on_prefill_done is not None:
            on_prefill_done()

    counts = Counts(on_prefill_done=prefill_done, keep_steps=keep_steps)
    clock.start()
    try:
        out = dec.generate(prompt, new, set(stop), counts)
        clock.stop()
    finally:
        if on_finish is not None:
            on_finish()
    if not marked:
        raise RuntimeError(f"{type(dec).__name__}.generate never reported the end of its prefill")
    return Timed(out, counts, clock.prefill_s, clock.decode_s)
