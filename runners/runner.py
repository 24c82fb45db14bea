"""The one runner: compose objects from the config, time every (sample, turn), write the records.

Timing protocol (the same for every method): torch threads set explicitly and recorded; the KV cache
allocated once for the largest context of the run; one untimed warm-up generation on the longest
prompt (over the whole length when the attention backend compiles, so that no compile happens inside
a timed sample); device synchronised before every clock read; prefill and decode timed apart (the
decoder stamps the end of prefill through `Counts.prefill_done`; it never reads a clock); tokens
counted from the returned ids. tau = tokens committed by decode forwards / decode forwards (bonus
included).

A run is identified by everything that changes its numbers (model, dtype, device name, threads,
linear, prefill_chunk, decoder, kv, task, limits, seed, sampling). A resumed run must also have been
started by the same code and package versions, or it is refused instead of mixing samples.

The rows each (sample, turn) and the run record become are built in `runners.rows` (`RunRows`).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from core.cost_curve import cache_name, cached_or_measured, curve_key
from core.engine import Engine
from core.replay import Replay
from core.sampling import Sampler
from core.types import Counts, HarnessError, Sample
from decoders.draft_model import build_draft
from decoders.vanilla import Vanilla
from runners import provenance
from runners.audit import VanillaAudit, digest, reference_key
from runners.config import (
    build,
    check_config,
    pin_threads,
    resolve_cuda_graphs,
    resolve_linear,
    resolve_warmup_s,
    stop_ids_for,
)
from runners.emulated_graphs import emulate_graphs
from runners.identity import Environment, command_key, group_params, method_params, run_identity
from runners.lock import CommandLock, RunLock
from runners.records import RunDir, run_id_for
from runners.report import print_summary
from runners.rows import PROVENANCE, RunRows
from runners.wandb_sink import WandbSink
from tasks.base import Task

REPO = Path(__file__).resolve().parents[1]
WARMUP_TOKENS = 16  # untimed warm-up length when nothing compiles per shape
GPU_WARMUP_S = 20.0  # default seconds of untimed warm-up generations on CUDA (Runner._warmup)


class Runner(RunRows):
    def __init__(self, cfg: DictConfig) -> None:
        """Compose the run: every `run.*` setting is read from the typed `RunSettings` (`check_config`,
        which also validates the decoder's and the policy's options), the identity from `runners.identity`."""
        self.cfg = cfg
        self.settings = settings = check_config(cfg)
        self.threads = pin_threads(settings.threads)
        torch.manual_seed(settings.seed)
        self.lm = build(cfg.model, "model")
        graphs = resolve_cuda_graphs(settings.cuda_graphs, self.lm)
        self.engine = Engine(
            self.lm.model,
            prefill_chunk=settings.prefill_chunk,
            linear=resolve_linear(settings.linear, self.lm, settings.compile),
            cuda_graphs=graphs is True,
            compiled=settings.compile,
        )
        if graphs == "emulate":
            emulate_graphs(self.engine)
        self.device_name = provenance.device_name(self.lm.device)
        self.warmup_s = resolve_warmup_s(settings.warmup_s, self.engine.device, GPU_WARMUP_S)
        s = cfg.sampling
        self.sampler = Sampler(s.temperature, s.top_p, s.top_k, seed=settings.seed)
        self.kv = build(cfg.kv, "kv")
        self.draft = build_draft(cfg.get("draft"), self.lm, self.engine)
        self.decoder = self._build_decoder(cfg)
        self.task: Task = build(cfg.task, "task", limit=settings.limit, stratify=settings.stratify)
        self.task.limit_field = settings.limit_field
        if settings.max_new_tokens is not None:
            self.task.max_new_tokens = settings.max_new_tokens
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
            "draft": "none" if self.draft is None else "draft",
        }
        choices = cfg.get("choices") or {}
        self.names = {k: str(choices.get(k) or fallback[k]) for k in fallback}
        env = Environment(
            model_name=self.lm.name,
            dtype=str(self.lm.dtype).replace("torch.", ""),
            device=self.lm.device.type,
            device_name=self.device_name,
            threads=self.threads,
            prefill_chunk=settings.prefill_chunk,
            linear=self.engine.linear,
            cuda_graphs=graphs,
            compile=settings.compile,
        )
        extra = getattr(self.decoder, "identity_extra", dict)()  # e.g. which weights its draft holds
        params = {
            "decoder": {**method_params(cfg.decoder, "decoder"), **extra},
            "kv": method_params(cfg.kv, "kv"),
            "draft": {} if self.draft is None else {**group_params(cfg.draft), "label": self.draft.label},
            "task": group_params(cfg.task),
            "sampling": group_params(cfg.sampling),
        }
        limit, max_new = self.task.limit, self.task.max_new_tokens
        self.identity = run_identity(
            self.names, env, params, self.task.version, limit, max_new, settings.seed, settings.stratify
        )
        self.run_id = run_id_for(self.identity)
        self.rundir = RunDir(settings.out_dir / "runs", self.run_id)
        provenance.require_clean_tree(REPO, str(settings.out_dir))  # paper records: from a commit only
        self.code_version = provenance.git_sha(REPO)
        self.versions = provenance.versions()
        self.cost_curve = ""  # block=auto: the cache name of the cost curve the decoder sized blocks with
        self.greedy = self.sampler.greedy
        self.is_reference = isinstance(self.decoder, Vanilla) and self.kv.lossless
        self._compile_from = Replay.total_compile_s
        self.audit = (
            VanillaAudit(self.engine, settings.out_dir / "vanilla_cache", self._reference_key())
            if settings.audit and self.greedy
            else None
        )

    def _build_decoder(self, cfg: DictConfig) -> Any:
        """The decoder over the engine, the policy and the sampler, with what it declares in `needs`."""
        partial = build(cfg.decoder, "decoder")
        needs = getattr(partial, "func", partial).needs  # the class behind Hydra's partial
        extra: dict[str, Any] = {} if self.draft is None else {"draft": self.draft}
        if "tokenizer" in needs:  # e.g. SFI's boundary tokens
            extra["tokenizer"] = self.lm.tokenizer
        if self.draft is not None and "draft" not in needs:
            raise HarnessError(
                f"draft={(cfg.get('choices') or {}).get('draft', 'set')} drafts for a hierarchical decoder: "
                "use it with decoder=triforce (or leave draft=none)"
            )
        try:
            return partial(engine=self.engine, kv=self.kv, sampler=self.sampler, **extra)
        except (ValueError, TypeError) as exc:
            raise HarnessError(f"decoder: {exc}") from None

    @property
    def count_syncs(self) -> int:
        """New tokens of the untimed generation that counts host syncs (`RunSettings.count_syncs`): the
        dispatch modes that count them put every operator through Python, costing a small model more
        than its own operators, so inside a timed generation they would be most of the host time."""
        return self.settings.count_syncs

    @property
    def graphed(self) -> bool:
        """Whether the fixed-shape forwards are captured (CUDA graphs, or their emulation), not only
        compiled or run eagerly."""
        return self.engine.graphs is not None and self.engine.graphs.capture

    @property
    def compile_s(self) -> float:
        """Seconds this run's compiling calls took (`run.compile`: each shape's first forward)."""
        return round(Replay.total_compile_s - self._compile_from, 3)

    def _reference_key(self) -> str:
        """Everything that changes a vanilla greedy output on this engine."""
        return reference_key(
            {
                "model_name": self.lm.name,
                "dtype": self.identity["dtype"],
                "device_name": self.device_name,
                "linear": self.engine.linear,
                "threads": self.threads,
                "prefill_chunk": self.identity["prefill_chunk"],
                "torch": self.versions.get("torch"),
                "transformers": self.versions.get("transformers"),
                **({"cuda_graphs": True} if self.graphed else {}),
                # compiled kernels may round differently from eager ones: their own reference
                **({"compile": True} if self.identity.get("compile") else {}),
            },
            REPO,
        )

    # ------------------------------------------------------------------------------------------
    def run(self) -> Path:
        cfg = self.cfg
        unbacked = None
        if (self.rundir.path / "COMPLETE").exists():
            unbacked = self.rundir.completion_problem()
            if unbacked is None:
                print(f"[run] {self.run_id} is already complete; nothing to do")
                print_summary(self.rundir.path)
                return self.rundir.path
        samples = self.task.load()
        lengths = self._check_prompts(samples)
        self.sample_set = digest([s.sample_id for s in samples])
        self._check_resume()  # read-only: a damaged record or another writer's parts stop the run untouched
        if not {s.sample_id for s in samples} <= self.rundir.done_samples():
            self._give_cost_curve()  # before anything is written: a curve too noisy to trust stops here
        with RunLock(self.rundir.path):
            if unbacked is not None:
                print(f"[run] {self.run_id} is marked COMPLETE but {unbacked}: resuming it as incomplete")
                self.rundir.withdraw_complete()
            self._check_resume()
            self.rundir.write_provenance(self._provenance())
            done = self.rundir.done_samples()
            todo = [s for s in samples if s.sample_id not in done]
            started = datetime.now(timezone.utc).isoformat()
            self.rundir.write_run(self._run_row("running", started))
            self.engine.reserve(self._capacity_bound(samples))
            if todo and self.settings.warmup:
                self._warmup(max(todo, key=lambda s: lengths[s.sample_id]))
            if self.compile_s:
                print(f"[run] compiled the fixed-shape forwards in {self.compile_s:.1f} s (not decode time)")
            self._run_samples(todo, len(done))
            failed = self.rundir.failed_samples()
            tables = self.rundir.consolidate()
            self.rundir.write_run(self._run_row("failed" if failed else "complete", started))
            if not failed:
                self.rundir.mark_complete(tables)
        # the W&B mirror after the lock is released and nothing is timed: its waits for the network (a
        # short init timeout) never hold up another run of this id, nor its service a timed sample
        sink = WandbSink(cfg.wandb, OmegaConf.to_container(cfg, resolve=True), self.run_id, self.names)
        try:
            sink.log(tables, self.rundir.path)
        finally:
            sink.finish()
        print_summary(self.rundir.path)
        if self.task.unscored:
            print(f"[run] task {self.names['task']} has no automatic score: {self.task.unscored}")
        if failed:
            self._raise_failed(failed, len(samples))
        return self.rundir.path

    def _give_cost_curve(self) -> None:
        """`decoder.block=auto`: hand the decoder this environment's cost curve t(rows, ctx), from the
        cache or measured now on a compact grid (before anything is timed; then cached)."""
        if getattr(self.decoder, "block", "fixed") != "auto":
            return
        eng, model, dtype = self.engine, self.names["model"], self.identity["dtype"]
        key = curve_key(
            self.device_name,
            model,
            dtype,
            eng.linear,
            self.threads,
            graphs=self.graphed,
            model_name=self.lm.name,
            compiled=bool(self.identity.get("compile")),
        )
        announce = lambda text: print(f"[run] block=auto: {text}", flush=True)  # noqa: E731
        curve, _ = cached_or_measured(self.engine, key, self.decoder.max_block(), on_measure=announce)
        self.cost_curve = cache_name(key)
        self.decoder.use_cost(curve)

    def _run_samples(self, todo: list[Sample], n_done: int) -> None:
        total = sum(self.task.n_turns(s) for s in todo)
        bar = tqdm(
            total=total,
            desc=f"{self.names['decoder']}+{self.names['kv']} on {self.names['task']}",
            unit="turn",
            disable=None,
        )
        if n_done:
            print(f"[run] resuming {self.run_id}: {n_done} samples already done, {len(todo)} to go")
        # without a terminal tqdm draws nothing: a line per sample still shows the run is alive
        lines = bar.disable
        start = time.perf_counter()
        for i, sample in enumerate(todo, 1):
            rows, steps, scores = self._run_sample(sample, bar)
            self.rundir.write_sample(sample.sample_id, rows, steps, scores)
            if lines:
                elapsed = time.perf_counter() - start
                print(
                    f"[run] sample {i}/{len(todo)} done ({sample.sample_id}, {elapsed:.0f} s so far)",
                    flush=True,
                )
        bar.close()

    def _raise_failed(self, failed: set[str], n_samples: int) -> None:
        errors = pd.read_parquet(self.rundir.path / "samples.parquet", columns=["sample_id", "error"])
        first = errors["error"].dropna().iloc[0] if errors["error"].notna().any() else "?"
        which = "every sample" if len(failed) >= n_samples else f"{len(failed)} of {n_samples} samples"
        raise HarnessError(
            f"{which} of run {self.run_id} failed (first: {first}); the run is not complete: rerunning "
            "the same command retries the failed samples"
        )

    def _check_resume(self) -> None:
        """Refuse to add samples to a run started by other code, packages, hardware or threads. The
        samples already written say who wrote them (`parts/provenance.json`); runs recorded before
        that file existed are checked against their `runs.parquet`."""
        if not self.rundir.done_samples():
            return
        then = self.rundir.read_provenance()
        if then is None:
            old = self.rundir.read_run()
            if old is None:
                raise HarnessError(
                    f"run {self.run_id} has finished samples but no record of the code that wrote them; "
                    f"resuming could mix samples: remove {self.rundir.path} to start it afresh"
                )
            then = {col: old.get(col) for col in PROVENANCE}
        now = self._provenance()
        diff = [col for col in PROVENANCE if str(now[col]) != str(then.get(col))]
        if diff:
            what = "; ".join(f"{PROVENANCE[c]}: {then.get(c)} then, {now[c]} now" for c in diff)
            raise HarnessError(
                f"run {self.run_id} was started with another {', '.join(PROVENANCE[c] for c in diff)} "
                f"({what}); resuming would mix "
                f"samples: remove {self.rundir.path} to start it afresh, or set run.out_dir to another folder"
            )

    def _check_prompts(self, samples: list[Sample]) -> dict[str, int]:
        """Turn-0 prompt length of every sample. A turn that may not fit stops the run before anything
        is generated: each turn's prompt with the earlier answers left empty, plus max_new_tokens for
        each of them and for its own, must fit the model's context (an answer holds at most max_new_tokens
        tokens; one whose text re-encodes longer, e.g. bytes that are no valid text, is caught before
        its turn runs, `_fits`, and fails its sample)."""
        max_new, tok = self.task.max_new_tokens, self.lm.tokenizer
        lengths = {}
        for s in samples:
            for turn in range(self.task.n_turns(s)):
                try:
                    n = len(self.task.prompt_ids(s, turn, [""] * turn, tok))
                except Exception:  # noqa: BLE001 - a later turn that cannot render fails in its own turn
                    if turn == 0:
                        raise
                    break
                lengths.setdefault(s.sample_id, n)
                self._fits(s.sample_id, turn, n, turn * max_new)
        return lengths

    def _fits(self, sample_id: str, turn: int, prompt: int, answers: int = 0) -> None:
        """Refuse a turn whose prompt (`prompt` tokens, + `answers` for earlier answers not in it yet) and
        max_new_tokens exceed the model's context."""
        limit, max_new = self.engine.max_positions, self.task.max_new_tokens
        if prompt + answers + max_new <= limit:
            return
        what = f"prompt of {prompt} tokens"
        if answers:
            what += f" + {turn} earlier answer(s) of up to max_new_tokens {max_new} each"
        where = f"sample {sample_id}" + (f" turn {turn}" if turn else "")
        raise HarnessError(
            f"{where}: {what} + max_new_tokens {max_new} exceeds the model context ({limit}); lower "
            "run.max_new_tokens or use a longer-context model"
        )

    def _capacity_bound(self, samples: list[Sample]) -> int:
        """KV entries the longest generation of the run can need: the last turn's prompt with every
        earlier answer at full length, + max_new_tokens, + the decoder's block (+10% for re-tokenising)."""
        max_new = self.task.max_new_tokens
        filler = " ".join(["the"] * max_new)
        bound = 0
        for s in samples:
            last = self.task.n_turns(s) - 1
            try:
                prompt = self.task.prompt_ids(s, last, [filler] * last, self.lm.tokenizer)
            except Exception:  # noqa: BLE001 - a sample that cannot render fails in its own timed turn
                prompt = self.task.prompt_ids(s, 0, [], self.lm.tokenizer)
            bound = max(bound, len(prompt) + max_new)
        extra = self.decoder.max_block() + 1
        return min(int(bound * 1.1) + extra, self.engine.max_positions + extra)

    def _warmup(self, sample: Sample) -> int:
        """Untimed generations on the longest prompt: one, over the whole length when the attention
        backend compiles per shape or CUDA graphs are captured per block size (so the timed samples
        reuse what it made), then more until `run.warmup_s` seconds have passed. Returns how many ran.
        By default a CUDA device warms up for GPU_WARMUP_S, because a GPU's first seconds of work after
        idling can run slower than the rest, which would bias the first timed sample."""
        ids = self.task.prompt_ids(sample, 0, [], self.lm.tokenizer)
        max_new = self.task.max_new_tokens
        # a backend that compiles per shape, or CUDA graphs captured per block size, warms up over the
        # whole length so the timed samples reuse what it made
        whole = self.decoder.compiles_attention() or self.engine.graphs is not None
        n = max_new if whole else min(WARMUP_TOKENS, max_new)
        start, runs = time.perf_counter(), 0
        while runs == 0 or time.perf_counter() - start < self.warmup_s:
            self.decoder.generate(ids, n, self.stop_ids, Counts(keep_steps=False))
            runs += 1
        return runs


def run(cfg: DictConfig) -> Path:
    """Run `cfg`; a second identical command is refused before its model loads."""
    settings = check_config(cfg)
    with CommandLock(settings.out_dir / "runs", command_key(cfg)):
        return Runner(cfg).run()
