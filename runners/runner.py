"""The one runner: compose objects from the config, time every (sample, turn), write the records.

Timing protocol (the same for every method): torch threads pinned, one untimed warm-up generation,
device synchronised before every clock read, prefill and decode timed apart (the decoder stamps the
end of prefill through `Counts.prefill_done`; it never reads a clock), tokens counted from the
returned ids. tau = tokens committed by decode forwards / decode forwards (bonus included).
"""

from __future__ import annotations

import hashlib
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from core.engine import Engine, onednn_applies
from core.sampling import Sampler
from core.types import Counts, HarnessError, Sample
from decoders.vanilla import Vanilla
from runners import provenance
from runners.audit import VanillaAudit, digest
from runners.records import RunDir, run_id_for
from runners.report import print_summary
from runners.timing import SampleClock, peak_memory_mb
from runners.wandb_sink import WandbSink
from tasks.base import Task

REPO = Path(__file__).resolve().parents[1]


def _params(node: Any) -> dict[str, Any]:
    return {k: v for k, v in OmegaConf.to_container(node, resolve=True).items() if k not in ("_partial_",)}


def build(node: Any, **kwargs: Any) -> Any:
    """`hydra.utils.instantiate`, but a HarnessError raised by the target surfaces as itself."""
    try:
        return instantiate(node, **kwargs)
    except InstantiationException as exc:
        cause = exc.__cause__
        while cause is not None and not isinstance(cause, HarnessError):
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


