"""Turning the composed config into parts the runner uses, with bad values as one clear error line:
the typed, validated `run.*` settings (`check_config`, also run by run.py on every job of a command line
before anything is loaded or written), parameters of a config group (for the run's identity),
instantiation, threads, the engine's GEMM choice, the stop tokens."""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import OmegaConf
from omegaconf.errors import MissingMandatoryValue

from core import checks
from core.cost_curve import cache_dir
from core.engine import onednn_applies
from core.models import cache_root, needs_conversion
from core.sampling import Sampler
from core.sparse_attention import flash_available
from core.types import HarnessError
from kv_policies.checks import BACKENDS
from runners.identity import options_of
from tasks.datafile import read_bytes

LINEARS = ("aten", "onednn", "auto")
DTYPES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
MODEL_SOURCES = ("packaged", "hub", "tiny", "config")
TINY_ARCHS = ("llama", "qwen2")
TASK_SOURCES = ("auto", "package", "local", "hub")
WANDB_MODES = ("online", "offline", "disabled")
SEED_MAX = 2**32 - 1
CONF = Path(__file__).resolve().parents[1] / "conf"


@dataclass(frozen=True)
class RunSettings:
    """The `run.*` section (and the task's own `limit` / `max_new_tokens`), typed and checked."""

    limit: int | None  # samples per run (None = the whole task); the task's own limit wins over run.limit
    limit_field: str  # which field set it: run.limit or task.limit
    stratify: bool
    max_new_tokens: int | None  # None = the task's own value
    seed: int
    threads: int | None  # None = torch's default count
    warmup: bool
    warmup_s: float | None
    audit: bool
    keep_steps: bool
    count_syncs: int  # new tokens of the untimed sync-counting rerun of each generation (0 = none)
    prefill_chunk: int
    linear: str
    cuda_graphs: bool | str  # "emulate": captures emulated (runners.emulated_graphs)
    compile: bool  # the fixed-shape decode forwards compiled by inductor (core.decode_graph.compile_forward)
    out_dir: Path
    device: torch.device  # where model.device puts the model on this machine


@functools.cache
def run_defaults() -> dict[str, Any]:
    """The `run.*` defaults: conf/config.yaml's `run` section, the one place each is written."""
    return OmegaConf.to_container(OmegaConf.load(CONF / "config.yaml").run)


def _optional_int(field: str, value: Any, low: int, high: int | None = None) -> int | None:
    return None if value is None else checks.integer(field, value, low, high)


def run_settings(cfg: Any) -> RunSettings:
    """`cfg.run` (+ `task.limit`, `task.max_new_tokens`) checked field by field: one HarnessError naming
    the field and its allowed values for the first bad one."""
    run = cfg.run
    if not hasattr(run, "get"):
        raise HarnessError(f"run must be a section of settings (run.limit=..., run.seed=...), got {run!r}")
    get = lambda key: run.get(key, run_defaults()[key])  # noqa: E731 - a key the config lacks: conf's
    task = cfg.get("task") or {}
    own = task.get("limit")
    limit_field = "run.limit" if own is None else "task.limit"  # the task's own limit is more specific
    limit = _optional_int(limit_field, get("limit") if own is None else own, 1)
    if task.get("max_new_tokens") is not None:
        checks.integer("task.max_new_tokens", task.get("max_new_tokens"), 1)
    warmup_s = get("warmup_s")
    if warmup_s is not None:
        warmup_s = checks.number("run.warmup_s", warmup_s, 0)
    device = model_device(cfg.get("model") or {})
    cuda_graphs = graphs_choice(get("cuda_graphs"), device)
    linear = checks.choice("run.linear", get("linear"), LINEARS)
    compiled = checks.flag("run.compile", get("compile"))
    if compiled and linear == "onednn":  # inductor has no lowering for a prepacked oneDNN weight
        raise HarnessError(
            "run.compile=true compiles aten GEMMs, not prepacked oneDNN ones: use run.linear=aten"
        )
    return RunSettings(
        limit=limit,
        limit_field=limit_field,
        stratify=checks.flag("run.stratify", get("stratify")),
        max_new_tokens=_optional_int("run.max_new_tokens", get("max_new_tokens"), 1),
        seed=checks.integer("run.seed", get("seed"), 0, SEED_MAX),
        threads=_optional_int("run.threads", get("threads"), 1, os.cpu_count() or 1),
        warmup=checks.flag("run.warmup", get("warmup")),
        warmup_s=warmup_s,
        audit=checks.flag("run.audit", get("audit")),
        keep_steps=checks.flag("run.keep_steps", get("keep_steps")),
        count_syncs=checks.integer("run.count_syncs", get("count_syncs"), 0),
        prefill_chunk=checks.integer("run.prefill_chunk", get("prefill_chunk"), 1),
        linear=linear,
        cuda_graphs=cuda_graphs,
        compile=compiled,
        out_dir=writable_folder("run.out_dir", get("out_dir")),
        device=device,
    )


