"""Command-line overrides checked before Hydra runs anything, so a typo is one clear line.

- Keys under the harness's own sections (`run.*`, `sampling.*`, `wandb.*`, defined in
  conf/config.yaml) must exist: `run.limitt=2` and Hydra's suggested `+run.limitt=2` (which would
  add an unused key and silently do nothing) are both refused with the list of keys that exist.
- Outside a sweep, the whole command line is composed once; any composition error (a key the chosen
  decoder/kv/task/model does not have, a bad value type) becomes one line naming the key.
"""

from __future__ import annotations

import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

OWN_SECTIONS = ("run", "sampling", "wandb")


def _parse(args: list[str]) -> list | None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_overrides(args)
    except Exception:  # noqa: BLE001 - Hydra reports its own syntax errors
        return None


def _unknown(key: str, node: DictConfig) -> str:
    parent = key.rpartition(".")[0]
    keys = sorted(str(k) for k in node if not str(k).startswith("_"))
    return f"unknown key {key}; {parent} has: {', '.join(keys)}"


def _own_section_problem(key: str, base: DictConfig) -> str | None:
    top, _, rest = key.partition(".")
    if top not in OWN_SECTIONS or not rest:
        return None
    parent_path, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(base, parent_path)
    if not isinstance(parent, DictConfig) or leaf not in parent:
        return _unknown(key, parent if isinstance(parent, DictConfig) else base[top])
    return None


def _compose_problem(args: list[str], conf: Path) -> str | None:
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException, HydraException

    try:
        with initialize_config_dir(str(conf), version_base="1.3"):
            compose("config", overrides=args)
    except (ConfigCompositionException, HydraException) as exc:
        text = f"{exc}\n{exc.__cause__ or ''}"
        bad = re.search(r"Could not override '([^']+)'", text)
        if bad and "not in struct" in text:
            key = bad.group(1)
            parent = key.rpartition(".")[0]
            rest = [a for a in args if not a.lstrip("+~").startswith(f"{key}=")]
            try:
                with initialize_config_dir(str(conf), version_base="1.3"):
                    node = OmegaConf.select(compose("config", overrides=rest), parent)
            except Exception:  # noqa: BLE001
                node = None
            if isinstance(node, DictConfig):
                return _unknown(key, node)
            return f"unknown key {key}"
        first = next((line for line in text.splitlines() if line.strip()), text)
        return f"cannot compose the config: {first.strip()}"
    return None


def check_overrides(argv: list[str], conf: Path) -> str | None:
    """The one-line problem with the command line's overrides, or None."""
    sweep = any(a in ("-m", "--multirun") for a in argv)
    args = [a for a in argv if not a.startswith("-")]
    overrides = _parse(args)
    if overrides is None:
        return None
    base = OmegaConf.load(conf / "config.yaml")
    for o in overrides:
        problem = _own_section_problem(o.key_or_group, base)
        if problem:
            return problem
    if sweep or any(o.is_sweep_override() for o in overrides):
        return None  # each job composes its own combination; a bad one is reported by its job
    return _compose_problem([a for a in args if not a.startswith("hydra")], conf)
