"""SCBench (Li et al. 2025) subsets of FAFO Table 3: Math.Find, RepoQA, ICL.ManyShot, Retr.MultiHop.

Hub only (`microsoft/SCBench`, configs scbench_mf / scbench_repoqa / scbench_many_shot / scbench_vt;
split test). SCBench is a shared-context, multi-turn benchmark: one long context and several queries
about it. Here a sample is one context with its queries as successive user turns of the chat template
(turn 1 = context + first query; later turns = the next query, with the model's earlier answers in
the history), SCBench's multi-turn mode. The query wording is SCBench's own `input` field; the context
is framed by a short neutral instruction (below), not SCBench's per-model templates.

Metrics per turn, averaged over the sample's turns (simple names):
- math_find: `accuracy`, the extracted final number equals the gold (tasks/answers.py);
- repoqa: `edit_sim`, character similarity of the output to the gold function (SCBench scores RepoQA
  by similarity to the reference function as well);
- icl_manyshot: `accuracy`, the gold label occurs in the output's first line;
- retr_multihop (variable tracking): `accuracy`, the fraction of gold variable names in the output.
No offline copy exists: the offline long-context stand-ins are `task=longbench_ruler_niah`
and `task=longbench_ruler_qa`.
"""

from __future__ import annotations

from typing import Any

from core.types import HarnessError, Sample
from tasks.answers import extract_answer, same_number
from tasks.base import Task
from tasks.hub import load_hub
from tasks.metrics import edit_sim

CONFIGS = {
    "math_find": "scbench_mf",
    "repoqa": "scbench_repoqa",
    "icl_manyshot": "scbench_many_shot",
    "retr_multihop": "scbench_vt",
}
METRIC = {
    "math_find": "accuracy",
    "repoqa": "edit_sim",
    "icl_manyshot": "accuracy",
    "retr_multihop": "accuracy",
}
FRAME = "Read the following context carefully; questions about it follow.\n\n{context}\n\n{query}"
OFFLINE = "SCBench has no offline copy; offline, use task=longbench_ruler_niah or task=longbench_ruler_qa"


def _answers(value: Any) -> list[str]:
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    return [str(value)]


def turn_score(subset: str, prediction: str, golds: list[str]) -> float:
    """Score of one turn's output against its gold answer(s)."""
    if subset == "math_find":
        return float(any(same_number(extract_answer(prediction), g) for g in golds))
    if subset == "repoqa":
        return max(edit_sim(prediction.strip(), g.strip()) for g in golds)
    if subset == "icl_manyshot":
        first = prediction.strip().split("\n")[0].lower()
        return float(any(g.strip().lower() in first for g in golds if g.strip()))
    return sum(g.lower() in prediction.lower() for g in golds) / len(golds)  # retr_multihop


class SCBench(Task):
    name = "scbench"
    version = "1"

    def __init__(self, subset: str = "math_find", hub_id: str = "microsoft/SCBench", **kw: Any) -> None:
        super().__init__(**kw)
        if subset not in CONFIGS:
            raise HarnessError(f"task scbench: unknown subset {subset!r}; choose one of {', '.join(CONFIGS)}")
        self.subset, self.hub_id = subset, hub_id
        self.name = f"scbench_{subset}"

    def _load(self) -> list[Sample]:
        if self.source in ("package", "local") or self.data_path:
            raise HarnessError(f"task {self.name}: {OFFLINE}")
        ds = load_hub(self.name, self.hub_id, "test", OFFLINE, config=CONFIGS[self.subset])
        samples = []
        for i, row in enumerate(ds):
            try:
                queries = [str(t["input"]) for t in row["multi_turns"]]
                golds = [_answers(t["answer"]) for t in row["multi_turns"]]
                if not queries:
                    raise ValueError("no queries in multi_turns")
                turns = [FRAME.format(context=row["context"], query=queries[0]), *queries[1:]]
            except (KeyError, TypeError, ValueError) as exc:
                raise HarnessError(
                    f"malformed row at {self.hub_id}/{CONFIGS[self.subset]}:{i}: {exc!r}"
                ) from exc
            samples.append(Sample(str(row.get("id", i)), turns, self.subset, {"answers": golds}))
            if self.limit and len(samples) >= self.limit:
                break
        return samples

    def score(self, sample: Sample, outputs: list[str]) -> dict[str, float]:
        golds = sample.reference["answers"]
        per_turn = [
            turn_score(self.subset, outputs[t] if t < len(outputs) else "", g) for t, g in enumerate(golds)
        ]
        return {METRIC[self.subset]: sum(per_turn) / len(per_turn)}