class Runner:
    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        run = cfg.run
        if run.get("threads"):
            torch.set_num_threads(int(run.threads))
        torch.manual_seed(int(run.seed))
        self.lm = build(cfg.model)
        linear = resolve_linear(run.get("linear"), self.lm)
        self.engine = Engine(self.lm.model, prefill_chunk=int(run.prefill_chunk), linear=linear)
        s = cfg.sampling
        self.sampler = Sampler(float(s.temperature), float(s.top_p), int(s.top_k), seed=int(run.seed))
        self.kv = build(cfg.kv)
        self.decoder = build(cfg.decoder)(engine=self.engine, kv=self.kv, sampler=self.sampler)
        # task.limit, when set, is the more specific choice; otherwise run.limit
        limit = run.limit if cfg.task.get("limit") is None else cfg.task.limit
        self.task: Task = build(cfg.task, limit=limit)
        if run.max_new_tokens is not None:
            self.task.max_new_tokens = int(run.max_new_tokens)
        if self.task.max_new_tokens <= 0:
            raise HarnessError(f"max_new_tokens must be positive, got {self.task.max_new_tokens}")
        self.stop_ids = (
            set()
            if getattr(self.task, "ignore_eos", False)
            else stop_ids_for(self.lm.tokenizer, self.lm.model)
        )
        fallback = {
            "model": self.lm.name,
            "decoder": getattr(self.decoder, "name", "decoder"),
            "kv": getattr(self.kv, "name", "kv"),
            "task": getattr(self.task, "name", "task"),
        }
        choices = cfg.get("choices") or {}
        self.names = {k: str(choices.get(k) or fallback[k]) for k in fallback}
        self.identity = {
            "model": self.names["model"],
            "model_name": self.lm.name,
            "dtype": str(self.lm.dtype).replace("torch.", ""),
            "device": self.lm.device.type,
            "linear": self.engine.linear,
            "decoder": self.names["decoder"],
            "decoder_params": _params(cfg.decoder),
            "kv": self.names["kv"],
            "kv_params": _params(cfg.kv),
            "task": self.names["task"],
            "task_params": _params(cfg.task),
            "task_version": self.task.version,
            "limit": self.task.limit,
            "max_new_tokens": self.task.max_new_tokens,
            "seed": int(run.seed),
            "sampling": _params(cfg.sampling),
        }
        self.run_id = run_id_for(self.identity)
        self.rundir = RunDir(Path(run.out_dir) / "runs", self.run_id)
        self.greedy = self.sampler.greedy
        self.is_reference = isinstance(self.decoder, Vanilla) and self.kv.lossless
        model_key = "-".join(
            [self.lm.name.replace("/", "_"), self.identity["dtype"], self.lm.device.type, self.engine.linear]
        )
        self.audit = (
            VanillaAudit(self.engine, Path(run.out_dir) / "vanilla_cache", model_key)
            if run.audit and self.greedy
            else None
        )

    # ------------------------------------------------------------------------------------------
    def run(self) -> Path:
        cfg = self.cfg
        if self.rundir.complete:
            print(f"[run] {self.run_id} is already complete; nothing to do")
            print_summary(self.rundir.path)
            return self.rundir.path
        samples = self.task.load()
        self._check_prompts(samples)
        done = self.rundir.done_samples()
        todo = [s for s in samples if s.sample_id not in done]
        self.rundir.path.mkdir(parents=True, exist_ok=True)
        started = datetime.now(timezone.utc).isoformat()
        self.rundir.write_run(self._run_row("running", started))
        sink = WandbSink(cfg.wandb, OmegaConf.to_container(cfg, resolve=True), self.run_id, self.names)
        try:
            if todo and cfg.run.warmup:
                self._warmup(samples[0])
            total = sum(self.task.n_turns(s) for s in todo)
            bar = tqdm(
                total=total,
                desc=f"{self.names['decoder']}+{self.names['kv']} on {self.names['task']}",
                unit="turn",
                disable=None,
            )
            if done:
                print(f"[run] resuming {self.run_id}: {len(done)} samples already done, {len(todo)} to go")
            for sample in todo:
                rows, steps, scores = self._run_sample(sample, bar)
                self.rundir.write_sample(sample.sample_id, rows, steps, scores)
            bar.close()
            tables = self.rundir.consolidate()
            self.rundir.write_run(self._run_row("complete", started))
            self.rundir.mark_complete()
            sink.log(tables, self.rundir.path)
        finally:
            sink.finish()
        print_summary(self.rundir.path)
        return self.rundir.path

    def _check_prompts(self, samples: list[Sample]) -> None:
        limit = self.engine.max_positions
        for s in samples:
            n = len(self.task.prompt_ids(s, 0, [], self.lm.tokenizer))
            if n + self.task.max_new_tokens > limit:
                raise HarnessError(
                    f"sample {s.sample_id}: prompt of {n} tokens + max_new_tokens {self.task.max_new_tokens} "
                    f"exceeds the model context ({limit}); "
                    "lower run.max_new_tokens or use a longer-context model"
                )

    def _warmup(self, sample: Sample) -> None:
        ids = self.task.prompt_ids(sample, 0, [], self.lm.tokenizer)
        self.decoder.generate(ids, min(16, self.task.max_new_tokens), self.stop_ids, Counts(keep_steps=False))

    def _seed_for(self, sample_id: str, turn: int) -> int:
        h = hashlib.sha1(f"{self.cfg.run.seed}-{sample_id}-{turn}".encode()).hexdigest()
        return int(h[:8], 16)

    def _run_sample(self, sample: Sample, bar: Any) -> tuple[list[dict], list[dict], list[dict]]:
        rows: list[dict] = []
        steps: list[dict] = []
        history: list[str] = []
        tok = self.lm.tokenizer
        error = None
        for turn in range(self.task.n_turns(sample)):
            base = {
                "run_id": self.run_id,
                "sample_id": sample.sample_id,
                "turn": turn,
                "category": sample.category,
            }
            try:
                prompt = self.task.prompt_ids(sample, turn, history, tok)
                row, counts, out = self._generate(prompt)
            except (HarnessError, RuntimeError, ValueError, IndexError) as exc:
                error = f"{exc.__class__.__name__}: {exc}"
                rows.append({**base, "error": error})
                bar.update(self.task.n_turns(sample) - turn)
                break
            rows.append({**base, **row})
            key = {k: base[k] for k in ("run_id", "sample_id", "turn")}
            steps += [{**key, "step": i, **vars(st)} for i, st in enumerate(counts.steps)]
            history.append(tok.decode(out, skip_special_tokens=True))
            bar.update(1)
        scores = []
        if error is None:
            try:
                metrics = self.task.score(sample, history)
            except Exception as exc:  # noqa: BLE001 - a scorer bug must not lose the timed sample
                metrics = {}
                rows[-1]["error"] = f"scoring failed: {exc.__class__.__name__}: {exc}"
            scores = [
                {"run_id": self.run_id, "sample_id": sample.sample_id, "metric": k, "value": float(v)}
                for k, v in metrics.items()
            ]
        return rows, steps, scores

    def _generate(self, prompt: list[int]) -> tuple[dict, Counts, list[int]]:
        eng = self.engine
        clock = SampleClock(eng.device)
        counts = Counts(on_prefill_done=clock.prefill_done, keep_steps=bool(self.cfg.run.keep_steps))
        self.sampler.reseed(self._seed_for(digest(prompt), 0))
        max_new = self.task.max_new_tokens
        clock.start()
        out = self.decoder.generate(prompt, max_new, self.stop_ids, counts)
        clock.stop()
        peak = peak_memory_mb(eng.device)
        matches = first_div = gap = None
        if self.audit is not None:
            if self.is_reference:
                self.audit.record(prompt, max_new, self.stop_ids, out)
                matches = True
            else:
                matches, first_div, gap = self.audit.compare(prompt, out, max_new, self.stop_ids)
        n_new = len(out)
        per_entry = eng.cache.bytes_per_entry()
        row = {
            "prompt_tokens": len(prompt),
            "new_tokens": n_new,
            "prefill_s": clock.prefill_s,
            "decode_s": clock.decode_s,
            "wall_s": clock.wall_s,
            "forwards": counts.forwards,
            "drafted": counts.drafted,
            "accepted": counts.accepted,
            "committed": counts.committed,
            "tau": counts.tau if counts.forwards else 1.0,
            "tok_s": n_new / clock.wall_s,
            "decode_tok_s": (n_new - 1) / clock.decode_s
            if n_new > 1 and clock.decode_s > 0
            else float("nan"),
            "peak_mem_mb": peak,
            "kv_cache_mb": eng.cache.capacity * per_entry / 2**20,
            "kv_read_mb": counts.kv_attended * per_entry / 2**20,
            "output_digest": digest(out),
            "output_text": self.lm.tokenizer.decode(out, skip_special_tokens=True),
            "output_ids": out,
            "matches_vanilla": matches,
            "first_divergence": first_div,
            "divergence_gap": gap,
            "error": None,
        }
        return row, counts, out

    def _run_row(self, status: str, started: str) -> dict[str, Any]:
        import json

        return {
            "run_id": self.run_id,
            "status": status,
            "started": started,
            "finished": datetime.now(timezone.utc).isoformat() if status == "complete" else None,
            "git_sha": provenance.git_sha(REPO),
            "versions": json.dumps(provenance.versions()),
            "device_name": provenance.device_name(self.lm.device),
            "threads": torch.get_num_threads(),
            "model": self.names["model"],
            "model_name": self.lm.name,
            "dtype": self.identity["dtype"],
            "linear": self.engine.linear,
            "decoder": self.names["decoder"],
            "decoder_params": json.dumps(self.identity["decoder_params"]),
            "lossless": bool(self.decoder.lossless),
            "kv": self.names["kv"],
            "kv_params": json.dumps(self.identity["kv_params"]),
            "task": self.names["task"],
            "task_version": self.task.version,
            "task_params": json.dumps(self.identity["task_params"]),
            "limit": self.task.limit,
            "max_new_tokens": self.task.max_new_tokens,
            "seed": int(self.cfg.run.seed),
            "sampling": json.dumps(self.identity["sampling"]),
            "time": time.time(),
        }


def run(cfg: DictConfig) -> Path:
    return Runner(cfg).run()
