"""Train a LongSpec draft (papers/004 §3.2; seed-specs §4.2) for a frozen target, on CPU or GPU.

    python -m training.longspec out=outputs/longspec_train              # defaults: the embedded model
    python -m training.longspec out=... stages.0.sequences=64 eval_every=8   # any field, dotted

What one training sequence does (S = seq_len tokens of offline text, `training.longspec_data`):
1. Position ids: `anchor_offset` = [0, 1, .., anchors-1, o+anchors, o+anchors+1, ..] with o uniform in
   [0, max_offset] (seed-specs' [H] reading: position i is o + i after the anchors, so o = 0 is the plain
   sequence), or `vanilla` = 0..S-1.
2. The frozen target runs once over the sequence at those positions (`Engine.step`, no gradient): its
   post-RoPE K/V of layer `target_layer` are what the draft's cross-attention reads; with `labels:
   target` its greedy prediction at each position is the label (self-distillation, stage 3).
3. Flash-noisy lag j uniform in [1, max_lag]: draft row t sees target rows <= t - j (at inference the
   root is 1 token past the last verified one and a depth-d node d+1: max_lag = tree depth covers
   every query of a depth-5 tree). Rows t < j see no target entry and are left out of the loss.
4. Next-token cross-entropy on rows j..S-2 (`LongSpecDraft.forward_train`, the same block code that
   drafts), averaged over `batch` sequences per AdamW step; LR: linear warmup, cosine to 10% per stage.

Stages run in order, each for its number of sequences (times its `epochs`: later passes take the same
sequences in a new seeded order with a new lag, at the same positions). `generated` sequences of a
stage are the target's own greedy continuations (`gen_prompt` tokens of held-out text, then the
target's output up to S), trained with `labels: target`: what the draft meets at inference is the
target's own text.

Speed (both off by default): `teacher_cache=<folder>` keeps the target's view of each sequence on disk
(`training.teacher_cache`: its K/V in float16 and its top-`teacher_topk` next tokens), so a later epoch,
or a later run over the same data, skips the target forward; soft labels are then the target's top-k
renormalised. With `position_seed=content` a sequence's anchor offset
follows from its tokens, so a later run over the same text, whatever its stages, hits the cache.
`autocast=bf16` runs the draft's forward and backward in bfloat16 autocast (fast where
the CPU has avx512_bf16 or AMX, and on CUDA); the weights and the optimizer stay float32.

Resumable: every `checkpoint_every` optimizer steps `state.pt` holds the draft, optimizer, step and log
(each sequence's randomness is seeded by its index, so a resumed run draws what an uninterrupted one
would); rerunning the same command continues, a different config is refused. Outputs in `out/`:
`config.json`, `data.json` (the recipe), `log.csv` (per step: loss, lr, tokens, tokens/s), `eval.csv`
(validation loss and tau over training tokens), `loss.png`, and `draft/` (the draft in bfloat16 with
its config and `training.json`), which `decoder=longspec decoder.checkpoint=<out>/draft` loads.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from core.attention import CausalView
from core.engine import Engine
from core.models import load_model
from core.types import Counts, HarnessError
from decoders.longspec import LongSpec
from decoders.longspec_draft import WEIGHTS, LongSpecDraft, resolve_layer, weights_digest
from training.longspec_data import (
    KNOWN_SOURCES,
    SOURCES,
    build_sequences,
    load_sequences,
    save_sequences,
)
from training.longspec_outputs import plot_loss, write_csv
from training.teacher_cache import TeacherCache, view_from_logits


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
    gen_prompt: int = 512  # held-out tokens before a generated continuation
    # how the target's greedy continuations are decoded: greedy (one row per step) | prompt_lookup (the
    # same greedy tokens by decoders.pld, lossless; fast where the target repeats itself)
    continuations: str = "greedy"
    validation: int = 2  # held-out sequences for validation loss and tau
    eval_every: int = 60  # optimizer steps between evaluations (and at every stage end)
    eval_new_tokens: int = 48
    checkpoint_every: int = 20  # optimizer steps between resumable checkpoints
    # a folder keeping the target's view of each sequence (`training.teacher_cache`): later epochs and
    # later runs over the same data skip the target forward; soft labels become the target's top-k
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
    from omegaconf import OmegaConf

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
    from omegaconf import ListConfig

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
    if cfg.continuations not in ("greedy", "prompt_lookup"):
        raise HarnessError(
            f"training.longspec: continuations must be greedy or prompt_lookup, got {cfg.continuations!r}"
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


# --- the pieces of one step ------------------------------------------------------------------------
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
    if cache is not None:
        return _cached_loss(draft, engine, tok, pos, labels, lag, cache, bf16)
    k, v, teacher = target_view(engine, tok, pos, draft.target_layer, labels != "data")
    with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=bf16):
        logits = draft.forward_train(tok, pos, k, v, lag)
    if teacher is None:
        return torch.nn.functional.cross_entropy(logits, tok[lag + 1 :])
    teacher = teacher[lag : tok.numel() - 1]
    if labels == "target":
        return torch.nn.functional.cross_entropy(logits, teacher.argmax(-1))
    return -(teacher.softmax(-1) * logits.log_softmax(-1)).sum(-1).mean()


def _cached_loss(
    draft: LongSpecDraft,
    engine: Engine,
    tok: torch.Tensor,
    pos: torch.Tensor,
    labels: str,
    lag: int,
    cache: TeacherCache,
    bf16: bool,
) -> torch.Tensor:
    view = cache.get(tok, pos, engine.device)
    if view is None:
        k, v, logits = target_view(engine, tok, pos, draft.target_layer, True)
        view = view_from_logits(k, v, logits, cache.topk)
        view = cache.put(tok, pos, view)
    with torch.autocast(engine.device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = draft.forward_train(tok, pos, view.k, view.v, lag)
    rows = slice(lag, tok.numel() - 1)
    if labels == "data":
        return torch.nn.functional.cross_entropy(logits, tok[lag + 1 :])
    if labels == "target":
        return torch.nn.functional.cross_entropy(logits, view.top_ids[rows, 0])
    chosen = logits.log_softmax(-1).gather(-1, view.top_ids[rows])
    return -(view.soft_labels()[rows] * chosen).sum(-1).mean()


@torch.no_grad()
def greedy_continuation(engine: Engine, prompt: list[int], n_new: int, method: str = "greedy") -> list[int]:
    """The target's greedy continuation of `prompt`: plain decoding (prefill, then one row per step), or
    with `method="prompt_lookup"` the same tokens from `decoders.pld` (lossless greedy verification)."""
    if method == "prompt_lookup":
        from decoders.pld import PromptLookup

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


# --- the run ----------------------------------------------------------------------------------------
class Trainer:
    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out)
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        loaded = load_model(cfg.model_source, cfg.model, cfg.dtype, "auto")
        linear = cfg.linear
        if linear == "auto":
            from core.engine import onednn_applies

            linear = "onednn" if onednn_applies(loaded.model) else "aten"
        self.engine = Engine(loaded.model, linear=linear)
        for p in loaded.model.parameters():
            p.requires_grad_(False)
        self.tokenizer = loaded.tokenizer
        max_pos = self.engine.max_positions
        self.max_offset = cfg.max_offset if cfg.max_offset >= 0 else max(0, max_pos - cfg.seq_len)
        if cfg.seq_len > max_pos:
            raise HarnessError(
                f"training.longspec: seq_len {cfg.seq_len} exceeds the target's context {max_pos}"
            )
        self.init_from: dict = {}  # the draft a continued run starts from (init=<folder>)
        self.tokens_before = 0  # training tokens that draft had seen
        self.evals_before: list[dict] = []  # its evaluations (eval.csv and the plot continue them)
        if cfg.init in ("layer", "random"):
            make = LongSpecDraft.init_from_layer if cfg.init == "layer" else LongSpecDraft.init_for
            self.draft = make(self.engine, cfg.target_layer, cfg.window)
        else:
            self.draft = self._continued_draft(Path(cfg.init).expanduser())
        self.draft.requires_grad_(True)
        self.draft.label = f"LongSpec draft trained by training.longspec ({cfg.out})"
        self.opt = torch.optim.AdamW(self.draft.parameters(), lr=cfg.stages[0].lr, weight_decay=0.0)
        self.cache = self._teacher_cache()
        self.bf16 = cfg.autocast == "bf16"
        self.step = 0  # optimizer steps done
        self.log: list[dict] = []
        self.evals: list[dict] = []

    def _teacher_cache(self) -> TeacherCache | None:
        cfg = self.cfg
        if not cfg.teacher_cache:
            return None
        vocab = self.draft.config.vocab_size
        if cfg.teacher_topk > vocab:
            raise HarnessError(
                f"training.longspec: teacher_topk {cfg.teacher_topk} exceeds the vocabulary {vocab}"
            )
        identity = {
            "model_source": cfg.model_source,
            "model": cfg.model,
            "dtype": cfg.dtype,
            "layer": self.draft.target_layer,
            "target_model": self.draft.config.target_model,
        }
        return TeacherCache(Path(cfg.teacher_cache).expanduser(), identity, cfg.teacher_topk)

    def _continued_draft(self, folder: Path) -> LongSpecDraft:
        """The draft saved in `folder` (its weights in the target's dtype), checked against this run's
        target layer and window."""
        cfg = self.cfg
        draft = LongSpecDraft.load(folder, self.engine)
        layer = resolve_layer(cfg.target_layer, self.engine.w.n_layers)
        if draft.target_layer != layer or draft.window != cfg.window:
            raise HarnessError(
                f"training.longspec: the draft at {folder} reads target layer {draft.target_layer} with "
                f"window {draft.window}; this run has target_layer={cfg.target_layer} ({layer}), "
                f"window={cfg.window}: set them to the draft's"
            )
        summary = folder / "training.json"
        saved = json.loads(summary.read_text()) if summary.is_file() else {}
        self.tokens_before = int(saved.get("training_tokens") or 0)
        self.evals_before = list(saved.get("evals") or [])
        self.init_from = {
            "folder": folder.as_posix(),
            "weights_digest": weights_digest(folder / WEIGHTS),
            "training_tokens": self.tokens_before,
        }
        return draft

    # --- data -----------------------------------------------------------------------------------
    def prepare_data(self) -> None:
        """Tokenized sequences (and the target's continuations) once; later runs read them back."""
        cfg = self.cfg
        data_file, gen_file = self.out / "sequences.json", self.out / "generated.json"
        if not data_file.exists():
            seqs, recipe = build_sequences(
                self.tokenizer, cfg.seq_len, cfg.sources, cfg.seed, cfg.max_chars_per_source
            )
            if cfg.extra_sources:
                extra, more = build_sequences(
                    self.tokenizer, cfg.seq_len, cfg.extra_sources, cfg.seed, cfg.max_chars_per_source
                )
                seqs = seqs[: cfg.validation] + extra + seqs[cfg.validation :]
                recipe.extra_sources = list(cfg.extra_sources)
                recipe.chars.update(more.chars)
                recipe.sequences.update(more.sequences)
            need = cfg.validation + sum(s.sequences - s.generated for s in cfg.stages)
            need += sum(s.generated for s in cfg.stages)  # the generated ones take their prompts from here
            if len(seqs) < need:
                raise HarnessError(
                    f"training.longspec: the sources give {len(seqs)} sequences, the stages need {need}"
                )
            (self.out / "data.json").write_text(recipe.to_json())
            save_sequences(data_file, seqs[:need])
        seqs = load_sequences(data_file)
        self.validation = seqs[: cfg.validation]
        rest = seqs[cfg.validation :]
        n_gen = sum(s.generated for s in cfg.stages)
        prompts, self.data = rest[:n_gen], rest[n_gen:]
        generated = load_sequences(gen_file) if gen_file.exists() else []
        if len(generated) < n_gen:
            from tqdm import tqdm

            for seq in tqdm(prompts[len(generated) :], desc="target continuations", file=sys.stderr):
                prompt = seq[: cfg.gen_prompt]
                generated.append(
                    prompt
                    + greedy_continuation(
                        self.engine, prompt, cfg.seq_len - cfg.gen_prompt, cfg.continuations
                    )
                )
                save_sequences(gen_file, generated)  # each one kept: an interrupted run loses at most one
        self.generated = generated

    def schedule(self) -> list[tuple[Stage, int, list[int], int]]:
        """(stage, index within the stage, tokens, epoch) for every training sequence, in order: a
        stage's sequences, then for each further epoch the same sequences in a new seeded order."""
        out, data_i, gen_i = [], 0, 0
        for st in self.cfg.stages:
            items = []
            for i in range(st.sequences):
                if i < st.generated:
                    items.append((st, i, self.generated[gen_i]))
                    gen_i += 1
                else:
                    items.append((st, i, self.data[data_i]))
                    data_i += 1
            out += [(*item, 0) for item in items]
            for epoch in range(1, st.epochs):
                order = list(range(len(items)))
                random.Random(f"{self.cfg.seed}-{st.name}-epoch{epoch}").shuffle(order)
                out += [(*items[i], epoch) for i in order]
        return out

    # --- checkpoints ----------------------------------------------------------------------------
    def _config_json(self) -> str:
        return json.dumps(asdict(self.cfg), indent=2, sort_keys=True) + "\n"

    def resume(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        conf = self.out / "config.json"
        if conf.exists() and conf.read_text() != self._config_json():
            raise HarnessError(
                f"training.longspec: {self.out} holds a run with another config: pass a new out= or "
                "repeat that run's overrides to resume it"
            )
        conf.write_text(self._config_json())
        state_file = self.out / "state.pt"
        if state_file.exists():
            state = torch.load(state_file, map_location=self.engine.device, weights_only=False)
            self.draft.load_state_dict(state["draft"])
            self.opt.load_state_dict(state["optimizer"])
            self.step, self.log, self.evals = state["step"], state["log"], state["evals"]
            print(f"resuming {self.out} at optimizer step {self.step}", file=sys.stderr)

    def save_state(self) -> None:
        state = {
            "draft": self.draft.state_dict(),
            "optimizer": self.opt.state_dict(),
            "step": self.step,
            "log": self.log,
            "evals": self.evals,
        }
        tmp = self.out / "state.pt.tmp"
        torch.save(state, tmp)
        tmp.replace(self.out / "state.pt")
        write_csv(self.out / "log.csv", self.log)
        write_csv(self.out / "eval.csv", self.evals_before + self.evals)

    # --- loop -----------------------------------------------------------------------------------
    def run(self) -> Path:
        from tqdm import tqdm

        cfg = self.cfg
        self.resume()
        self.prepare_data()
        plan = self.schedule()
        batches = [plan[i : i + cfg.batch] for i in range(0, len(plan), cfg.batch)]
        stage_steps = {st.name: math.ceil(st.sequences * st.epochs / cfg.batch) for st in cfg.stages}
        stage_start: dict[str, int] = {}  # the plan index of each stage's first sequence
        for i, item in enumerate(plan):
            stage_start.setdefault(item[0].name, i)
        tokens_done = self.tokens_before + sum(r["tokens"] for r in self.log)
        if not self.evals:
            self._evaluate(tokens_done, "start")
        bar = tqdm(total=len(batches), initial=self.step, desc="longspec draft", file=sys.stderr)
        for b in range(self.step, len(batches)):
            batch = batches[b]
            st = batch[0][0]
            step_in_stage = (b * cfg.batch - stage_start[st.name]) // cfg.batch
            lr = lr_at(step_in_stage, stage_steps[st.name], st.lr, cfg.warmup)
            for group in self.opt.param_groups:
                group["lr"] = lr
            t0, total, n_tok = time.perf_counter(), 0.0, 0
            self.opt.zero_grad(set_to_none=True)
            for stage, index, tokens, epoch in batch:
                rng = random.Random(self._sequence_seed(stage, index, tokens))
                kind = "vanilla" if index < stage.generated else stage.positions
                pos = positions_for(kind, len(tokens), cfg.anchors, self.max_offset, rng)
                lag = rng.randint(1, cfg.max_lag)
                if epoch:  # the same positions (a teacher cache entry stays valid), a new lag
                    epoch_rng = random.Random(f"{cfg.seed}-{stage.name}-{index}-epoch{epoch}")
                    lag = epoch_rng.randint(1, cfg.max_lag)
                loss = sequence_loss(
                    self.draft, self.engine, tokens, pos, stage.labels, lag, self.cache, self.bf16
                )
                (loss / len(batch)).backward()
                total += loss.item() / len(batch)
                n_tok += len(tokens) - 1 - lag
            norm = torch.nn.utils.clip_grad_norm_(self.draft.parameters(), cfg.grad_clip)
            self.opt.step()
            self.step = b + 1
            secs = time.perf_counter() - t0
            tokens_done += n_tok
            self.log.append(
                {"step": self.step, "stage": st.name, "loss": round(total, 5), "lr": lr,
                 "grad_norm": round(float(norm), 4), "tokens": n_tok, "tokens_total": tokens_done,
                 "tokens_per_s": round(n_tok / secs, 1)}
            )  # fmt: skip
            bar.set_postfix(
                stage=st.name, epoch=batch[0][3], loss=f"{total:.3f}", tok_s=f"{n_tok / secs:.0f}"
            )
            bar.update(1)
            stage_end = b + 1 == len(batches) or batches[b + 1][0][0].name != st.name
            if self.step % cfg.eval_every == 0 or stage_end:
                self._evaluate(tokens_done, st.name)
            if self.step % cfg.checkpoint_every == 0 or stage_end:
                self.save_state()
        bar.close()
        self.save_state()
        return self.export()

    def _sequence_seed(self, stage: Stage, index: int, tokens: list[int]) -> str:
        if self.cfg.position_seed == "content":
            return f"{self.cfg.seed}-{hashlib.sha256(str(tokens).encode()).hexdigest()}"
        return f"{self.cfg.seed}-{stage.name}-{index}"

    def _evaluate(self, tokens_done: int, stage: str) -> None:
        result = evaluate(self.draft, self.engine, self.validation, self.cfg)
        self.evals.append({"step": self.step, "stage": stage, "tokens_total": tokens_done, **result})
        print(
            f"eval at step {self.step}: val_loss {result['val_loss']:.3f}, tau {result['tau']:.2f}",
            file=sys.stderr,
        )

    def export(self) -> Path:
        folder = self.out / "draft"
        self.draft.config.target_model = Path(self.draft.config.target_model).name or self.cfg.model
        self.draft.save(folder, dtype=torch.bfloat16)
        counts = torch.zeros(self.draft.config.vocab_size, dtype=torch.int64)
        for _, _, tokens, epoch in self.schedule():  # this run's sequences: what draft_vocab ranks by
            if epoch == 0:
                counts += torch.bincount(torch.tensor(tokens), minlength=counts.numel())
        self.draft.save_counts(folder, counts)
        data = json.loads((self.out / "data.json").read_text())
        summary = {
            "config": asdict(self.cfg),
            "data": data,
            "generated_sequences": len(self.generated),
            "optimizer_steps": self.step,
            "training_tokens": self.tokens_before + sum(r["tokens"] for r in self.log),
            "continued_from": self.init_from or None,  # init=<folder>: the draft this run started from
            "final_loss": self.log[-1]["loss"] if self.log else None,
            "evals": self.evals_before + self.evals,
            "weights_dtype": "bfloat16",
        }
        (folder / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
        plot_loss(self.log, self.evals_before + self.evals, folder / "loss.png")
        return folder


def main(argv: list[str] | None = None) -> int:
    try:
        folder = Trainer(parse(sys.argv[1:] if argv is None else argv)).run()
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"draft written to {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
