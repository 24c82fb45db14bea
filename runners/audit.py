"""Losslessness audit: compare a decoder's greedy output with vanilla greedy on the same prompt.

Vanilla outputs are cached in `results/vanilla_cache/<key>.jsonl`, one file per `reference_key`:
everything that changes a vanilla greedy output (model, dtype, device name, linear, threads,
prefill_chunk, torch/transformers versions, and a digest of the code that computes it), one line
per (prompt, max_new_tokens, stop ids), so a sweep computes each reference once and never reuses one
computed under other numerics. Each line carries its output's length and digest: a line that fails
them (edited, null, cut short) is not trusted but made again, so an edited file cannot make a lossless
decoder diverge. At the first divergence the
audit records vanilla's top-2 logit gap there: a gap below ~1e-4 means a numerical near-tie
(floating-point non-associativity between block and single-token forwards), not a bug;
`analysis.metrics.TIE_GAP` holds that tolerance per dtype.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch

from core.engine import Engine
from core.types import Counts
from decoders.vanilla import Vanilla
from runners.provenance import source_digest

# the code a vanilla greedy output depends on (a change to any of these invalidates cached references)
REFERENCE_CODE = (
    "core/engine.py",
    "core/kv_cache.py",
    "core/attention.py",
    "core/hf_compat.py",
    "core/models.py",
    "core/sampling.py",
    "decoders/base.py",
    "decoders/vanilla.py",
    "kv_policies/full.py",
)


def digest(ids: list[int]) -> str:
    return hashlib.sha1(json.dumps(ids).encode()).hexdigest()[:16]


def reference_key(env: dict, repo: Path) -> str:
    """File stem for the cached references of one numeric environment: readable prefix + hash."""
    blob = json.dumps({**env, "code": source_digest(repo, REFERENCE_CODE)}, sort_keys=True, default=str)
    prefix = "-".join(str(env.get(k, "")) for k in ("model_name", "dtype", "linear")).replace("/", "_")
    return f"{prefix}-{hashlib.sha1(blob.encode()).hexdigest()[:12]}"


def reference_line(key: str, ids: list[int]) -> str:
    """One stored reference: its key, its token ids, and their length and digest to check it by."""
    return json.dumps({"key": key, "ids": list(ids), "n": len(ids), "digest": digest(list(ids))})


def checked_reference(line: str) -> tuple[str, list[int]] | None:
    """(key, ids) of a stored line whose ids are token ids of the length and digest stored beside them;
    None for anything else (a torn line from a crash, an edit, a null, a line from before the check)."""
    try:
        row = json.loads(line)
    except ValueError:
        return None
    if not isinstance(row, dict):
        return None
    key, ids = row.get("key"), row.get("ids")
    if not isinstance(key, str) or not isinstance(ids, list):
        return None
    if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        return None
    if row.get("n") != len(ids) or row.get("digest") != digest(ids):
        return None
    return key, ids


class VanillaAudit:
    def __init__(self, engine: Engine, cache_dir: Path, model_key: str) -> None:
        self.engine = engine
        self.reference = Vanilla(
            engine
        )  # full KV, greedy; shares the run's engine (one cache, one weight copy)
        self.path = cache_dir / f"{model_key}.jsonl"
        self.known: dict[str, list[int]] = {}
        self.untrusted = 0  # stored lines that failed their check (dropped from the file at the next write)
        try:
            lines = self.path.read_text(errors="replace").splitlines() if self.path.is_file() else []
        except OSError:
            lines = []  # unreadable: every reference is made again
        for line in lines:
            checked = checked_reference(line)
            if checked is None:
                self.untrusted += line.strip() != ""
            else:
                self.known[checked[0]] = checked[1]
        if self.untrusted:
            print(
                f"[audit] {self.untrusted} vanilla reference(s) in {self.path} fail their length or digest "
                "check (edited, null or cut short): not trusted, made again where needed",
                flush=True,
            )

    @staticmethod
    def _key(prompt: list[int], max_new_tokens: int, stop_ids: set[int]) -> str:
        return f"{digest(prompt)}-{max_new_tokens}-{digest(sorted(stop_ids))}"

    def record(self, prompt: list[int], max_new_tokens: int, stop_ids: set[int], ids: list[int]) -> None:
        """Store a reference output (the runner does this when the run itself is vanilla + full KV)."""
        key = self._key(prompt, max_new_tokens, stop_ids)
        if self.known.get(key) == ids:
            return
        self.known[key] = list(ids)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.untrusted:  # rewrite the file without its failed lines (a concurrent append is made again)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text("".join(reference_line(k, v) + "\n" for k, v in self.known.items()))
            os.replace(tmp, self.path)
            self.untrusted = 0
            return
        with open(self.path, "a") as f:
            f.write(reference_line(key, ids) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def vanilla_ids(self, prompt: list[int], max_new_tokens: int, stop_ids: set[int]) -> list[int]:
        key = self._key(prompt, max_new_tokens, stop_ids)
        if key not in self.known:
            ids = self.reference.generate(prompt, max_new_tokens, stop_ids, Counts(keep_steps=False))
            self.record(prompt, max_new_tokens, stop_ids, ids)
        return self.known[key]

    def compare(
        self, prompt: list[int], out: list[int], max_new_tokens: int, stop_ids: set[int]
    ) -> tuple[bool, int | None, float | None]:
        """(matches, first divergence index, vanilla top-2 logit gap at that index)."""
        ref = self.vanilla_ids(prompt, max_new_tokens, stop_ids)
        if out == ref:
            return True, None, None
        i = next((j for j, (a, b) in enumerate(zip(out, ref)) if a != b), min(len(out), len(ref)))
        if i >= len(ref):
            return False, i, None
        return False, i, self.top2_gap(prompt + ref[:i])

    @torch.inference_mode()
    def top2_gap(self, context: list[int]) -> float:
        self.engine.reset(len(context) + 1)
        logits = self.engine.prefill(context)
        top = torch.topk(logits.float(), 2).values
        return float(top[0] - top[1])
