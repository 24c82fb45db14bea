"""Everything that depends on transformers' module layout (pinned: transformers==5.23.0).

The engine reads weights from a loaded `LlamaForCausalLM` / `Qwen2ForCausalLM` and reuses the
model's own rotary embedding (so every RoPE scaling type HF supports - llama3, yarn, dynamic - is
exact), RMSNorm modules, activation, embedding and LM head. Nothing else in the project imports
transformers model internals; `tests/test_hf_compat.py` pins this module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F

SUPPORTED_ARCHS = {"llama", "qwen2", "mistral"}


@dataclass
class LayerWeights:
    ln1: torch.nn.Module
    ln2: torch.nn.Module
    wqkv: torch.Tensor
    bqkv: torch.Tensor | None
    wo: torch.Tensor
    wgu: torch.Tensor
    wdown: torch.Tensor
    norm1: Callable[[torch.Tensor], torch.Tensor] = field(init=False)  # ln1's forward (fused_norm)
    norm2: Callable[[torch.Tensor], torch.Tensor] = field(init=False)

    def __post_init__(self) -> None:
        self.norm1, self.norm2 = fused_norm(self.ln1), fused_norm(self.ln2)


@dataclass
class DecoderWeights:
    layers: list[LayerWeights]
    embed: torch.nn.Module
    norm: torch.nn.Module
    lm_head: torch.nn.Module
    act: Any
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    vocab_size: int
    max_positions: int
    dtype: torch.dtype
    device: torch.device
    final_norm: Callable[[torch.Tensor], torch.Tensor] = field(init=False)  # norm's forward (fused_norm)

    def __post_init__(self) -> None:
        self.final_norm = fused_norm(self.norm)


def fused_norm(module: torch.nn.Module) -> Callable[[torch.Tensor], torch.Tensor]:
    """An HF Llama/Qwen2 RMSNorm's forward as one `F.rms_norm` call where that is the same math: float32
    weights (bit-identical there: the module's upcast and downcast are no-ops). In other dtypes the
    module rounds the normalised input before the weight multiply, so the module itself is kept."""
    weight, eps = getattr(module, "weight", None), getattr(module, "variance_epsilon", None)
    if (
        not type(module).__name__.endswith("RMSNorm")
        or weight is None
        or weight.dtype != torch.float32
        or not isinstance(eps, float)
    ):
        return module
    return partial(F.rms_norm, normalized_shape=(weight.shape[0],), weight=weight, eps=eps)


def extract_weights(model: torch.nn.Module) -> DecoderWeights:
    cfg = model.config
    arch = getattr(cfg, "model_type", "?")
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(
            f"model type {arch!r} is not supported by the engine (supported: {sorted(SUPPORTED_ARCHS)})"
        )
    inner = model.model
    layers = []
    for layer in inner.layers:
        a, m = layer.self_attn, layer.mlp
        if getattr(a, "q_norm", None) is not None:
            raise ValueError("q/k-norm attention (Qwen3-style) is not supported by the engine")
        wqkv = _fuse([a.q_proj, a.k_proj, a.v_proj], "weight")
        bqkv = _fuse([a.q_proj, a.k_proj, a.v_proj], "bias") if a.q_proj.bias is not None else None
        if a.o_proj.bias is not None or getattr(m.down_proj, "bias", None) is not None:
            raise ValueError("output/MLP biases are not supported by the engine")
        layers.append(
            LayerWeights(
                ln1=layer.input_layernorm,
                ln2=layer.post_attention_layernorm,
                wqkv=wqkv,
                bqkv=bqkv,
                wo=a.o_proj.weight.detach(),
                wgu=_fuse([m.gate_proj, m.up_proj], "weight"),
                wdown=m.down_proj.weight.detach(),
            )
        )
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    p = next(model.parameters())
    return DecoderWeights(
        layers=layers,
        embed=inner.embed_tokens,
        norm=inner.norm,
        lm_head=model.lm_head,
        act=layers and inner.layers[0].mlp.act_fn,
        n_layers=len(layers),
        n_heads=cfg.num_attention_heads,
        n_kv_heads=cfg.num_key_value_heads,
        head_dim=head_dim,
        vocab_size=cfg.vocab_size,
        max_positions=int(getattr(cfg, "max_position_embeddings", 1 << 30)),
        dtype=p.dtype,
        device=p.device,
    )


def _fuse(modules: list[torch.nn.Module], attr: str) -> torch.Tensor:
    """Concatenate the modules' `attr` along dim 0 and re-point each module at a view of the result,
    so the fused tensor does not double the memory (the HF model keeps working on the same storage)."""
    parts = [getattr(m, attr) for m in modules]
    storage = parts[0].untyped_storage().data_ptr()
    if parts[0].is_contiguous() and all(
        p.untyped_storage().data_ptr() == storage
        and p.data_ptr() == parts[0].data_ptr() + sum(q.numel() for q in parts[:i]) * p.element_size()
        for i, p in enumerate(parts)
    ):
        base = parts[0].detach()
        total = sum(p.shape[0] for p in parts)
        return base.as_strided((total, *parts[0].shape[1:]), parts[0].stride())  # already fused
    fused = torch.cat([p.detach() for p in parts], dim=0)
    offset = 0
    for m, p in zip(modules, parts):
        setattr(m, attr, torch.nn.Parameter(fused[offset : offset + p.shape[0]], requires_grad=False))
        offset += p.shape[0]
    return fused


def rope_cos_sin(model: torch.nn.Module, position_ids: torch.Tensor, dtype: torch.dtype):
    """cos/sin `[n, head_dim]` for the given positions, from the model's own rotary embedding."""
    probe = torch.empty(0, dtype=dtype, device=position_ids.device)
    cos, sin = model.model.rotary_emb(probe, position_ids.unsqueeze(0))
    return cos[0], sin[0]


def attention_module(model: torch.nn.Module, layer: int) -> torch.nn.Module:
    """The HF attention module of `layer` (kvpress presses read its projections and config)."""
    return model.model.layers[layer].self_attn


def strip_gguf_quantization(model: torch.nn.Module) -> None:
    """A GGUF-loaded model refuses `save_pretrained`; drop the quantizer markers (weights are float)."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
