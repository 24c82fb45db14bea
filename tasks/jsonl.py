"""Reading task data files with one clear error line per problem (file, line and field)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from core.types import HarnessError
from tasks.datafile import read_text

T = TypeVar("T")


class FieldError(ValueError):
    """A field of a data row that is missing or of the wrong type (the message names the field)."""


def read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, row) pairs of a .jsonl or .jsonl.gz file, each row a JSON object; blank lines are
    skipped; a file without rows is refused."""
    rows = []
    for line_no, line in enumerate(read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise HarnessError(f"malformed JSON at {path}:{line_no}: {exc}") from None
        if not isinstance(row, dict):
            raise HarnessError(
                f"malformed row at {path}:{line_no}: expected a JSON object, got {describe(row)}"
            )
        rows.append((line_no, row))
    if not rows:
        raise HarnessError(f"data file {path} holds no rows (one JSON object per line expected)")
    return rows


def parse_rows(
    rows: Iterable[tuple[Any, dict[str, Any]]], where: str, parse: Callable[[dict[str, Any], int], T]
) -> list[T]:
    """`parse(row, index)` for each (row id, row); index counts rows from 0. A missing key or a bad value
    becomes a HarnessError naming `where`:row id (the line number for files) and the field."""
    out = []
    for index, (row_id, row) in enumerate(rows):
        try:
            out.append(parse(row, index))
        except FieldError as exc:
            raise HarnessError(f"malformed row at {where}:{row_id}: {exc}") from None
        except KeyError as exc:
            raise HarnessError(
                f"malformed row at {where}:{row_id}: field {exc.args[0]!r} is missing"
            ) from None
        except (TypeError, ValueError, AttributeError) as exc:
            raise HarnessError(f"malformed row at {where}:{row_id}: {exc.__class__.__name__}: {exc}") from exc
    return out


def describe(value: Any) -> str:
    """What a JSON value is, for an error message: `a string`, `a list`, `null`, ..."""
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "a list"}
    return names.get(type(value), "an object")


def require_str(row: dict[str, Any], key: str) -> str:
    """row[key] as a non-empty string, else FieldError (for `parse_rows`)."""
    value = row[key]
    if not isinstance(value, str) or not value.strip():
        got = "an empty string" if isinstance(value, str) else describe(value)
        raise FieldError(f"field {key!r} must be a non-empty string, got {got}")
    return value


def require_id(row: dict[str, Any], key: str) -> str:
    """row[key], a non-empty string or an integer, as a string (an id that keys the records)."""
    value = row[key]
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return require_str(row, key)


def require_turns(row: dict[str, Any], key: str) -> list[str]:
    """row[key] as a non-empty list of non-empty strings (a multi-turn conversation's user turns)."""
    value = row[key]
    if not isinstance(value, list) or not value:
        got = "an empty list" if isinstance(value, list) else describe(value)
        raise FieldError(f"field {key!r} must be a non-empty list of non-empty strings, got {got}")
    for i, turn in enumerate(value):
        if not isinstance(turn, str) or not turn.strip():
            got = "an empty string" if isinstance(turn, str) else describe(turn)
            raise FieldError(f"field {key!r} must hold non-empty strings; its item {i} is {got}")
    return value


def optional_str(row: dict[str, Any], key: str) -> str:
    """row[key] as a string, "" when absent or null."""
    value = row.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise FieldError(f"field {key!r} must be a string, got {describe(value)}")
    return value
