"""GSM8K (Cobbe et al. 2021), test split (1,319 problems), as the draftless-decoding papers run it.

Prompt: zero-shot, the question alone as the single user turn of the model's chat template. This is
the Spec-Bench "math_reasoning" form (GSM8K questions as chat prompts) that Lookahead/FAFO-style speed
studies use; FAFO does not state its prompt, so `prompt_suffix=` can append an instruction (e.g. a
"Let's think step by step" line) and is logged with the task parameters.
Score: `accuracy` = the extracted final number (tasks/answers.py) equals the gold after "####".

Data: `data_path=` a local test.jsonl; by default the copy shipped in `tasks/data/gsm8k/` (the
MIT-licensed test split from openai/grade_school_math, LICENSE beside it), so it works offline; the
hub `openai/gsm8k` (config main) when that file is absent (`source=auto`) or with `source=hub`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.types import HarnessError, Sample
from tasks.answers import extract_answer, same_number
from tasks.base import Task
from tasks.hub import load_hub
from tasks.jsonl import parse_rows, read_jsonl, require_str

DEFAULT_FILE = Path(__file__).resolve().parent / "data" / "gsm8k" / "test.jsonl"


def gold_answer(solution: str) -> str:
    """The number after '####' in a GSM8K solution."""
    if "####" not in solution:
        raise ValueError("answer has no '#### <number>' line")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


class GSM8K(Task):
    name = "gsm8k"
    version = "1"

    def __init__(self, prompt_suffix: str = "", **kw: Any) -> None:
        super().__init__(**kw)
        self.prompt_suffix = prompt_suffix

    def _load(self) -> list[Sample]:
        path = Path(self.data_path) if self.data_path else DEFAULT_FILE
        if self.source == "hub" or (self.source == "auto" and not self.data_path and not path.exists()):
            ds = load_hub(
                self.name,
                "openai/gsm8k",
                "test",
                f"use task.data_path=<GSM8K test.jsonl> (e.g. {DEFAULT_FILE}) with task.source=local",
                config="main",
            )
            return parse_rows(((i, dict(r)) for i, r in enumerate(ds)), "openai/gsm8k", self._sample)
        if not path.exists():
            raise HarnessError(
                f"GSM8K file not found: {path}; pass task.data_path=... or use task.source=hub"
            )
        return parse_rows(read_jsonl(path), str(path), self._sample)

    def _sample(self, row: dict[str, Any], index: int) -> Sample:
        question = require_str(row, "question")
        answer = gold_answer(require_str(row, "answer"))
        return Sample(f"gsm8k-{index}", [question + self.prompt_suffix], "math", answer)

    def score(self, sample: Sample, outputs: list[str]) -> dict[str, float]:
        return {
            "accuracy": float(same_number(extract_answer(outputs[0] if outputs else ""), sample.reference))
        }
