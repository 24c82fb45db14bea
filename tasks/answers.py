"""Final-answer extraction and numeric comparison for math word problems (GSM8K, AIME).

Extraction order (the first rule that fires wins), mirroring the usual strict-then-flexible scheme of
lm-eval's GSM8K filters and the \\boxed{} convention of reasoning models (DeepSeek-R1, QwQ):
1. the last `\\boxed{...}` (balanced braces);
2. the number after the last "####" (GSM8K's gold format);
3. the number after the last "answer is" / "answer:";
4. the last number anywhere in the text.
Numbers are compared as values: "1,000", "$1000.00" and "1000" are equal.
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_ANSWER_IS = re.compile(r"answer(?:\s+is|:)", re.IGNORECASE)


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def _last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def extract_answer(text: str) -> str | None:
    """The model's final answer as a string (see module docstring), or None."""
    boxed = _last_boxed(text)
    if boxed is not None:
        inner = boxed.strip().strip("$").strip()
        return inner if to_number(inner) is not None else boxed.strip()
    if "####" in text and (num := _last_number_after(text, text.rfind("####") + 4)) is not None:
        return num
    marks = list(_ANSWER_IS.finditer(text))
    if marks and (num := _last_number_after(text, marks[-1].end())) is not None:
        return num
    return _last_number(text)


def _last_number_after(text: str, pos: int) -> str | None:
    found = _NUMBER.search(text, pos)
    return found.group(0) if found else None


def to_number(answer: str | None) -> float | None:
    """'$1,000.50' -> 1000.5; None when it is not a number."""
    if answer is None:
        return None
    cleaned = answer.replace(",", "").replace("$", "").replace(" ", "").rstrip(".")
    try:
        return float(cleaned)
    except ValueError:
        return None


def same_number(prediction: str | None, gold: str) -> bool:
    """Numeric equality of an extracted prediction and the gold answer (abs tol 1e-6)."""
    p, g = to_number(prediction), to_number(gold)
    return p is not None and g is not None and abs(p - g) <= 1e-6
