"""Reading task data files with one clear error line per problem (file and row)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

from core.types import HarnessError

T = TypeVar("T")


def read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """(line number, row) pairs of a .jsonl or .jsonl.gz file; blank lines are skipped."""
    if not path.exists():
        raise HarnessError(f"data file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise HarnessError(f"malformed JSON at {path}:{line_no}: {exc}") from exc
            if not isinstance(row, dict):
                raise HarnessError(f"malformed row at {path}:{line_no}: expected an object")
            rows.append((line_no, row))
    return rows


def parse_rows(
    rows: Iterable[tuple[Any, dict[str, Any]]], where: str, parse: Callable[[dict[str, Any], int], T]
) -> list[T]:
    """`parse(row, index)` for each (row id, row); index counts rows from 0. A missing key or a bad value
    becomes a HarnessError naming `where`:row id (the line number for files)."""
    out = []
    for index, (row_id, row) in enumerate(rows):
        try:
            out.append(parse(row, index))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise HarnessError(f"malformed row at {where}:{row_id}: {exc.__class__.__name__}: {exc}") from exc
    return out


def require_str(row: dict[str, Any], key: str) -> str:
    """row[key] as a non-empty string, else TypeError (for `parse_rows`)."""
    value = row[key]
    if not isinstance(value, str) or not value.strip():
        raise TypeError(f"field {key!r} must be a non-empty string")
    return value
