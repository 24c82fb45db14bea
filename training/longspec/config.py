"""The configuration of `python -m training.longspec`: its stages, fields, `key=value` overrides and the
checks that turn bad values into one error line before anything is written."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import ListConfig, OmegaConf

from core.types import HarnessError
from training.longspec.data import KNOWN_SOURCES, SOURCES


@dataclass
class Stage:
    name: str
    sequences: int  # training sequences this stage consumes
    labels: str = "data"  # data: the next data token | target: the target's greedy prediction |
    # soft: the target's whole next-token distribution (cross-entropy = KL to the target + a constant)
    positions: str = "anchor_offset"  # anchor_offset | vanilla
    lr: float = 5e-4
    generated: int = 0  # of `sequences`, how many are the target's own continuations
    epochs: int = 1  # passes over the stage's sequences (later passes: a new order and lag, same positions)


@dataclass
class TrainConfig:
    out: str = "outputs/longspec_train"
    model_source: str = "packaged"  # core.models.load_model: packaged | hub | tiny
    model: str = "smollm2-135m"
    dtype: str = "float32"
    linear: str = "auto"  # auto: prepacked oneDNN GEMMs for an fp32 target on x86, else aten
    threads: int = 0  # torch threads (0: leave torch's default)
    target_layer: int = -1  # the target layer whose K/V the draft reads (the reference: the last)
    window: int = 512  # the draft's self-attention window (paper)
    # random: normal(0, 0.02) | layer: the block starts as a copy of the target's last layer | a draft
    # folder (`LongSpecDraft.save`, e.g. checkpoints/longspec/smollm2-135m): continue training that draft
    init: str = "random"
    # with init=<draft folder> reading another layer than target_layer: move it to target_layer, its
    # cross-attention started over from that layer's attention (`LongSpecDraft.retarget`; ours)
    retarget: bool = False
    retarget_output: str = "layer"  # the moved cross-attention's output projection: layer's | zero
    seq_len: int = 1024
    anchors: int = 4  # anchored positions at the start of each sequence (paper: 4)
    max_offset: int = -1  # anchor offset o in [0, max_offset]; -1: the target's context - seq_len
    max_lag: int = 5  # flash-noisy lag j in [1, max_lag]
    batch: int = 2  # sequences per optimizer step
    warmup: int = 8  # optimizer steps of linear warmup at the start of each stage
    grad_clip: float = 1.0
    sources: list[str] = field(default_factory=lambda: list(SOURCES))
    # more text after the validation sequences, before the sources' others (validation stays the
    # sources' first sequences, as in a run without them): e.g. [hotpotqa_more] for a continued run
    extra_sources: list[str] = field(default_factory=list)
    max_chars_per_source: int = 2_000_000
    random_loops_per_window: int = 1  # source random_loops: sequences drawn per window of its text
    gen_prompt: int = 512  # held-out tokens before a generated continuation
    # how the target's greedy continuations are decoded: greedy (one row per step) | prompt_lookup (the
    # same greedy tokens by decoders.pld, lossless; fast where the target repeats itself) | batched
    # (`gen_batch` prompts per forward through the model's own code: fast on a GPU; a near-tie can
    # resolve to the other token, as batched GEMMs round differently)
    continuations: str = "greedy"
    gen_batch: int = 16
    validation: int = 2  # held-out sequences for validation loss and tau
    eval_every: int = 60  # optimizer steps between evaluations (and at every stage end)
    eval_new_tokens: int = 48
    checkpoint_every: int = 20  # optimizer steps between resumable checkpoints
    # stop this invocation after the optimizer step that passes this many minutes (0: no limit): the
    # state is saved and the draft exported; the same command continues (not part of the run's identity)
    max_minutes: float = 0.0
    # a folder keeping the target's view of each sequence (`training.longspec.teacher_cache`): later
    # epochs and later runs over the same data skip the target forward; soft labels become the target's top-k
    teacher_cache: str = ""
    teacher_topk: int = 64
    # stage: a sequence's anchor offset and lag are seeded by its stage and index | content: by its tokens
    # (any later run over the same text, whatever its stages, draws the same positions: cache hits)
    position_seed: str = "stage"
    autocast: str = "none"  # none | bf16: the draft's forward and backward in bfloat16 autocast
    seed: int = 0
    stages: list[Stage] = field(
        default_factory=lambda: [
            Stage("pretrain", 640, "data", "anchor_offset", 1e-3),
            Stage("distill", 320, "soft", "vanilla", 5e-4, generated=24),
        ]
    )


def parse(argv: list[str]) -> TrainConfig:
    """The defaults with `key=value` overrides (dotted keys, list items by index: `stages.0.lr=1e-3`;
    values in YAML, e.g. `stages=[{name: a, sequences: 8}]`)."""
    cfg = OmegaConf.structured(TrainConfig)
    try:
        for item in argv:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ValueError(f"expected key=value, got {item!r}")
            _check_list_indices(cfg, key)
            OmegaConf.update(cfg, key, OmegaConf.from_dotlist([f"v={value}"])["v"], merge=True)
        out: TrainConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    except Exception as exc:  # omegaconf's validation errors: one line
        raise HarnessError(
            f"training.longspec: bad override ({exc.__class__.__name__}: {exc})".split("\n")[0]
        ) from None
    return check(out)


def _check_list_indices(cfg: Any, key: str) -> None:
    """Refuse a list index outside the list in a dotted override key (`stages.5.lr` with 2 stages)."""
    node, path = cfg, []
    for part in key.split("."):
        if isinstance(node, ListConfig):
            if not part.isdigit() or int(part) >= len(node):
                raise ValueError(
                    f"{key}: {'.'.join(path)} has {len(node)} items, indices 0..{len(node) - 1}; "
                    f"replace the whole list to change its length ({'.'.join(path)}=[...])"
                )
            node = node[int(part)]
        elif part in getattr(node, "keys", lambda: ())():
            node = node[part]
        else:
            return  # omegaconf reports unknown keys itself
        path.append(part)


def check(cfg: TrainConfig) -> TrainConfig:
    if cfg.init not in ("layer", "random") and not (Path(cfg.init).expanduser() / "config.json").is_file():
        raise HarnessError(
            f"training.longspec: init must be layer, random or a draft folder (with config.json), "
            f"got {cfg.init!r}"
        )
    if cfg.retarget and cfg.init in ("layer", "random"):
        raise HarnessError("training.longspec: retarget=true moves a trained draft: set init=<draft folder>")
    if cfg.retarget_output not in ("layer", "zero"):
        raise HarnessError(
            f"training.longspec: retarget_output must be layer or zero, got {cfg.retarget_output!r}"
        )
    if cfg.seq_len < cfg.anchors + cfg.max_lag + 2 or cfg.batch < 1 or cfg.max_lag < 1:
        raise HarnessError(
            "training.longspec: need batch >= 1, max_lag >= 1, seq_len >= anchors + max_lag + 2"
        )
    for st in cfg.stages:
        if st.labels not in ("data", "target", "soft") or st.positions not in ("anchor_offset", "vanilla"):
            raise HarnessError(
                f"training.longspec: stage {st.name}: labels must be data|target|soft and positions "
                f"anchor_offset|vanilla, got {st.labels!r}, {st.positions!r}"
            )
        if st.sequences < 1 or not 0 <= st.generated <= st.sequences:
            raise HarnessError(f"training.longspec: stage {st.name}: need 0 <= generated <= sequences, >= 1")
        if st.epochs < 1:
            raise HarnessError(f"training.longspec: stage {st.name}: epochs must be >= 1, got {st.epochs}")
        if st.generated and st.labels == "data":
            raise HarnessError(
                f"training.longspec: stage {st.name}: generated sequences need target or soft labels"
            )
    unknown = sorted(set(cfg.sources + cfg.extra_sources) - set(KNOWN_SOURCES))
    if unknown or set(cfg.sources) & set(cfg.extra_sources):
        raise HarnessError(
            f"training.longspec: sources and extra_sources take distinct names among "
            f"{', '.join(KNOWN_SOURCES)}; got {cfg.sources} and {cfg.extra_sources}"
        )
    if cfg.autocast not in ("none", "bf16"):
        raise HarnessError(f"training.longspec: autocast must be none or bf16, got {cfg.autocast!r}")
    if cfg.continuations not in ("greedy", "prompt_lookup", "batched") or cfg.gen_batch < 1:
        raise HarnessError(
            "training.longspec: continuations must be greedy, prompt_lookup or batched and gen_batch "
            f">= 1, got {cfg.continuations!r}, {cfg.gen_batch}"
        )
    if cfg.max_minutes < 0:
        raise HarnessError(f"training.longspec: max_minutes must be >= 0, got {cfg.max_minutes}")
    if cfg.random_loops_per_window < 1:
        raise HarnessError(
            f"training.longspec: random_loops_per_window must be >= 1, got {cfg.random_loops_per_window}"
        )
    if cfg.position_seed not in ("stage", "content"):
        raise HarnessError(
            f"training.longspec: position_seed must be stage or content, got {cfg.position_seed!r}"
        )
    if cfg.teacher_topk < 1:
        raise HarnessError(f"training.longspec: teacher_topk must be >= 1, got {cfg.teacher_topk}")
    if cfg.gen_prompt >= cfg.seq_len:
        raise HarnessError("training.longspec: gen_prompt must be shorter than seq_len")
    return cfg
