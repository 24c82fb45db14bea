"""Each method's option defaults live in one place, its `Config` (core.options): the presets in
conf/decoder/ and conf/kv/ extend its schema (runners.schemas) and hold only what differs."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from runners.identity import REGISTERED, method_class
from runners.overrides import compose_checked
from runners.schemas import SUFFIX, register_schemas
from tests.helpers import compose_config as _compose

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
PRESETS = [(g, p.stem) for g in ("decoder", "kv") for p in sorted((CONF / g).glob("*.yaml"))]


def own_values(group: str, option: str) -> tuple[str, dict]:
    """The preset's parent in its defaults list (a schema or another preset) and the options it sets
    itself (under `decoder:` for a preset of the global package, conf/decoder/triforce.yaml)."""
    text = (CONF / group / f"{option}.yaml").read_text()
    data = yaml.safe_load(text) or {}
    defaults = [d for d in data.pop("defaults", []) if isinstance(d, str) and d != "_self_"]
    assert len(defaults) == 1, f"{group}/{option}.yaml: extend one schema or preset, then _self_"
    if "@package _global_" in text:
        data = data.get(group, {})
    return defaults[0].partition("@")[0], {k: v for k, v in data.items() if not k.startswith("_")}


def default_of(config: type, key: str):
    field = next(f for f in dataclasses.fields(config) if f.name == key)
    return field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default


@pytest.mark.parametrize(("group", "option"), PRESETS, ids=[f"{g}={o}" for g, o in PRESETS])
def test_a_preset_holds_only_what_differs_from_its_parent(group, option):
    """Every key a preset sets is an option of its method's `Config`, and its value differs from the
    one its parent gives (the `Config` default for a schema, the composed value for a preset), unless
    it is an interpolation (`${oc.select:scale.kv_budget_frac,null}`): a default is written once."""
    parent, values = own_values(group, option)
    config = method_class(_compose(f"{group}={option}")[group], group).Config
    fields = {f.name for f in dataclasses.fields(config)}
    assert set(values) <= fields, f"{group}/{option}.yaml: {sorted(set(values) - fields)} not in {config}"
    for key, value in values.items():
        if isinstance(value, str) and "${" in value:
            continue
        if parent.endswith(SUFFIX):
            inherited = default_of(config, key)
        else:
            inherited = OmegaConf.to_container(_compose(f"{group}={parent}")[group], resolve=True)[key]
        assert value != inherited, f"{group}/{option}.yaml repeats {key}: {value!r} (from {parent})"


@pytest.mark.parametrize(("group", "option"), PRESETS, ids=[f"{g}={o}" for g, o in PRESETS])
def test_a_preset_composes_through_its_methods_schema(group, option):
    """The composed group is typed by its method's `Config` and has every option it declares, so each
    is overridable without `+` whether or not the preset names it."""
    node = _compose(f"{group}={option}")[group]
    config = method_class(node, group).Config
    assert OmegaConf.get_type(node) is config
    assert {f.name for f in dataclasses.fields(config)} <= set(node)


@pytest.mark.parametrize("group", ["decoder", "kv"])
def test_every_registered_method_has_a_schema(group):
    from hydra.core.config_store import ConfigStore

    register_schemas()
    register_schemas()  # idempotent
    stored = ConfigStore.instance().repo[group]
    for name in REGISTERED[group]:
        assert f"{name}{SUFFIX}.yaml" in stored, name


def test_an_option_no_preset_names_is_overridable_and_typed():
    cfg = _compose("decoder=longspec_chain", "decoder.beam_temperature=0.5", "kv=h2o", "kv.recent=8")
    assert cfg.decoder.beam_temperature == 0.5 and cfg.kv.recent == 8
    cfg, problem = compose_checked(["decoder=longspec_chain", "decoder.beam_temperature=warm"], CONF)
    assert cfg is None and problem == "decoder.beam_temperature must be a number, got 'warm'"
    cfg, problem = compose_checked(["kv=h2o", "kv.recent=some"], CONF)
    assert cfg is None and problem == "kv.recent must be an integer or null, got 'some'"


def test_every_compose_path_registers_the_schemas():
    """A module that composes the config (Hydra's compose or main) registers the schemas first: without
    them no preset composes. (tests/test_lossless_longspec.py composes through
    tests.helpers.compose_config.)"""
    composes = re.compile(r"initialize_config_dir\(|@hydra\.main\(")
    files = [p for p in REPO.rglob("*.py") if ".venv" not in p.parts and "research" not in p.parts]
    missing = [
        str(p.relative_to(REPO))
        for p in files
        if composes.search(p.read_text()) and "register_schemas()" not in p.read_text()
    ]
    assert not missing, f"compose without runners.schemas.register_schemas(): {missing}"
