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

from core.options import type_problem
from runners.schemas import register_schemas

OWN_SECTIONS = ("run", "sampling", "wandb")


def _parse(args: list[str]) -> list | None:
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        return OverridesParser.create().parse_overrides(args)
    except Exception:  # noqa: BLE001 - described by _parse_problem
        return None


def _parse_problem(args: list[str]) -> str:
    """Which argument Hydra's override grammar cannot read, and why, in one line."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    for arg in args:
        try:
            OverridesParser.create().parse_overrides([arg])
        except Exception as exc:  # noqa: BLE001
            first = next((line for line in str(exc).splitlines() if line.strip()), "")
            return f"{arg!r} is not key=value ({first.strip()})"
    return " ".join(args)


def _groups(conf: Path) -> list[str]:
    return [p.name for p in conf.iterdir() if p.is_dir() and p.name not in ("train",)]


def _unknown(key: str, node: DictConfig) -> str:
    parent = key.rpartition(".")[0]
    keys = sorted(str(k) for k in node if not str(k).startswith("_"))
    if not keys:  # e.g. kv=full: nothing to set
        return f"unknown key {key}; {parent} has no settings"
    return f"unknown key {key}; {parent} has: {', '.join(keys)}"


def _own_section_problem(key: str, base: DictConfig, conf: Path) -> str | None:
    top, _, rest = key.partition(".")
    if top not in base and top.partition("/")[0] != "hydra" and not (conf / top).is_dir():
        return f"unknown key {top}; the config has: {', '.join(sorted({*map(str, base), *_groups(conf)}))}"
    if top in OWN_SECTIONS and not rest:
        return (
            f"{top} is a section, not a value: set its fields ({top}.<field>=...); "
            + _unknown(f"{top}.?", base[top]).partition("; ")[2]
        )
    if top not in OWN_SECTIONS or not rest:
        return None
    parent_path, _, leaf = key.rpartition(".")
    parent = OmegaConf.select(base, parent_path)
    if not isinstance(parent, DictConfig) or leaf not in parent:
        return _unknown(key, parent if isinstance(parent, DictConfig) else base[top])
    return None


def compose_checked(args: list[str], conf: Path) -> tuple[DictConfig | None, str | None]:
    """The config `args` compose to, or the one-line problem with them (a key the chosen
    decoder/kv/task/model does not have, a bad value type)."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import ConfigCompositionException, HydraException

    register_schemas()
    try:
        with initialize_config_dir(str(conf), version_base="1.3"):
            return compose("config", overrides=args), None
    except (ConfigCompositionException, HydraException) as exc:
        problem = type_problem(exc)  # a value of the wrong type for a decoder's or a policy's option
        if problem:
            return None, problem
        text = f"{exc}\n{exc.__cause__ or ''}"
        bad = re.search(r"Could not override '([^']+)'", text)
        if bad and ("not in struct" in text or "Key '" in text):
            key = bad.group(1)
            parent = key.rpartition(".")[0]
            rest = [a for a in args if not a.lstrip("+~").startswith(f"{key}=")]
            try:
                with initialize_config_dir(str(conf), version_base="1.3"):
                    node = OmegaConf.select(compose("config", overrides=rest), parent) if parent else None
            except Exception:  # noqa: BLE001
                node = None
            if isinstance(node, DictConfig):
                return None, _unknown(key, node)
            return None, f"unknown key {key}"
        first = next((line for line in text.splitlines() if line.strip()), text)
        return None, f"cannot compose the config: {first.strip()}"


def _compose_problem(args: list[str], conf: Path) -> str | None:
    return compose_checked(args, conf)[1]


def job_overrides(argv: list[str], conf: Path) -> list[list[str]] | str:
    """The overrides of every job the command line runs (one, or each of a sweep's combinations,
    the sweep of an experiment's `hydra.sweeper.params` included), without Hydra's own `hydra.*`
    keys; or the one-line problem with them."""
    from hydra import initialize_config_dir
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode

    args = [a for a in argv if not a.startswith("-")]
    own = [a for a in args if not a.startswith("hydra")]
    if not any(a in ("-m", "--multirun") for a in argv):
        return [own]
    register_schemas()
    try:
        with initialize_config_dir(str(conf), version_base="1.3"):
            loader = GlobalHydra.instance().config_loader()
            base = loader.load_configuration("config", overrides=args, run_mode=RunMode.MULTIRUN)
        params = OmegaConf.select(base, "hydra.sweeper.params") or {}
        listed = [f"{k}={v}" for k, v in params.items()] + own
        batches = BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(listed), None)
    except Exception as exc:  # noqa: BLE001 - any failure to expand the sweep is the user's input
        first = next((line for line in str(exc).splitlines() if line.strip()), repr(exc))
        return f"cannot expand the sweep: {first.strip()}"
    return [job for batch in batches for job in batch]


def check_overrides(argv: list[str], conf: Path) -> str | None:
    """The one-line problem with the command line's overrides, or None."""
    sweep = any(a in ("-m", "--multirun") for a in argv)
    args = [a for a in argv if not a.startswith("-")]
    overrides = _parse(args)
    if overrides is None:
        return "cannot parse the command line: " + _parse_problem(args)
    base = OmegaConf.load(conf / "config.yaml")
    for o in overrides:
        problem = _own_section_problem(o.key_or_group, base, conf)
        if problem:
            return problem
    if sweep or any(o.is_sweep_override() for o in overrides):
        return None  # each job composes its own combination (run.py checks them all before any runs)
    return _compose_problem([a for a in args if not a.startswith("hydra")], conf)
