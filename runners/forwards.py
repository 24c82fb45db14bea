"""The model forwards a decoder runs, and wrapping them for a while: the clocks (`runners.timing`) and
the launch counter (`runners.host_syncs.forwards_apart`) both need to tell a decoder's forwards from
its own work, and wrap the same methods the same way."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def draft_forwards(dec: Any) -> list[tuple[Any, str]]:
    """(draft model, method name) of every forward of `dec`'s draft model (`dec.draft`, when it has one):
    the methods its class names in `FORWARDS`."""
    draft = getattr(dec, "draft", None)
    return [(draft, name) for name in getattr(draft, "FORWARDS", ())] if draft is not None else []


def model_forwards(dec: Any) -> list[tuple[Any, str]]:
    """The target's `engine.step` and the draft model's forwards of decoder `dec`."""
    return [(dec.engine, "step"), *draft_forwards(dec)]


class MethodPatch:
    """Replaces each `(instance, name)` method by `wrap(method)` on the instance until `undo()`, which
    puts back whatever instance-level attribute was there before (another wrapper, e.g. a clock) or
    removes the wrapper (the class's method again)."""

    def __init__(self, methods: list[tuple[Any, str]], wrap: Callable[[Callable], Callable]) -> None:
        self.saved = [(obj, name, vars(obj).get(name)) for obj, name in methods]
        for obj, name in methods:
            setattr(obj, name, wrap(getattr(obj, name)))

    def undo(self) -> None:
        for obj, name, before in reversed(self.saved):
            if before is None:
                vars(obj).pop(name, None)
            else:
                setattr(obj, name, before)
        self.saved = []
