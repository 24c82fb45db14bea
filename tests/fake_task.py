"""A task defined outside tasks/ (external tasks plug in through `task._target_`)."""

from __future__ import annotations

import time

from core.types import Sample
from tasks.base import Task


class FakeTask(Task):
    name = "fake"
    version = "1"

    def __init__(
        self,
        n: int = 3,
        broken: str | None = None,
        pad: int = 0,
        ignore_eos: bool = False,
        delay_s: float = 0.0,
        **kw,
    ) -> None:
        super().__init__(**kw)
        self.n, self.broken, self.pad = n, broken, pad  # pad: filler words making prompts longer
        self.ignore_eos = ignore_eos  # True: every turn runs to max_new_tokens
        # seconds scoring each sample takes (outside the timed generation): a job that a fast machine
        # would otherwise finish before a cancel reaches it
        self.delay_s = delay_s

    def _load(self) -> list[Sample]:
        filler = " ".join(["filler"] * self.pad)
        return [
            Sample(f"s{i}", [f"question {i} {filler}".strip(), f"follow-up {i}"], "cat", reference=str(i))
            for i in range(self.n)
        ]

    def prompt_ids(self, sample, turn, history, tokenizer):
        if sample.sample_id == self.broken and turn == 1:
            raise ValueError("broken sample: turn 2 cannot be rendered")
        return super().prompt_ids(sample, turn, history, tokenizer)

    def score(self, sample, outputs):
        time.sleep(self.delay_s)
        return {"length": float(sum(len(o) for o in outputs))}
