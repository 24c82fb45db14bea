"""What a LongSpec draft checkpoint was built for (`DraftConfig`), its files and its identity in a run."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from core.engine import Engine
from core.types import HarnessError

WEIGHTS, CONFIG, COUNTS = "model.safetensors", "config.json", "token_counts.safetensors"
DEFAULT_WINDOW = 512  # the paper's sliding window


@dataclass
class DraftConfig:
    """What a draft checkpoint was built for; `check_target` compares it with a target engine."""

    vocab_size: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    target_model: str  # the target's name (informative: the shapes decide compatibility)
    target_layer: int  # the target layer whose cached K/V the cross-attention reads (non-negative)
    window: int  # self-attention window: committed tokens kept in the draft's own cache
    rms_norm_eps: float = 1e-6
    qkv_bias: bool = False  # biases on q_proj/k_proj/v_proj/cross_q_proj (the released LongSpec drafts)
    final_norm: bool = True  # False: logits = LMHead(h3), no norm (the released LongSpec drafts)

    @staticmethod
    def for_target(engine: Engine, target_layer: int, window: int) -> DraftConfig:
        cfg = engine.model.config
        w = engine.w
        return DraftConfig(
            vocab_size=w.vocab_size,
            hidden_size=int(cfg.hidden_size),
            n_heads=w.n_heads,
            n_kv_heads=w.n_kv_heads,
            head_dim=w.head_dim,
            intermediate_size=int(cfg.intermediate_size),
            target_model=target_name(engine),
            target_layer=resolve_layer(target_layer, w.n_layers),
            window=check_window(window),
            rms_norm_eps=float(getattr(cfg, "rms_norm_eps", 1e-6)),
        )

    def check_target(self, engine: Engine, where: str) -> None:
        """One clear line when this draft cannot serve `engine`'s model."""
        want = DraftConfig.for_target(engine, 0, 1)
        for field in ("vocab_size", "hidden_size", "n_heads", "n_kv_heads", "head_dim"):
            mine, theirs = getattr(self, field), getattr(want, field)
            if mine != theirs:
                raise HarnessError(
                    f"LongSpec draft {where} was trained for another target ({self.target_model}): its "
                    f"{field} is {mine}, the target's ({want.target_model}) is {theirs}"
                )
        resolve_layer(self.target_layer, engine.w.n_layers)


def weights_digest(path: Path) -> str:
    """The first 10 hex digits of the sha1 of a weights file: which draft a run used, in its identity."""
    return hashlib.sha1(path.read_bytes()).hexdigest()[:10]


def target_name(engine: Engine) -> str:
    cfg = engine.model.config
    return str(getattr(cfg, "_name_or_path", "") or f"{cfg.model_type} (unnamed)")


def resolve_layer(layer: object, n_layers: int) -> int:
    """`layer` in [-n_layers, n_layers) as a non-negative index (-1 = the last layer)."""
    if isinstance(layer, bool) or not isinstance(layer, int) or not -n_layers <= layer < n_layers:
        raise HarnessError(
            f"decoder=longspec: target_layer must be an integer in [-{n_layers}, {n_layers - 1}] "
            f"(the target has {n_layers} layers), got {layer!r}"
        )
    return layer % n_layers


def check_window(window: object) -> int:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise HarnessError(f"decoder=longspec: window must be a positive integer, got {window!r}")
    return window
