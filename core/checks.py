"""Checks for configuration values: each returns the value or raises one `HarnessError` naming the
field and the allowed range, which the entry point prints as a single `error:` line.

Decoders, KV policies and the runner validate their fields with these, once, in their constructors,
so that every bad value reads the same way: `decoder.k must be an integer >= 1, got 0`.
"""

from __future__ import annotations

import importlib
from collections.abc import Collection
from typing import Any

from core.types import HarnessError


def _bounds(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    parts = []
    if low is not None:
        parts.append(f"{'>' if low_open else '>='} {low}")
    if high is not None:
        parts.append(f"{'<' if high_open else '<='} {high}")
    return " and ".join(parts)


def _outside(value: float, low: float | None, high: float | None, low_open: bool, high_open: bool) -> bool:
    return (low is not None and (value <= low if low_open else value < low)) or (
        high is not None and (value >= high if high_open else value > high)
    )


def integer(field: str, value: Any, low: int | None = None, high: int | None = None) -> int:
    """An int (not a bool, not a float) within [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int) or _outside(value, low, high, False, False):
        rng = _bounds(low, high, False, False)
        raise HarnessError(f"{field} must be an integer{' ' + rng if rng else ''}, got {value!r}")
    return value


def number(
    field: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """An int or float (not a bool) within the bounds; `*_open` excludes that bound."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or value != value  # NaN
        or _outside(value, low, high, low_open, high_open)
    ):
        rng = _bounds(low, high, low_open, high_open)
        raise HarnessError(f"{field} must be a number{' ' + rng if rng else ''}, got {value!r}")
    return float(value)


def choice(field: str, value: Any, options: Collection[Any]) -> Any:
    """One of `options`."""
    if value not in options:
        raise HarnessError(f"{field} must be one of {', '.join(map(str, options))}; got {value!r}")
    return value


def flag(field: str, value: Any) -> bool:
    """A real boolean: YAML's true/false, not a string such as 'maybe' that Python would call truthy."""
    if not isinstance(value, bool):
        raise HarnessError(f"{field} must be true or false, got {value!r}")
    return value


def registered_class(kind: str, registry: dict[str, str], name: str) -> type:
    """The class `registry` (name -> "module:Class") holds under `name`, imported when asked for; an
    unknown name is one `HarnessError` naming the known ones (`unknown decoder 'x'; known: ...`)."""
    if name not in registry:
        raise HarnessError(f"unknown {kind} {name!r}; known: {', '.join(sorted(registry))}")
    module, cls = registry[name].split(":")
    return getattr(importlib.import_module(module), cls)
