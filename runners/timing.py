"""Clocks and memory probes, used by the runner and the benchmarks: decoders never time themselves.

A decoder only reports counts; `Counts.on_prefill_done` marks the end of its prefill, so the time after
the last mark is decode time. The runner and every benchmark that compares decoders time a generation
through `timed_generate` instead of each keeping its own copy of the stamp-and-subtract pattern."""

from __future__ import annotations

import contextlib
import resource
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from core.replay import Replay
from core.types import Counts
from runners.critical_path import ReadStamps, critical_host_s
from runners.forwards import MethodPatch, draft_forwards


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class SampleClock:
    """Times one generation: start -> prefill done (stamped by the decoder's counts hook) -> end."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.t0 = self.t_prefill = self.t_end = 0.0

    def start(self) -> None:
        synchronize(self.device)
        reset_peak_memory(self.device)
        self.t0 = self.t_prefill = time.perf_counter()

    def prefill_done(self) -> None:
        synchronize(self.device)
        self.t_prefill = time.perf_counter()

    def stop(self) -> None:
        synchronize(self.device)
        self.t_end = time.perf_counter()

    @property
    def prefill_s(self) -> float:
        return self.t_prefill - self.t0

    @property
    def decode_s(self) -> float:
        return self.t_end - self.t_prefill

    @property
    def wall_s(self) -> float:
        return self.t_end - self.t0


class ForwardTimes:
    """Each timed forward's seconds and host stamps. On CUDA the seconds come from events recorded around
    the forward on the current stream: nothing waits for the device, so the host queues ahead as it would
    untimed (a synchronisation around every forward would serialise the host's work with the device's and
    charge the decoder for waits it does not make), and they are resolved with one wait when read.
    Elsewhere a forward returns when it is done: its host stamps give its seconds. `spans`: the host's
    (start, end) of each call, `time.perf_counter` (`runners.critical_path`)."""

    def __init__(self, device: torch.device) -> None:
        self.event = torch.cuda.Event if device.type == "cuda" else None  # a test may set its own
        self.spans: list[tuple[float, float]] = []
        self._seconds: list[float] = []
        self._events: list[tuple[Any, Any]] = []  # (start, end) not read yet

    def begin(self) -> tuple[float, Any]:
        start = None
        if self.event is not None:
            start = self.event(enable_timing=True)
            start.record()
        return time.perf_counter(), start

    def end(self, begun: tuple[float, Any]) -> None:
        t0, start = begun
        t1 = time.perf_counter()
        if start is not None:
            end = self.event(enable_timing=True)
            end.record()
            self._events.append((start, end))
        else:
            self._seconds.append(t1 - t0)
        self.spans.append((t0, t1))

    @property
    def seconds(self) -> list[float]:
        if self._events:
            self._events[-1][1].synchronize()
            self._seconds += [a.elapsed_time(b) / 1e3 for a, b in self._events]  # milliseconds
            self._events.clear()
        return self._seconds


class StepClock:
    """Wraps `engine.step` until `close()` (or the end of a `with` block): records the rows, cache length
    and seconds (`ForwardTimes`) of every forward, and whether it took (with graphs off: would take) the
    fixed-shape forward (`fixed`, from the engine's count). `mark()` notes where the decode phase starts
    (at the prefill mark); `seconds_since_mark` sums the forwards after it."""

    def __init__(self, engine) -> None:
        self.engine, self.inner = engine, engine.step
        self.times = ForwardTimes(engine.device)
        self.shapes: list[tuple[int, int]] = []  # (rows, cache length) of each forward
        self.fixed: list[bool] = []
        self.marked_at = 0
        engine.step = self

    def __call__(self, tokens, position_ids, view, *args, **kwargs):
        eng = self.engine
        length, fixed = eng.length, getattr(eng, "fixed_shape_steps", 0)
        begun = self.times.begin()
        out = self.inner(tokens, position_ids, view, *args, **kwargs)
        self.times.end(begun)
        self.shapes.append((tokens.numel(), length))
        self.fixed.append(getattr(eng, "fixed_shape_steps", 0) != fixed)
        return out

    @property
    def calls(self) -> list[tuple[int, int, float]]:
        """(rows, cache length, seconds) of every forward."""
        return [(r, n, s) for (r, n), s in zip(self.shapes, self.times.seconds, strict=True)]

    @property
    def spans(self) -> list[tuple[float, float]]:
        return self.times.spans

    def mark(self) -> None:
        self.marked_at = len(self.shapes)

    @property
    def seconds(self) -> float:
        return sum(self.times.seconds)

    @property
    def seconds_since_mark(self) -> float:
        return sum(self.times.seconds[self.marked_at :])

    @property
    def forwards_since_mark(self) -> int:
        return len(self.shapes) - self.marked_at

    @property
    def static_frac_since_mark(self) -> float:
        """Share of the forwards after the mark that took (or, with graphs off, would take) the
        fixed-shape forward; NaN without any."""
        after = self.fixed[self.marked_at :]
        return sum(after) / len(after) if after else float("nan")

    def close(self) -> None:
        if vars(self.engine).get("step") is self:
            del self.engine.step  # the class's own method again

    def __enter__(self) -> StepClock:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class DraftClock:
    """Times a decoder's draft model (`decoder.draft`, when it has one) like `StepClock` times the
    target: each method its class names in `FORWARDS` is wrapped until `close()`, its calls' seconds
    summed (`ForwardTimes`); `mark()` notes where decode starts."""

    def __init__(self, decoder, device: torch.device) -> None:
        self.times = ForwardTimes(device)
        self.fixed: list[bool] = []  # per forward: did its engine take the fixed-shape path
        self.marked_at = self.depth = 0
        draft = getattr(decoder, "draft", None)
        # what counts the draft's fixed-shape forwards: the draft itself (LongSpec's, which has no engine
        # of its own) or its engine (a draft model); a draft with neither never takes them
        self.counter = draft if hasattr(draft, "fixed_shape_steps") else getattr(draft, "engine", None)
        self._patch = MethodPatch(draft_forwards(decoder), self._timed)

    def _fixed_steps(self) -> int:
        return getattr(self.counter, "fixed_shape_steps", 0)

    def _timed(self, inner: Callable) -> Callable:
        def forward(*args, **kwargs):
            if self.depth:  # a forward inside another one is timed by the outer one
                return inner(*args, **kwargs)
            fixed = self._fixed_steps()
            begun = self.times.begin()
            self.depth += 1
            try:
                out = inner(*args, **kwargs)
            finally:
                self.depth -= 1
            self.times.end(begun)
            self.fixed.append(self._fixed_steps() != fixed)
            return out

        return forward

    @property
    def seconds_each(self) -> list[float]:
        return self.times.seconds

    @property
    def spans(self) -> list[tuple[float, float]]:
        return self.times.spans

    def mark(self) -> None:
        self.marked_at = len(self.times.spans)

    @property
    def seconds_since_mark(self) -> float:
        return sum(self.times.seconds[self.marked_at :])

    @property
    def static_frac_since_mark(self) -> float:
        """Share of the draft's forwards after the mark whose engine took (with graphs off: would take)
        the fixed-shape forward; NaN without any (no draft model, or it never ran)."""
        after = self.fixed[self.marked_at :]
        return sum(after) / len(after) if after else float("nan")

    def close(self) -> None:
        self._patch.undo()  # the class's own methods again

    def __enter__(self) -> DraftClock:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class DecodeClocks:
    """The clocks of one timed generation, as a `with` block: the target's forwards (`forwards`, a
    `StepClock`), the draft model's (`drafts`, a `DraftClock`) and the reads of the device
    (`runners.critical_path.ReadStamps`). `mark()` at the prefill's end (`timed_generate`'s
    `on_prefill_done`); after the block, `host_s(timed)` is the decoder's own decode host time and
    `critical_s(timed)` the part of it a GPU would wait for. Both take the decode window from the
    generation's clock (`Timed.decode_window`), not from the block's edges: time spent after the clock
    stopped (returning, building the `Timed`) is in neither `decode_s` nor the critical time, so the
    critical time never exceeds the host time it is a part of."""

    def __init__(self, decoder) -> None:
        self.decoder = decoder
        self.captures_from = self.captures_to = 0

    def __enter__(self) -> DecodeClocks:
        eng = self.decoder.engine
        self.forwards = StepClock(eng)
        self.drafts = DraftClock(self.decoder, eng.device)
        self.reads = ReadStamps().__enter__()
        self.captures_from = self.captures_to = Replay.total_captures
        return self

    def mark(self) -> None:
        self.forwards.mark()
        self.drafts.mark()
        self.captures_from = Replay.total_captures

    def __exit__(self, *exc) -> None:
        self.captures_to = Replay.total_captures
        self.reads.__exit__(*exc)
        self.drafts.close()
        self.forwards.close()

    @property
    def captures_since_mark(self) -> int:
        """CUDA graphs captured during the decode (target's, draft's): each costs a few eager forwards and
        the capture inside the timed decode, which a warm-up that ran the same block sizes avoids."""
        return self.captures_to - self.captures_from

    def host_s(self, timed: Timed) -> float:
        """Of the generation's decode seconds, those outside the target's and the draft model's forwards
        after the mark: the decoder's own host time."""
        return timed.decode_s - self.forwards.seconds_since_mark - self.drafts.seconds_since_mark

    def critical_s(self, timed: Timed) -> float:
        f, d = self.forwards, self.drafts
        spans = f.spans[f.marked_at :] + d.spans[d.marked_at :]
        return critical_host_s(spans, self.reads.spans, *timed.decode_window)


@dataclass
class Timed:
    """One generation: its output ids, its counts, and its wall-clock seconds before and after the end
    of the prefill; `decode_window`: the `time.perf_counter` stamps of that end and of the generation's
    end, which `decode_s` spans."""

    output: list[int]
    counts: Counts
    prefill_s: float
    decode_window: tuple[float, float]

    @property
    def decode_s(self) -> float:
        return self.decode_window[1] - self.decode_window[0]

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
    return Timed(out, counts, clock.prefill_s, (clock.t_prefill, clock.t_end))


_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    elif _CLEAR_REFS.exists():
        with contextlib.suppress(OSError):
            _CLEAR_REFS.write_text("5")  # resets the process's peak RSS (VmHWM) on Linux


def peak_memory_mb(device: torch.device) -> float:
    """CUDA: max allocated since the last reset. CPU: peak resident set size (VmHWM)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    if _STATUS.exists():
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