def model_device(model: Any) -> torch.device:
    """The device `model.device` names, checked against this machine: auto | cpu | cuda | cuda:<n>."""
    value = model.get("device", "auto")
    if value in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(value) if isinstance(value, str) else None
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise HarnessError(f"model.device must be auto, cpu, cuda or cuda:<index>, got {value!r}")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise HarnessError(
                f"model.device={value} but this machine has no CUDA device; use model.device=cpu"
            )
        if device.index is not None and device.index >= count:
            raise HarnessError(f"model.device={value}: this machine has CUDA devices 0..{count - 1}")
    return device


def check_model(model: Any, device: torch.device) -> None:
    """`model.*` fields that can be checked without loading it."""
    dtype = checks.choice("model.dtype", model.get("dtype", "float32"), DTYPES)
    if dtype in ("float16", "fp16") and device.type == "cpu":
        raise HarnessError(
            "float16 is very slow on CPU and not bit-stable; use model.dtype=bfloat16 or float32"
        )
    if "source" in model:
        source = checks.choice("model.source", model.get("source"), MODEL_SOURCES)
        if source == "tiny":
            checks.choice("model.arch", model.get("arch", "llama"), TINY_ARCHS)


def check_backends(cfg: Any, device: torch.device) -> None:
    """`decoder.backend` / `kv.backend`: one of the attention backends, flash only on a CUDA device."""
    for group in ("decoder", "kv"):
        node = cfg.get(group) or {}
        backend = node.get("backend") if hasattr(node, "get") else None
        if backend is None:
            continue
        checks.choice(f"{group}.backend", backend, BACKENDS)
        if backend == "flash" and not flash_available(device):
            raise HarnessError(
                f"{group}.backend=flash needs a CUDA device with flash-attn installed (the model goes to "
                f"{device.type}); use {group}.backend=dense, flex or sliced"
            )


def check_sections(cfg: Any) -> None:
    """`sampling.*`, `wandb.*`, the decoder's `block`, the task's `source` and `data_path`."""
    s = cfg.get("sampling") or {}
    Sampler(s.get("temperature", 0.0), s.get("top_p", 1.0), s.get("top_k", 0))
    w = cfg.get("wandb") or {}
    checks.flag("wandb.enabled", w.get("enabled", False))
    if w.get("mode") is not None:
        checks.choice("wandb.mode", w.get("mode"), WANDB_MODES)
    decoder = cfg.get("decoder") or {}
    if decoder.get("block") is not None:
        checks.choice("decoder.block", decoder.get("block"), ("fixed", "auto"))
    task = cfg.get("task") or {}
    if task.get("source") is not None:
        checks.choice("task.source", task.get("source"), TASK_SOURCES)
    data_path = task.get("data_path")
    if data_path:
        readable_file("task.data_path", data_path)


def check_options(cfg: Any) -> None:
    """The decoder's and the KV policy's options against their class's `Config` (core.options): a key
    it does not declare or a value of the wrong type is one error line, before anything is built."""
    for group in ("decoder", "kv"):
        node = cfg.get(group)
        if hasattr(node, "get") and node.get("_target_"):
            options_of(node, group)


def readable_file(field: str, value: Any) -> Path:
    """`value` as a file this process can read (its content is the task's to check)."""
    path = Path(str(value)).expanduser()
    if not path.exists():
        raise HarnessError(f"{field} {value} not found")
    if path.is_dir():
        raise HarnessError(f"{field}={value} is a folder, not a file: give the data file itself")
    if not path.is_file():  # a device, pipe or socket: refused, naming which, before anything is read
        read_bytes(path)
    if not os.access(path, os.R_OK):
        raise HarnessError(f"{field}={value} cannot be read (permission denied)")
    return path


