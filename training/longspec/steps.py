"""The pieces of one LongSpec training step (`training.longspec` runs them): a sequence's position ids,
the frozen target's view of it, the draft's loss against it, the target's own continuations, the
learning-rate schedule and the validation."""

from __future__ import annotations

import math
import random

import torch

from core.attention import CausalView
from core.engine import Engine
from core.types import Counts
from decoders.longspec.decoder import LongSpec
from decoders.longspec.draft import LongSpecDraft
from decoders.pld import PromptLookup
from training.longspec.config import TrainConfig
from training.longspec.teacher_cache import TargetView, TeacherCache, view_from_logits


def positions_for(kind: str, n: int, anchors: int, max_offset: int, rng: random.Random) -> list[int]:
    """Position ids of a training sequence (module docstring, step 1)."""
    if kind == "vanilla" or max_offset <= 0:
        return list(range(n))
    o = rng.randint(0, max_offset)
    return list(range(min(anchors, n))) + [o + i for i in range(anchors, n)]


@torch.no_grad()
def target_view(
    engine: Engine, tokens: torch.Tensor, positions: torch.Tensor, layer: int, want_logits: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The frozen target over one sequence: its K/V `[H_kv, S, d]` of `layer` and, if asked, its float
    logits at every position."""
    n = tokens.numel()
    engine.reset(n)
    logits = engine.step(
        tokens, positions, CausalView(engine.scale), logits_rows=None if want_logits else [n - 1]
    )
    engine.commit(torch.arange(n))
    k = engine.cache.k[layer, :, :n].clone()
    v = engine.cache.v[layer, :, :n].clone()
    return k, v, logits.clone() if want_logits else None


def sequence_loss(
    draft: LongSpecDraft,
    engine: Engine,
    tokens: list[int],
    positions: list[int],
    labels: str,
    lag: int,
    cache: TeacherCache | None = None,
    bf16: bool = False,
) -> torch.Tensor:
    """Mean next-token cross-entropy of the draft over rows lag..S-2 of one sequence, against the data
    token, the target's argmax (`target`) or the target's distribution (`soft`; with a `cache`, its
    top-k renormalised). `bf16`: the draft runs in bfloat16 autocast."""
    dev = engine.device
    tok = torch.tensor(tokens, dtype=torch.long, device=dev)
    pos = torch.tensor(positions, dtype=torch.long, device=dev)
    view = None
    if cache is None:
        k, v, teacher = target_view(engine, tok, pos, draft.target_layer, labels != "data")
    else:
        view = _cached_view(engine, tok, pos, draft.target_layer, cache)
        k, v = view.k, view.v
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
        logits = draft.forward_train(tok, pos, k, v, lag)
    if labels == "data":
        return torch.nn.functional.cross_entropy(logits, tok[lag + 1 :])
    rows = slice(lag, tok.numel() - 1)
    if view is None:
        teacher = teacher[rows]
        if labels == "target":
            return torch.nn.functional.cross_entropy(logits, teacher.argmax(-1))
        return -(teacher.softmax(-1) * logits.log_softmax(-1)).sum(-1).mean()
    if labels == "target":
        return torch.nn.functional.cross_entropy(logits, view.top_ids[rows, 0])
    chosen = logits.log_softmax(-1).gather(-1, view.top_ids[rows])
    return -(view.soft_labels()[rows] * chosen).sum(-1).mean()


def _cached_view(
    engine: Engine, tok: torch.Tensor, pos: torch.Tensor, layer: int, cache: TeacherCache
) -> TargetView:
    """The target's view of the sequence from `cache`, computed and stored there on a miss (returned as
    stored, so the first epoch trains on what later ones read)."""
    view = cache.get(tok, pos, engine.device)
    if view is None:
        k, v, logits = target_view(engine, tok, pos, layer, True)
        view = cache.put(tok, pos, view_from_logits(k, v, logits, cache.topk))
    return view


@torch.no_grad()
def greedy_continuation(engine: Engine, prompt: list[int], n_new: int, method: str = "greedy") -> list[int]:
    """The target's greedy continuation of `prompt`: plain decoding (prefill, then one row per step), or
    with `method="prompt_lookup"` the same tokens from `decoders.pld` (lossless greedy verification)."""
    if method == "prompt_lookup":
        return PromptLookup(engine).generate(prompt, n_new, set(), Counts(keep_steps=False))[:n_new]
    engine.reset(len(prompt) + n_new)
    nxt = int(engine.prefill(prompt).argmax())
    out = [nxt]
    view = CausalView(engine.scale)
    while len(out) < n_new:
        pos = torch.tensor([engine.length], device=engine.device)
        logits = engine.step(torch.tensor([nxt], device=engine.device), pos, view)
        engine.commit([0])
        nxt = int(logits[0].argmax())
        out.append(nxt)
    return out


@torch.no_grad()
def batched_continuations(engine: Engine, prompts: list[list[int]], n_new: int) -> list[list[int]]:
    """The target's greedy continuations of equal-length `prompts`, decoded together: one forward of the
    model's own (transformers) code per step for all of them, with its KV cache. Batched GEMMs round
    differently from one-row ones, so where the top two logits nearly tie a token can differ from
    `greedy_continuation`'s; these are training text, never a decoder's output."""
    from transformers import DynamicCache

    if len({len(p) for p in prompts}) > 1:
        raise ValueError("batched_continuations needs prompts of one length (no padding)")
    ids = torch.tensor(prompts, dtype=torch.long, device=engine.device)
    cache = DynamicCache()
    logits = engine.model(ids, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
    out = [logits[:, -1].argmax(-1)]
    while len(out) < n_new:
        step = engine.model(out[-1][:, None], past_key_values=cache, use_cache=True).logits
        out.append(step[:, -1].argmax(-1))
    return torch.stack(out, dim=1).tolist()


def continuations(engine: Engine, prompts: list[list[int]], n_new: int, method: str) -> list[list[int]]:
    """`n_new` greedy tokens after each prompt: `batched` decodes the prompts together, `greedy` and
    `prompt_lookup` one after another (`greedy_continuation`)."""
    if method == "batched":
        return batched_continuations(engine, prompts, n_new)
    return [greedy_continuation(engine, p, n_new, method) for p in prompts]


def lr_at(step_in_stage: int, steps_in_stage: int, peak: float, warmup: int) -> float:
    if step_in_stage < warmup:
        return peak * (step_in_stage + 1) / warmup
    span = max(1, steps_in_stage - warmup)
    progress = min(1.0, (step_in_stage - warmup) / span)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def evaluate(draft: LongSpecDraft, engine: Engine, validation: list[list[int]], cfg: TrainConfig) -> dict:
    """Validation loss (data labels, lag 1, vanilla positions) and tau of `decoder=longspec` with the
    small CPU tree (depth 4, widths [2, 2, 2, 2]) over greedy continuations of the validation prompts."""
    losses = [
        float(sequence_loss(draft, engine, seq, list(range(len(seq))), "data", 1)) for seq in validation
    ]
    decoder = LongSpec(engine, depth=4, widths=[2, 2, 2, 2], draft_module=draft)
    counts = Counts(keep_steps=False)
    for seq in validation:
        prompt = seq[: cfg.gen_prompt]
        engine.reset(len(prompt) + cfg.eval_new_tokens + 8)
        decoder.generate(prompt, cfg.eval_new_tokens, set(), counts)
    return {"val_loss": sum(losses) / len(losses), "tau": counts.committed / max(1, counts.forwards)}
