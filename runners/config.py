"""Turning the composed config into parts the runner uses, with bad values as one clear error line:
parameters of a config group (for the run's identity), instantiation, positive integers, threads, the
engine's GEMM choice, the stop tokens."""

from __future__ import annotations

from typing import Any

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue

from core.engine import onednn_applies
from core.types import HarnessError


def group_params(node: Any) -> dict[str, Any]:
    """A config group's fields, resolved, without Hydra's `_partial_` flag."""
    return {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k not in ("_partial_",)}


# parameters added after runs were recorded, left out of a run's identity at their defaults so that those
# runs keep their ids: `block` (every decoder's), `lookup` and `beam_temperature` (LongSpec's)
DEFAULTS_OUT_OF_IDENTITY = {"block": "fixed", "lookup": 0, "beam_temperature": 1.0}


def decoder_params(node: Any) -> dict[str, Any]:
    """The decoder's parameters, without those at a default in `DEFAULTS_OUT_OF_IDENTITY`."""
    params = group_params(node)
    for key, default in DEFAULTS_OUT_OF_IDENTITY.items():
        if key in params and params[key] == default and not isinstance(params[key], bool):
            del params[key]
    return params


def build(node: Any, group: str, **kwargs: Any) -> Any:
    """`hydra.utils.instantiate` with user errors as one line: a HarnessError raised by the target
    surfaces as itself; a ValueError/TypeError of its constructor (a parameter out of range) and a
    missing mandatory field become a HarnessError naming the config group."""
    try:
        return instantiate(node, **kwargs)
    except MissingMandatoryValue as exc:
        raise HarnessError(f"{group}.{exc.key} is required (set {group}.{exc.key}=...)") from None
    except InstantiationException as exc:
        cause = exc.__cause__
        while cause is not None and not isinstance(cause, HarnessError):
            if isinstance(cause, (ValueError, TypeError)):
                raise HarnessError(f"{group}: {cause}") from None
            cause = cause.__cause__
        if cause is not None:
            raise cause from None
        raise


def stop_ids_for(tokenizer: Any, model: Any) -> set[int]:
    ids: set[int] = set()
    gen = getattr(model, "generation_config", None)
    for src in (getattr(gen, "eos_token_id", None), getattr(tokenizer, "eos_token_id", None)):
        if isinstance(src, int):
            ids.add(src)
        elif src:
            ids.update(int(x) for x in src)
    return ids


def positive_int(value: Any, what: str, allow_null: bool = False) -> int | None:
    """`value` as a positive integer (or None when `allow_null`), else one clear error."""
    if value is None and allow_null:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        also = " or null (the whole task)" if allow_null else ""
        raise HarnessError(f"{what} must be a positive integer{also}, got {value!r}")
    return value


def pin_threads(value: Any) -> int:
    """`run.threads` (null = torch's default count), set explicitly so that every timing records it."""
    n = torch.get_num_threads() if value is None else positive_int(value, "run.threads")
    torch.set_num_threads(n)
    return n


def resolve_linear(choice: str | None, lm) -> str:
    """`run.linear`: aten | onednn | auto (onednn where it applies: fp32 on an x86 CPU)."""
    choice = choice or "auto"
    if choice == "auto":
        return "onednn" if onednn_applies(lm.model) else "aten"
    if choice not in ("aten", "onednn"):
        raise HarnessError(f"run.linear must be aten, onednn or auto, got {choice!r}")
    if choice == "onednn" and not onednn_applies(lm.model):
        raise HarnessError("run.linear=onednn needs an fp32 model on an x86 CPU; use run.linear=auto")
    return choice


def resolve_cuda_graphs(choice, lm) -> bool:
    """`run.cuda_graphs`: true replays plain decode steps (one row or a verification block over the
    full cache) as CUDA graphs (core/decode_graph.py)."""
    if choice in (None, False):
        return False
    if choice is not True:
        raise HarnessError(f"run.cuda_graphs must be true or false, got {choice!r}")
    if lm.device.type != "cuda":
        raise HarnessError(
            f"run.cuda_graphs=true needs the model on a CUDA device (it is on {lm.device.type})"
        )
    return True


def resolve_warmup_s(choice, device: torch.device, gpu_default: float) -> float:
    """`run.warmup_s`: seconds of untimed warm-up generations; null = `gpu_default` on CUDA, 0 elsewhere."""
    if choice is None:
        return gpu_default if device.type == "cuda" else 0.0
    if isinstance(choice, bool) or not isinstance(choice, (int, float)) or choice < 0:
        raise HarnessError(f"run.warmup_s must be a number of seconds >= 0 or null, got {choice!r}")
    return float(choice)
