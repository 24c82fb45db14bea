"""A verdict on one of a paper's claims from our runs' numbers and their 95% intervals over samples:
`holds`, `differs`, `within noise` (the intervals overlap, so the records cannot order the two), or
`not testable` (no run, or no interval and no value), always with the margin it rests on."""

from __future__ import annotations

import math
from dataclasses import dataclass

HOLDS, DIFFERS, NOISE, UNTESTABLE = "holds", "differs", "within noise", "not testable"
VERDICTS = (HOLDS, DIFFERS, NOISE, UNTESTABLE)


@dataclass(frozen=True)
class Measure:
    """A number of ours with its 95% interval (lo = hi = value where there is no spread to resample)."""

    value: float
    lo: float = math.nan
    hi: float = math.nan

    @property
    def missing(self) -> bool:
        return self.value is None or math.isnan(self.value)

    def bounds(self) -> tuple[float, float]:
        lo = self.value if math.isnan(self.lo) else self.lo
        hi = self.value if math.isnan(self.hi) else self.hi
        return lo, hi

    def text(self) -> str:
        lo, hi = self.bounds()
        return _num(self.value) if lo == hi else f"{_num(self.value)} [{_num(lo)}, {_num(hi)}]"


def _num(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def order(a: Measure, b: Measure) -> tuple[str, str]:
    """(verdict, margin) on the claim "a above b": holds when a's interval lies above b's, differs when
    below, within noise when they overlap."""
    if a.missing or b.missing:
        return UNTESTABLE, "no run of ours for one side"
    (a_lo, a_hi), (b_lo, b_hi) = a.bounds(), b.bounds()
    margin = f"{a.text()} vs {b.text()}, margin {a.value - b.value:+.3g}"
    if a_lo > b_hi:
        return HOLDS, margin
    if a_hi < b_lo:
        return DIFFERS, margin
    return NOISE, margin + " (intervals overlap)"


def at_least(a: Measure, threshold: float, what: str = "") -> tuple[str, str]:
    """(verdict, margin) on "a is at least `threshold`": the interval decides, as in `order`."""
    if a.missing:
        return UNTESTABLE, "no run of ours"
    lo, hi = a.bounds()
    margin = f"{a.text()} vs {what or f'{threshold:.3g}'}, margin {a.value - threshold:+.3g}"
    if lo >= threshold:
        return HOLDS, margin
    if hi < threshold:
        return DIFFERS, margin
    return NOISE, margin + " (interval spans it)"


def at_most(a: Measure, threshold: float, what: str = "") -> tuple[str, str]:
    """(verdict, margin) on "a is at most `threshold`" (e.g. a slowdown: speedup at most 1x): the
    interval decides, as in `at_least`."""
    if a.missing:
        return UNTESTABLE, "no run of ours"
    lo, hi = a.bounds()
    margin = f"{a.text()} vs {what or f'{threshold:.3g}'}, margin {a.value - threshold:+.3g}"
    if hi <= threshold:
        return HOLDS, margin
    if lo > threshold:
        return DIFFERS, margin
    return NOISE, margin + " (interval spans it)"
