"""Every option of every config group composes; every option that needs no hub also instantiates."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from runners.schemas import register_schemas

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
GROUPS = ["model", "draft", "decoder", "kv", "task", "launcher", "experiment", "scale", "debug"]
OPTIONS = [
    (g, p.stem) for g in GROUPS for p in sorted((CONF / g).glob("*.yaml")) if not p.stem.endswith(".example")
]
HUB_MODELS = {p.stem for p in (CONF / "model").glob("*.yaml") if "source: hub" in p.read_text()}
# the papers' architectures with random weights (7-8B parameters: built on a GPU, checked below unbuilt)
SHAPE_MODELS = {p.stem for p in (CONF / "model").glob("*.yaml") if "source: config" in p.read_text()}


def _compose(*overrides: str):
    register_schemas()
    with initialize_config_dir(str(CONF), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}={o}" for g, o in OPTIONS])
def test_option_composes(group, option):
    extra = ["model.name=some/model"] if (group, option) == ("model", "hf") else []
    extra += ["draft.name=some/model"] if (group, option) == ("draft", "hf") else []
    cfg = _compose(f"{group}={option}", *extra)
    if group in ("model", "decoder", "kv", "task"):
        assert "_target_" in cfg[group], f"{group}/{option}.yaml needs a _target_"


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF / "kv").glob("*.yaml")))
def test_kv_option_instantiates(option):
    cfg = _compose(f"kv={option}")
    assert instantiate(cfg.kv).name


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF / "decoder").glob("*.yaml")))
def test_decoder_option_instantiates(option, tiny_lm):
    from core.engine import Engine

    needs = {"sfi": (["kv=sfi"], {"tokenizer": tiny_lm.tokenizer})}  # decoders bound to a policy / tokenizer
    if option.startswith("longspec"):  # checkpoint: auto has no shipped draft for a tiny model
        needs[option] = (["decoder.checkpoint=random"], {})
    overrides, extra = needs.get(option, ([], {}))
    cfg = _compose(f"decoder={option}", *overrides)
    decoder = instantiate(cfg.decoder)(engine=Engine(tiny_lm.model), kv=instantiate(cfg.kv), **extra)
    assert isinstance(decoder.lossless, bool)


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF / "task").glob("*.yaml")))
def test_task_option_instantiates(option):
    cfg = _compose(f"task={option}")
    task = instantiate(cfg.task, limit=1)
    assert task.max_new_tokens > 0 and task.version


@pytest.mark.parametrize(
    "option", sorted(set(p.stem for p in (CONF / "model").glob("*.yaml")) - HUB_MODELS - SHAPE_MODELS)
)
def test_offline_model_option_instantiates(option):
    from core.models import packaged_available

    cfg = _compose(f"model={option}")
    if cfg.model.source == "packaged" and not packaged_available(cfg.model.name):
        pytest.skip(f"packaged model {cfg.model.name} not installed (qwen: scripts/install.sh --qwen)")
    lm = instantiate(cfg.model)
    assert lm.tokenizer is not None and lm.context_length > 0


@pytest.mark.parametrize("option", sorted(SHAPE_MODELS))
def test_shape_model_options_name_a_config_of_a_paper_model(option):
    import json

    from transformers import AutoConfig

    cfg = _compose(f"model={option}")
    fields = json.loads((CONF.parent / cfg.model.name).read_text())
    config = AutoConfig.for_model(fields.pop("model_type"), **fields)
    assert config.num_hidden_layers == 32 and config.hidden_size == 4096 and cfg.model.dtype == "bfloat16"


def test_slurm_launcher_resolves():
    cfg = _compose("launcher=slurm")
    assert "SlurmLauncher" in cfg.hydra.launcher._target_


def test_fafo_cpu_preset_is_the_tested_one():
    """The preset the lossless tests and bench_fafo name as conf/decoder/fafo_cpu.yaml is the file's."""
    from benchmarks.bench_fafo import CPU
    from tests.helpers import CPU_PRESET

    cfg = _compose("decoder=fafo_cpu").decoder
    assert {key: cfg[key] for key in CPU_PRESET} == CPU_PRESET == CPU


@pytest.mark.parametrize("option", sorted(p.stem for p in (CONF / "draft").glob("*.yaml")))
def test_draft_option_builds(option, tiny_lm):
    """Every draft option composes with decoder=triforce; the ones that need no hub build a draft model
    (the self-draft with one layer of the two-layer tiny model) and a TriForce decoder around it."""
    from core.engine import Engine
    from decoders.draft_model import build_draft

    extra = ["draft.name=some/model"] if option == "hf" else []
    cfg = _compose("decoder=triforce", f"draft={option}", *extra)
    assert cfg.draft.kind in ("none", "self_layers", "hub", "packaged", "tiny")
    if cfg.draft.kind in ("hub", "packaged"):  # a real model (packaged: built in the TriForce tests)
        assert cfg.draft.name
        return
    if cfg.draft.kind == "self_layers":
        cfg.draft.layers = 1
    eng = Engine(tiny_lm.model)
    draft = build_draft(cfg.draft, tiny_lm, eng)
    decoder = instantiate(cfg.decoder)(engine=eng, kv=instantiate(cfg.kv), draft=draft)
    assert decoder.lossless and (draft is None) == (option == "none")