def looks_local(value: Any) -> bool:
    """A setting that names a local path rather than a hub id (which is `org/name`, never absolute)."""
    return isinstance(value, str) and value.startswith(("/", "./", "../", "~"))


def local_folder(field: str, value: str, holds: str | None = None) -> Path:
    """`value` as an existing folder (holding the file `holds`, when given)."""
    path = Path(value).expanduser()
    if not path.exists():
        raise HarnessError(f"{field}={value} not found: give an existing folder, or a hub id (org/name)")
    if not path.is_dir():
        raise HarnessError(f"{field}={value} is a file, not a folder")
    if holds and not (path / holds).exists():
        raise HarnessError(
            f"model folder {value} holds no model (no {holds}); point {field} at a folder written by "
            "save_pretrained (config.json, weights, tokenizer) or at a hub id"
        )
    return path


def check_local_paths(cfg: Any) -> None:
    """Local folders named by the model, the draft and the decoder's checkpoint exist (and a model
    folder holds a model), before a model loads."""
    for group in ("model", "draft"):
        node = cfg.get(group) or {}
        hub = hasattr(node, "get") and "hub" in (node.get("source"), node.get("kind"))
        if hub and looks_local(node.get("name")):
            local_folder(f"{group}.name", node.get("name"), holds="config.json")
    decoder = cfg.get("decoder") or {}
    checkpoint = decoder.get("checkpoint") if hasattr(decoder, "get") else None
    if looks_local(checkpoint):
        local_folder("decoder.checkpoint", checkpoint)


def check_environment(cfg: Any) -> None:
    """The folders outside run.out_dir a run of `cfg` writes to, named by environment variables or
    settings: each a folder (or one that can be made) this process can write into, so that a wrong one
    stops the run before the model loads rather than after. A packaged model that is converted already
    only reads the harness cache, which may then be read-only."""
    packaged = [
        str(node.get("name"))
        for node in (cfg.get("model") or {}, cfg.get("draft") or {})
        if hasattr(node, "get") and "packaged" in (node.get("source"), node.get("kind"))
    ]
    if packaged:
        where = environment_folder("HARNESS_CACHE", cache_root())
        if any(needs_conversion(name) for name in packaged):
            writable_folder(where, str(cache_root()))
    decoder = cfg.get("decoder") or {}
    if hasattr(decoder, "get") and decoder.get("block") == "auto":
        writable_folder(environment_folder("HARNESS_COST_CACHE", cache_dir()), str(cache_dir()))
    w = cfg.get("wandb") or {}
    if w.get("enabled") and w.get("dir"):
        writable_folder("wandb.dir", str(w.get("dir")))


def environment_folder(var: str, path: Path) -> str:
    """How error lines name the folder `path`: by its environment variable when the user set it (the
    default otherwise); refuses a path that is, or lies below, a file."""
    field = var if var in os.environ else f"the default of {var}"
    existing = next(p for p in (path, *path.parents) if p.exists() or p == p.parent)
    if not existing.is_dir():
        below = "is a file" if existing == path else f"lies below {existing}, which is a file"
        raise HarnessError(f"{field}={path} {below}: set {var} to a folder")
    return field


class _NeedsModel(Exception):  # noqa: N818 - a signal, not an error: this check needs the real model
    """Raised by the stand-in engine: what comes next can only be checked with the model loaded."""


class _StandIn:
    """Stands in for the engine (and a tokenizer, a draft) while a decoder checks its own fields:
    touching it in any way ends the check."""

    def __getattr__(self, name: str) -> Any:
        raise _NeedsModel(name)


def check_decoder(cfg: Any) -> None:
    """The KV policy's and the decoder's own checks of their fields, without a model: the decoder is
    constructed over a stand-in engine, and what it would do with the engine is left to the job."""
    kv = build(cfg.kv, "kv")
    partial = build(cfg.decoder, "decoder")
    target = getattr(partial, "func", partial)
    extra = {name: _StandIn() for name in getattr(target, "needs", ())}
    try:
        partial(engine=_StandIn(), kv=kv, sampler=None, **extra)
    except HarnessError:
        raise
    except Exception:  # noqa: BLE001, S110 - past its own checks, the decoder needs the real engine
        pass


