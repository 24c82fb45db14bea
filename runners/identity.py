"""A run's identity: everything that changes its numbers (model, dtype, device name, threads, linear,
prefill_chunk, decoder, kv, task, limits, seed, sampling). Its digest is the run id (`run_id_for`).

A decoder or a KV policy enters it by its method name and its options' values (its `Config`,
`core.options`), not by where its class lives: a class can move without orphaning records. The methods
recorded before that change keep the `_target_` they were recorded under (`RECORDED_AS` of each
registry), so every committed run keeps its id (tests/test_run_ids.py recomputes them all)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from hydra.utils import get_class
from omegaconf import DictConfig, OmegaConf

from core.options import identity_values, validated
from core.types import HarnessError
from decoders import registry as decoders
from kv_policies import registry as policies

# per group: {method name: the `_target_` its runs were recorded under}, and the registered names
RECORDED = {"decoder": decoders.RECORDED_AS, "kv": policies.RECORDED_AS}
REGISTERED = {"decoder": decoders.DECODERS, "kv": policies.REGISTRY}


def method_class(node: Any, group: str) -> type:
    """The class a decoder or kv config group instantiates (its `_target_`)."""
    target = node.get("_target_") if hasattr(node, "get") else None
    try:
        return get_class(str(target))
    except Exception:  # noqa: BLE001 - any failure to import it is the config's
        raise HarnessError(f"{group}._target_={target} names no importable class") from None


def options_of(node: Any, group: str) -> dict[str, Any]:
    """The group's options as its class's `Config` validates them (defaults filled in, values typed):
    an unknown key or a wrong type is one HarnessError line."""
    config = getattr(method_class(node, group), "Config", None)
    if config is None:  # a class from outside the registries, without a Config: its keys as given
        return {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if not k.startswith("_")}
    return validated(config, node, group)


def method_params(node: Any, group: str) -> dict[str, Any]:
    """How the decoder or kv group enters the run identity: its recorded name (`RECORDED`; a method
    registered since: its name; a class outside the registries: its path) and its options' values
    (without those `recorded_without` declares at their default)."""
    cls = method_class(node, group)
    name = getattr(cls, "name", None)
    if name in RECORDED[group]:
        head = {"_target_": RECORDED[group][name]}
    elif name in REGISTERED[group]:
        head = {"method": name}
    else:
        head = {"_target_": f"{cls.__module__}.{cls.__qualname__}"}
    values = options_of(node, group)
    config = getattr(cls, "Config", None)
    return {**head, **(identity_values(config, values) if config is not None else values)}


def group_params(node: Any) -> dict[str, Any]:
    """A config group's fields, resolved, without Hydra's `_partial_` flag (model, draft, task, sampling)."""
    return {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k not in ("_partial_",)}


@dataclass(frozen=True)
class Environment:
    """What the machine and the loaded model add to a run's identity."""

    model_name: str
    dtype: str
    device: str  # the device type: cpu | cuda
    device_name: str
    threads: int
    prefill_chunk: int
    linear: str
    cuda_graphs: bool | str  # True, "emulate", or False (absent from the identity)
    compile: bool


def run_identity(
    names: dict[str, str],
    env: Environment,
    params: dict[str, dict[str, Any]],
    task_version: str,
    limit: int | None,
    max_new_tokens: int,
    seed: int,
    stratify: bool,
) -> dict[str, Any]:
    """The identity of a run: `names` of its groups (the config choices), `params` of its groups
    (decoder, kv, draft, task, sampling)."""
    identity = {
        "model": names["model"],
        "model_name": env.model_name,
        "dtype": env.dtype,
        "device": env.device,
        "device_name": env.device_name,
        "threads": env.threads,
        "prefill_chunk": env.prefill_chunk,
        "linear": env.linear,
        "decoder": names["decoder"],
        "decoder_params": params["decoder"],
        "kv": names["kv"],
        "kv_params": params["kv"],
        "draft": names["draft"],
        "draft_params": params["draft"],
        "task": names["task"],
        "task_params": params["task"],
        "task_version": task_version,
        "limit": limit,
        "max_new_tokens": max_new_tokens,
        "seed": seed,
        "sampling": params["sampling"],
    }
    # each absent at its default, which keeps the ids of runs recorded before it existed
    if stratify:  # absent = the first `limit` samples
        identity["stratify"] = True
    if env.cuda_graphs:  # absent = no CUDA graphs
        identity["cuda_graphs"] = env.cuda_graphs  # True, or "emulate"
    if env.compile:  # absent = eager forwards
        identity["compile"] = True
    return identity


# the config groups and run.* fields behind a run's identity: two commands that agree on them are the
# same run in the same environment
IDENTITY_GROUPS = ("model", "draft", "decoder", "kv", "task", "sampling")
IDENTITY_RUN = (
    "limit",
    "max_new_tokens",
    "seed",
    "threads",
    "prefill_chunk",
    "linear",
    "cuda_graphs",
    "compile",
    "stratify",
)


def command_key(cfg: DictConfig) -> str:
    """A digest of what makes `cfg`'s run identity, known before the model loads (`CommandLock`)."""
    choices = cfg.get("choices") or {}
    parts = {
        "groups": {g: OmegaConf.to_container(cfg[g], resolve=True) for g in IDENTITY_GROUPS if cfg.get(g)},
        "run": {f: cfg.run.get(f) for f in IDENTITY_RUN},
        "choices": {g: choices.get(g) for g in IDENTITY_GROUPS},
    }
    return hashlib.sha1(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]