def test_scale_cpu_slices_any_experiment_and_says_so():
    """scale=cpu overrides the experiment's sample count and budgets (not its sweep), is recorded by
    name, and leaves the paper protocol untouched by default; explicit budget fractions still win."""
    from omegaconf import OmegaConf

    paper = _compose("experiment=fafo_table11")
    cpu = _compose("experiment=fafo_table11", "scale=cpu")
    assert paper.scale.name == "paper" and paper.run.limit is None and paper.run.max_new_tokens is None
    assert OmegaConf.to_container(paper.kv, resolve=True)["budget_frac"] is None
    assert cpu.scale.name == "cpu" and cpu.run.limit == 8 and cpu.run.stratify
    assert cpu.run.max_new_tokens == 64
    assert cpu.model.dtype == "float32" and OmegaConf.to_container(cpu.kv, resolve=True)["budget_frac"] == 0.1
    assert cpu.hydra.sweeper.params["decoder.k"] == "4,5,6,7,8,9"
    explicit = _compose("experiment=triforce_table8a_cpu", "scale=cpu")
    assert OmegaConf.to_container(explicit.kv, resolve=True)["budget_frac"] == 0.034
    assert _compose("scale=cpu", "run.limit=2").run.limit == 2  # the command line wins


def test_scale_paper_slice8_keeps_the_paper_settings_on_fewer_samples_and_says_so():
    """scale=paper_slice8 changes only the sample count (8, stratified); captions name the preset."""
    import pandas as pd
    from omegaconf import OmegaConf

    from analysis.fafo_paper import scale_label

    paper = _compose("experiment=fafo_table1")
    sliced = _compose("experiment=fafo_table1", "scale=paper_slice8")
    assert sliced.scale.name == "paper_slice8" and sliced.run.limit == 8 and sliced.run.stratify
    assert sliced.run.max_new_tokens is None and sliced.model.dtype == paper.model.dtype
    assert OmegaConf.to_container(sliced.kv, resolve=True) == OmegaConf.to_container(paper.kv, resolve=True)
    label = scale_label(pd.DataFrame({"scale": ["paper_slice8"]}))
    assert "NOT the paper's setting" in label and "8 of the task's samples" in label
    assert scale_label(pd.DataFrame({"scale": ["paper"]})) == ""


def test_gpu_checks_refuses_an_unknown_stage_before_writing(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_checks.sh"), str(out), "env", "bogus"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and done.stderr.startswith("error: ") and "bogus" in done.stderr
    assert not out.exists()


@pytest.mark.parametrize(("stage", "decoders"), [("graphs", 5), ("long", 5)])
def test_gpu_checks_run_stages_compose_as_configs(tmp_path, stage, decoders):
    """The graphed stages' run.py commands, taken from the script by an interpreter that only records
    them: each composes, with graphs on, and graphed vanilla comes first (every speedup is over it)."""
    calls = tmp_path / "calls"
    fake = tmp_path / "py"
    fake.write_text(f'#!/usr/bin/env bash\nshift\necho "$*" >> {calls}\n')
    fake.chmod(0o755)
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "gpu_checks.sh"), str(tmp_path / "out"), stage],
        env={"PATH": "/usr/bin:/bin", "PY": str(fake)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    runs = [line.split() for line in calls.read_text().splitlines()]
    assert len(runs) == decoders
    configs = [_compose(*(o for o in args if not o.startswith("run.out_dir"))) for args in runs]
    assert configs[0].decoder._target_.endswith("Vanilla") and configs[0].kv._target_.endswith("FullKV")
    assert all(c.run.cuda_graphs is True for c in configs)
    assert len({c.decoder._target_ for c in configs}) == decoders


def test_experiments_with_their_own_cpu_setting_are_not_labelled_paper():
    """Every conf/experiment/*_cpu.yaml fixes its own CPU-sized protocol: its records say
    scale=cpu_experiment; the other experiments and the default say paper; scale=cpu still wins."""
    names = sorted(p.stem for p in (CONF / "experiment").glob("*.yaml"))
    assert any(n.endswith("_cpu") for n in names)
    for name in names:
        want = "cpu_experiment" if name.endswith("_cpu") else "paper"
        assert _compose(f"experiment={name}").scale.name == want, name
    assert _compose().scale.name == "paper"
    assert _compose("experiment=longspec_table1_cpu", "scale=cpu").scale.name == "cpu"


@pytest.mark.parametrize("group", ["decoder", "kv"])
def test_every_registered_method_has_its_config_and_preset(group):
    """Each registry entry names a class with a `Config` dataclass (core.options) and a `name` equal to
    its key, and conf/<group>/<name>.yaml instantiates that class."""
    import dataclasses

    from hydra.utils import get_class

    from runners.identity import REGISTERED

    for name, where in REGISTERED[group].items():
        module, cls_name = where.split(":")
        cls = getattr(__import__(module, fromlist=[cls_name]), cls_name)
        assert cls.name == name and dataclasses.is_dataclass(cls.Config), where
        preset = CONF / group / f"{name}.yaml"
        assert get_class(_compose(f"{group}={name}")[group]._target_) is cls, preset


@pytest.mark.parametrize(("group", "option"), [o for o in OPTIONS if o[0] in ("decoder", "kv")])
def test_every_preset_validates_against_its_config(group, option):
    """A preset names only options its class's `Config` declares, each of the declared type."""
    from runners.identity import options_of

    cfg = _compose(f"{group}={option}")
    values = options_of(cfg[group], group)
    assert set(values) >= {k for k in cfg[group] if not str(k).startswith("_")}
