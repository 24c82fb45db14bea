"""Train a LongSpec draft (LongSpec §3.2) for a frozen target, on CPU or GPU.

    python -m training.longspec out=outputs/longspec_train              # defaults: the embedded model
    python -m training.longspec out=... stages.0.sequences=64 eval_every=8   # any field, dotted

What one training sequence does (S = seq_len tokens of offline text, `training.longspec.data`):
1. Position ids: `anchor_offset` = [0, 1, .., anchors-1, o+anchors, o+anchors+1, ..] with o uniform in
   [0, max_offset] (our reading: position i is o + i after the anchors, so o = 0 is the plain
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
(`training.longspec.teacher_cache`: its K/V in float16 and its top-`teacher_topk` next tokens), so a
later epoch, or a later run over the same data, skips the target forward; soft labels are then
the target's top-k
renormalised. With `position_seed=content` a sequence's anchor offset
follows from its tokens, so a later run over the same text, whatever its stages, hits the cache.
`autocast=bf16` runs the draft's forward and backward in bfloat16 autocast (fast where
the CPU has avx512_bf16 or AMX, and on CUDA); the weights and the optimizer stay float32.
`continuations=batched` decodes `gen_batch` continuations per forward (the GPU's way; faster on a CPU
too, `benchmarks.bench_longspec_continuations`). `max_minutes` bounds one invocation (a lease, a session):
it stops after the optimizer step past the limit, saves and exports, and the same command continues.

The configuration and its checks live in `training.longspec.config`, the pieces of one step
(positions, the target's view, the loss, continuations, validation) in `training.longspec.steps`.

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
from dataclasses import asdict
from functools import partial
from pathlib import Path

import torch
from tqdm import tqdm

from core.engine import Engine, onednn_applies
from core.models import load_model
from core.types import HarnessError
from decoders.longspec.draft import WEIGHTS, LongSpecDraft, resolve_layer, weights_digest
from training.longspec.config import Stage, TrainConfig, parse
from training.longspec.data import build_sequences, load_sequences, save_sequences
from training.longspec.outputs import plot_loss, write_csv
from training.longspec.steps import continuations, evaluate, lr_at, positions_for, sequence_loss
from training.longspec.teacher_cache import TeacherCache


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
        read_before = draft.target_layer
        if cfg.retarget and read_before != layer:
            draft.retarget(layer, zero_output=cfg.retarget_output == "zero")
        if draft.target_layer != layer or draft.window != cfg.window:
            raise HarnessError(
                f"training.longspec: the draft at {folder} reads target layer {draft.target_layer} with "
                f"window {draft.window}; this run has target_layer={cfg.target_layer} ({layer}), "
                f"window={cfg.window}: set them to the draft's (or retarget=true to move it to the layer)"
            )
        summary = folder / "training.json"
        saved = json.loads(summary.read_text()) if summary.is_file() else {}
        self.tokens_before = int(saved.get("training_tokens") or 0)
        self.evals_before = list(saved.get("evals") or [])
        self.init_from = {
            "folder": folder.as_posix(),
            "weights_digest": weights_digest(folder / WEIGHTS),
            "training_tokens": self.tokens_before,
            "target_layer": read_before,
        }
        return draft

    # --- data -----------------------------------------------------------------------------------
    def prepare_data(self) -> None:
        """Tokenized sequences (and the target's continuations) once; later runs read them back."""
        cfg = self.cfg
        data_file, gen_file = self.out / "sequences.json", self.out / "generated.json"
        if not data_file.exists():
            build = partial(
                build_sequences,
                self.tokenizer,
                cfg.seq_len,
                seed=cfg.seed,
                max_chars_per_source=cfg.max_chars_per_source,
                random_loops_per_window=cfg.random_loops_per_window,
            )
            seqs, recipe = build(cfg.sources)
            if cfg.extra_sources:
                extra, more = build(cfg.extra_sources)
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
        for i, seq in enumerate(generated[:n_gen]):  # a file kept from (or copied from) another recipe
            if seq[: cfg.gen_prompt] != prompts[i][: cfg.gen_prompt] or len(seq) != cfg.seq_len:
                raise HarnessError(
                    f"training.longspec: {gen_file} sequence {i} does not continue this run's prompt {i}"
                    " (made with other sources, seed, seq_len or gen_prompt): remove it to regenerate"
                )
        if len(generated) < n_gen:
            per_call = cfg.gen_batch if cfg.continuations == "batched" else 1
            bar = tqdm(total=n_gen, initial=len(generated), desc="target continuations", file=sys.stderr)
            while len(generated) < n_gen:
                chunk = [s[: cfg.gen_prompt] for s in prompts[len(generated) : len(generated) + per_call]]
                new = continuations(self.engine, chunk, cfg.seq_len - cfg.gen_prompt, cfg.continuations)
                generated += [p + c for p, c in zip(chunk, new, strict=True)]
                save_sequences(gen_file, generated)  # kept per call: an interruption loses one call's at most
                bar.update(len(chunk))
            bar.close()
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
        """The run's identity: its config less `max_minutes` (how long one invocation may run)."""
        config = asdict(self.cfg)
        del config["max_minutes"]
        return json.dumps(config, indent=2, sort_keys=True) + "\n"

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
        cfg = self.cfg
        started = time.monotonic()
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
            if (
                cfg.max_minutes
                and time.monotonic() - started > 60 * cfg.max_minutes
                and self.step < len(batches)
            ):
                print(
                    f"max_minutes={cfg.max_minutes:g} reached at optimizer step {self.step} of "
                    f"{len(batches)}: state saved, draft exported; the same command continues",
                    file=sys.stderr,
                )
                break
        bar.close()
        self.save_state()
        return self.export(finished=self.step == len(batches))

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

    def export(self, finished: bool = True) -> Path:
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
            "finished": finished,  # False: stopped by max_minutes, the rest of the plan not yet trained
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
