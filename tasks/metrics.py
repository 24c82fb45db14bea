"""Text metrics shared by the tasks (pure Python, no extra packages).

Definitions follow the benchmarks' official scorers (re-implemented here, not copied):
- `normalize_answer` + `token_f1`: SQuAD-style answer normalisation and bag-of-tokens F1, as in
  LongBench's `qa_f1_score` (Qasper, 2WikiMQA, NarrativeQA).
- `rouge_l`: ROUGE-L F-measure over whitespace tokens (longest common subsequence), as LongBench's
  `rouge_score` for Multi-News (which calls the `rouge` package's ROUGE-L F).
- `edit_sim`: the Levenshtein "ratio" (indel distance: 2 * LCS / total length) on characters, the
  similarity LongBench's `code_sim_score` reports for LCC / RepoBench-P (fuzzywuzzy ratio / 100).
"""

from __future__ import annotations

import re
import string
from collections import Counter

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and English articles, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCT)
    return " ".join(_ARTICLES.sub(" ", text).split())


def token_f1(prediction: str, gold: str) -> float:
    """Bag-of-tokens F1 between normalised prediction and gold (0 when either is empty)."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def max_over(metric, prediction: str, golds: list[str]) -> float:
    """Best score over several gold answers (LongBench takes the max over references)."""
    return max((metric(prediction, g) for g in golds), default=0.0)


def _lcs_len(a: list, b: list) -> int:
    """Length of the longest common subsequence, O(len(a) * len(b)) time, O(len(b)) memory."""
    if len(a) < len(b):
        a, b = b, a
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b, 1):
            cur.append(prev[j - 1] + 1 if x == y else max(prev[j], cur[j - 1]))
        prev = cur
    return prev[-1]


def rouge_l(prediction: str, gold: str) -> float:
    """ROUGE-L F1 over lower-cased whitespace tokens."""
    pred, ref = prediction.lower().split(), gold.lower().split()
    if not pred or not ref:
        return 0.0
    lcs = _lcs_len(pred, ref)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(pred), lcs / len(ref)
    return 2 * precision * recall / (precision + recall)


def edit_sim(prediction: str, gold: str) -> float:
    """Levenshtein ratio with indel costs: 2 * LCS(chars) / (len(pred) + len(gold)); 1.0 for two empties."""
    total = len(prediction) + len(gold)
    return 1.0 if total == 0 else 2 * _lcs_len(list(prediction), list(gold)) / total
