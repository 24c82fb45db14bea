"""A method's options: one dataclass per decoder and per KV policy (its `Config`, beside its class) is
the one place each option, its type and its default live. The constructor fills it from its keyword
arguments, the pre-flight check validates a config group against it (an unknown key or a wrong type is
one `HarnessError` line), and a run's identity is its values (`runners.identity`).

An option added after runs were recorded is declared with `recorded_without(default)`: at that default
it stays out of the run identity, so the runs recorded before it existed keep their ids."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, ValidationError

from core.types import HarnessError

ABSENT_AT = "absent_from_identity_at"  # field metadata: the value at which the option leaves the run id


@dataclass
class NoOptions:
    """The options of a method that has none (vanilla, full KV)."""


def recorded_without(default: Any) -> Any:
    """A dataclass field with `default` that runs recorded before it existed did not name: at `default`
    it is left out of the run identity (their ids stay valid); any other value is part of it."""
    return dataclasses.field(default=default, metadata={ABSENT_AT: default})


def options(config: type, given: dict[str, Any]) -> Any:
    """`config` filled from keyword arguments (unknown ones: one HarnessError naming them)."""
    names = {f.name for f in dataclasses.fields(config)}
    unknown = sorted(set(given) - names)
    if unknown:
        raise TypeError(
            f"unknown option(s) {', '.join(unknown)}; {config.__name__} has: {', '.join(sorted(names))}"
        )
    return config(**given)


def _type_name(config: type, key: str) -> str:
    hint = str(next(f.type for f in dataclasses.fields(config) if f.name == key))
    for word, name in (("bool", "true or false"), ("int", "an integer"), ("float", "a number")):
        if hint.startswith(word) or hint.startswith(f"{word} |"):
            return name + (" or null" if "None" in hint else "")
    return hint


def wrong_type(config: type, group: str, key: str, value: Any) -> str:
    """The one line for `value` given to `config`'s option `key` when it has another type."""
    return f"{group}.{key} must be {_type_name(config, key)}, got {value!r}"


def type_problem(exc: BaseException | None) -> str | None:
    """The one line for an omegaconf ValidationError in `exc`'s causes that a `Config` schema raised
    (Hydra composes a preset against its `Config`, `runners.schemas`): `wrong_type`'s, or None."""
    while exc is not None:
        config = getattr(exc, "object_type", None)
        key, full_key = getattr(exc, "key", None), str(getattr(exc, "full_key", ""))
        declared = dataclasses.is_dataclass(config) and key in {f.name for f in dataclasses.fields(config)}
        if isinstance(exc, ValidationError) and declared and "." in full_key:
            return wrong_type(config, full_key.rpartition(".")[0], str(key), getattr(exc, "value", None))
        exc = exc.__cause__
    return None


def validated(config: type, node: Any, group: str) -> dict[str, Any]:
    """The config group `node` (its `_target_`/`_partial_` left out) merged over `config`'s defaults,
    resolved, as plain values: an unknown key or a value of the wrong type is one HarnessError line."""
    given = node if isinstance(node, DictConfig) else OmegaConf.create(dict(node))
    values = {k: v for k, v in OmegaConf.to_container(given, resolve=True).items() if not k.startswith("_")}
    try:
        merged = OmegaConf.merge(OmegaConf.structured(config), values)
    except ConfigKeyError as exc:
        keys = sorted(f.name for f in dataclasses.fields(config))
        has = f"{group} has: {', '.join(keys)}" if keys else f"{group} has no settings"
        raise HarnessError(f"unknown key {group}.{exc.key}; {has}") from None
    except ValidationError as exc:
        key = str(exc.key)
        raise HarnessError(wrong_type(config, group, key, values.get(key))) from None
    return OmegaConf.to_container(merged, resolve=True)


def identity_values(config: type, values: dict[str, Any]) -> dict[str, Any]:
    """`values` without the options at the value `recorded_without` declared for them."""
    absent = {f.name: f.metadata[ABSENT_AT] for f in dataclasses.fields(config) if ABSENT_AT in f.metadata}
    return {
        k: v for k, v in values.items() if not (k in absent and type(v) is type(absent[k]) and v == absent[k])
    }