def check_config(cfg: Any) -> RunSettings:
    """Everything about a composed config that can be checked before a model is loaded or anything is
    written; returns the typed `run.*` settings. Raises one HarnessError for the first bad field."""
    settings = run_settings(cfg)
    check_model(cfg.get("model") or {}, settings.device)
    check_backends(cfg, settings.device)
    check_sections(cfg)
    check_options(cfg)
    check_local_paths(cfg)
    check_environment(cfg)
    check_task(cfg, settings)
    return settings


def check_task(cfg: Any, settings: RunSettings) -> None:
    """The task is constructed, which runs its own checks of its fields (HumanEval's sandbox options,
    say) and loads no data; a local `task.data_path` is then read and every row checked now, before a
    model is loaded (a local file reads in well under a second): a damaged file is one error line naming
    its file, line and field, and in a sweep it stops the command before any job runs."""
    task = cfg.get("task")
    if task is None:
        return
    loader = build(task, "task", limit=settings.limit, stratify=settings.stratify)
    if not task.get("data_path") or task.get("source") == "hub":  # the hub is not read before the model
        return
    loader.limit_field = settings.limit_field
    loader.load()


def writable_folder(field: str, value: Any) -> Path:
    """`value` as a folder this process can write into. Tried by creating it (and the folders above it
    that are missing) with a probe file, then removing all of that again, so a refused run writes
    nothing and an accepted one meets no surprise later (read-only file systems included)."""
    if not isinstance(value, str) or not value.strip():
        raise HarnessError(f"{field} must be a folder path, got {value!r}")
    path = Path(value).expanduser()
    existing = next(p for p in (path, *path.parents) if p.exists() or p == p.parent)
    if not existing.is_dir():
        where = "is a file" if existing == path else f"lies below {existing}, which is a file"
        raise HarnessError(f"{field}={value} {where}: give a folder")
    created: list[Path] = []
    try:
        for level in reversed([p for p in (path, *path.parents) if p not in (existing, *existing.parents)]):
            level.mkdir()
            created.append(level)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise HarnessError(
            f"{field}={value} cannot be written ({exc.strerror}): give a writable folder"
        ) from None
    finally:
        for level in reversed(created):
            with contextlib.suppress(OSError):
                level.rmdir()
    return path


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


def resolve_linear(choice: str | None, lm, compiled: bool = False) -> str:
    """`run.linear`: aten | onednn | auto (onednn where it applies: fp32 on an x86 CPU; aten for compiled
    forwards, whose GEMMs inductor calls itself)."""
    choice = choice or "auto"
    if choice == "auto":
        return "onednn" if onednn_applies(lm.model) and not compiled else "aten"
    if choice not in ("aten", "onednn"):
        raise HarnessError(f"run.linear must be aten, onednn or auto, got {choice!r}")
    if choice == "onednn" and not onednn_applies(lm.model):
        raise HarnessError("run.linear=onednn needs an fp32 model on an x86 CPU; use run.linear=auto")
    return choice


def graphs_choice(choice: Any, device: torch.device) -> bool | str:
    """`run.cuda_graphs`: true replays the fixed-shape decode forwards as CUDA graphs (core/decode_graph.py),
    auto (null too) where the model is on a CUDA device, false never, "emulate" as the CPU tests emulate
    the captures (`runners.emulated_graphs`)."""
    if choice is None or choice == "auto":
        return device.type == "cuda"
    if choice == "emulate":  # captures emulated on any device (runners.emulated_graphs): a CPU rehearsal
        return choice
    if not isinstance(choice, bool):
        raise HarnessError(f"run.cuda_graphs must be true, false, auto or emulate, got {choice!r}")
    if choice and device.type != "cuda":
        raise HarnessError(f"run.cuda_graphs=true needs a CUDA device (the model is on {device.type})")
    return choice


def resolve_cuda_graphs(choice: Any, lm: Any) -> bool | str:
    """`run.cuda_graphs` for the loaded model (`graphs_choice` on its device)."""
    return graphs_choice(choice, lm.device)


def resolve_warmup_s(choice, device: torch.device, gpu_default: float) -> float:
    """`run.warmup_s`: seconds of untimed warm-up generations; null = `gpu_default` on CUDA, 0 elsewhere."""
    if choice is None:
        return gpu_default if device.type == "cuda" else 0.0
    if isinstance(choice, bool) or not isinstance(choice, (int, float)) or choice < 0:
        raise HarnessError(f"run.warmup_s must be a number of seconds >= 0 or null, got {choice!r}")
    return float(choice)
