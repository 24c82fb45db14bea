"""The part of a decoder's host work that a GPU would wait for, measured on any device.

On a GPU the host queues a forward and goes on; the device waits for the host only after the host has
read a result back (the step's synchronisation): from then until the next forward is queued, nothing
runs on the device. Host work between queuing a forward and reading its result runs while the device
computes. A CPU runs each forward to the end before returning, so its host time is all serial; these
stamps split it the way a GPU would:
- `ReadStamps` notes when each read of a tensor's data through the Python API starts and ends (`tolist`,
  `item`, `int(t)`, `float(t)`, `bool(t)`, indexing with a tensor, `numpy`, `cpu`: the forms a decoder
  reads its step's result with; `runners.host_syncs` counts every kind of synchronisation, but puts
  each operator through Python, which no timed generation can afford);
- `critical_host_s` sums, over the gaps between forwards, the time from the end of the gap's first read
  to the next forward (a gap without a read waits for nothing), plus the whole gap after the prefill,
  whose end the clocks synchronised.
The split assumes the device's forward takes at least as long as the host work queued behind it, which
holds for the host's dictionary and list work against a GPU forward of a few milliseconds. A read of a
tensor that lives on the host counts as a read too, so the critical time is, if anything, overstated.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

READS = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__", "numpy", "cpu")


class ReadStamps:
    """While active (a `with` block), `(start, end)` of every call of the `READS` methods of a tensor."""

    def __init__(self) -> None:
        self.spans: list[tuple[float, float]] = []
        self._saved: dict[str, object] = {}

    def _stamped(self, inner: Callable) -> Callable:
        spans = self.spans

        def read(tensor: torch.Tensor, *args, **kwargs):
            t0 = time.perf_counter()
            out = inner(tensor, *args, **kwargs)
            spans.append((t0, time.perf_counter()))
            return out

        return read

    def __enter__(self) -> ReadStamps:
        for name in READS:
            self._saved[name] = vars(torch.Tensor).get(name)
            setattr(torch.Tensor, name, self._stamped(getattr(torch.Tensor, name)))
        return self

    def __exit__(self, *exc) -> None:
        for name, before in self._saved.items():
            if before is None:
                delattr(torch.Tensor, name)  # the base class's method again
            else:
                setattr(torch.Tensor, name, before)
        self._saved.clear()


def critical_host_s(
    forwards: Sequence[tuple[float, float]], reads: Sequence[tuple[float, float]], start: float, end: float
) -> float:
    """Seconds of host work between `start` (the device idle: the prefill's end) and `end` that a GPU
    would wait for, given the `(start, end)` spans of the forwards (target and draft) and of the reads."""
    spans = sorted(f for f in forwards if f[0] >= start)
    gaps = [(start, spans[0][0] if spans else end, True)]
    gaps += [(a[1], b[0], False) for a, b in zip(spans, spans[1:])]
    gaps += [(spans[-1][1], end, False)] if spans else []
    reads = sorted(reads)
    total, i = 0.0, 0
    for lo, hi, idle in gaps:
        while i < len(reads) and reads[i][0] < lo:
            i += 1
        if idle:
            total += hi - lo
        elif i < len(reads) and reads[i][1] <= hi:
            total += hi - reads[i][1]
    return total
