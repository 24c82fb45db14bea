"""The rows a run writes, built by `Runner` (which inherits `RunRows`): one timed generation per
(sample, turn) into its `samples` row (`_generate`), a sample's turns, steps and scores
(`_run_sample`), and the one `runs.parquet` row (`_run_row`) with the provenance a resume must match
(`PROVENANCE`). The tables and their columns are `runners.records`; composing the run and the checks
before anything is timed are `runners.runner`."""

from __future__ import annotations

import hashlib
import json
import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

from core.types import Counts, HarnessError, Sample
from runners.audit import VanillaAudit, digest
from runners.host_syncs import syncs_per_step
from runners.records import host_counters, measurements
from runners.timing import DecodeClocks, peak_memory_mb, timed_generate

if TYPE_CHECKING:
    from core.engine import Engine
    from core.sampling import Sampler
    from runners.config import RunSettings
    from tasks.base import Task

# run-record columns that must not change within one run (a resume by anything else is refused), with
# the words the refusal uses for them
PROVENANCE = {
    "git_sha": "code version",
    "versions": "package versions",
    "device_name": "device",
    "threads": "threads",
}


class RunRows:
    """`Runner`'s row builders, apart from its composition and run loop; the attributes below are set by
    `Runner.__init__` (and `sample_set` by `Runner.run`)."""

    cfg: DictConfig
    settings: RunSettings
    lm: Any
    engine: Engine
    sampler: Sampler
    decoder: Any
    task: Task
    stop_ids: set[int]
    names: dict[str, str]
    identity: dict[str, Any]
    run_id: str
    code_version: str
    versions: dict[str, str]
    device_name: str
    threads: int
    warmup_s: float
    cost_curve: str
    sample_set: str
    is_reference: bool
    audit: VanillaAudit | None
    count_syncs: int
    graphed: bool
    compile_s: float

    def _provenance(self) -> dict[str, Any]:
        """What must not change within one run, keyed by its run-record column (`PROVENANCE`)."""
        return {
            "git_sha": self.code_version,
            "versions": json.dumps(self.versions),
            "device_name": self.device_name,
            "threads": self.threads,
        }

    def _seed_for(self, sample_id: str, turn: int) -> int:
        h = hashlib.sha1(f"{self.settings.seed}-{sample_id}-{turn}".encode()).hexdigest()
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
                self._fits(sample.sample_id, turn, len(prompt))
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
        self.sampler.reseed(self._seed_for(digest(prompt), 0))
        max_new = self.task.max_new_tokens
        keep_steps = self.settings.keep_steps
        # the target's and the draft model's forwards and the device reads, to tell the decoder's time
        with DecodeClocks(self.decoder) as clocks:
            timed = timed_generate(
                self.decoder,
                prompt,
                max_new,
                self.stop_ids,
                keep_steps=keep_steps,
                on_prefill_done=clocks.mark,
            )
        peak = peak_memory_mb(eng.device)
        syncs = float("nan")
        if self.count_syncs:  # the same generation again, untimed, its first tokens only
            self.sampler.reseed(self._seed_for(digest(prompt), 0))
            syncs = syncs_per_step(self.decoder, prompt, min(max_new, self.count_syncs), self.stop_ids)
        out = timed.output
        matches = first_div = gap = None
        if self.audit is not None:
            if self.is_reference:
                self.audit.record(prompt, max_new, self.stop_ids, out)
                matches = True
            else:
                matches, first_div, gap = self.audit.compare(prompt, out, max_new, self.stop_ids)
        cache, forward_s = eng.cache, clocks.forwards.seconds_since_mark
        row = {
            **measurements(len(prompt), timed, forward_s, cache.bytes_per_entry(), cache.capacity, peak),
            **host_counters(timed, clocks, syncs),
            "output_digest": digest(out),
            "output_text": self.lm.tokenizer.decode(out, skip_special_tokens=True),
            "output_ids": out,
            "matches_vanilla": matches,
            "first_divergence": first_div,
            "divergence_gap": gap,
            "error": None,
        }
        return row, timed.counts, out

    def _run_row(self, status: str, started: str) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "status": status,
            "started": started,
            "finished": datetime.now(timezone.utc).isoformat() if status != "running" else None,
            **self._provenance(),
            "prefill_chunk": self.identity["prefill_chunk"],
            "model": self.names["model"],
            "model_name": self.lm.name,
            "dtype": self.identity["dtype"],
            "linear": self.engine.linear,
            "cuda_graphs": self.graphed,
            "compile": bool(self.identity.get("compile")),
            # seconds the warm-up spent compiling (first calls per shape), apart from any decode time
            "compile_s": self.compile_s,
            "warmup_s": self.warmup_s,
            "decoder": self.names["decoder"],
            "decoder_params": json.dumps(self.identity["decoder_params"]),
            "lossless": bool(self.decoder.lossless),
            "kv": self.names["kv"],
            "kv_params": json.dumps(self.identity["kv_params"]),
            "draft": self.names["draft"],
            "draft_params": json.dumps(self.identity["draft_params"]),
            "task": self.names["task"],
            "task_version": self.task.version,
            "task_params": json.dumps(self.identity["task_params"]),
            "limit": self.task.limit,
            "sample_set": self.sample_set,
            "experiment": str((self.cfg.get("choices") or {}).get("experiment") or ""),
            "scale": str(OmegaConf.select(self.cfg, "scale.name", default="paper")),
            "max_new_tokens": self.task.max_new_tokens,
            "seed": self.settings.seed,
            "sampling": json.dumps(self.identity["sampling"]),
            "cost_curve": self.cost_curve,
            "time": time.time(),
        }
