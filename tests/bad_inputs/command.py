"""One bad command line of `CASES`: its arguments, the part of the `error:` line it must end in, and
whether only the runner (after the model loads) can refuse it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    message: str  # a part of the expected `error:` line
    model: bool = False  # only refused after the model is loaded (the pre-flight check cannot see it)
    env: tuple[tuple[str, str], ...] = ()  # environment variables set for the case

    @property
    def id(self) -> str:
        return " ".join([*(f"{k}={v}" for k, v in self.env), *self.args])


def _c(message: str, *args: str, model: bool = False, env: dict[str, str] | None = None) -> Case:
    return Case(tuple(args), message, model, tuple((env or {}).items()))
