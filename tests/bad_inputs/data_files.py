"""Damaged data files: what `{data:<name>}` in a case writes (`DATA_FILES`), and the cases that read
them (`DATA_CASES`, the section `# damaged data files` of `CASES`)."""

from __future__ import annotations

import gzip
from pathlib import Path

from tests.bad_inputs.command import _c

# damaged data files: what `{data:<name>}` writes, (file name, bytes)
_Q = '{"question_id": 1, "category": "writing", "turns": %s}\n'
DATA_FILES: dict[str, tuple[str, bytes]] = {
    "binary": ("questions.jsonl", b"\x89PNG\x00\x01\x02\xff\xfe"),
    "latin1": ("questions.jsonl", (_Q % '["Caf\u00e9?"]').encode("latin-1")),
    "latin1_line2": ("questions.jsonl", ((_Q % '["ok"]') + (_Q % '["Caf\u00e9?"]')).encode("latin-1")),
    "latin1_json": ("problems.json", '[{"question": "Caf\u00e9?", "answer": "1"}]'.encode("latin-1")),
    "latin1_txt": ("book.txt", "Caf\u00e9 ".encode("latin-1") * 10),
    "fake_gz": ("questions.jsonl.gz", (_Q % '["hi"]').encode()),
    "gzip_unnamed": ("questions.jsonl", gzip.compress((_Q % '["hi"]').encode(), mtime=0)),
    "cut_gz": ("questions.jsonl.gz", gzip.compress((_Q % '["hi"]').encode() * 50, mtime=0)[:40]),
    "empty": ("questions.jsonl", b""),
    "blank_lines": ("questions.jsonl", b"\n  \n\n"),
    "not_json": ("questions.jsonl", b"hello world\n"),
    "json_list": ("questions.jsonl", b"[1, 2]\n"),
    "turns_str": ("questions.jsonl", (_Q % '"hello"').encode()),
    "turns_empty": ("questions.jsonl", (_Q % "[]").encode()),
    "turns_numbers": ("questions.jsonl", (_Q % "[1, 2]").encode()),
    "turns_blank": ("questions.jsonl", (_Q % '["hi", "  "]').encode()),
    "turns_null": ("questions.jsonl", (_Q % "null").encode()),
    "turns_missing": ("questions.jsonl", b'{"question_id": 1}\n'),
    "turns_bad_line2": ("questions.jsonl", ((_Q % '["ok"]') + (_Q % '["ok", 7]')).encode()),
    "id_missing": ("questions.jsonl", b'{"turns": ["hi"]}\n'),
    "id_bool": ("questions.jsonl", b'{"question_id": true, "turns": ["hi"]}\n'),
    "id_twice": ("questions.jsonl", ((_Q % '["a"]') + (_Q % '["b"]')).encode()),
    "category_number": ("questions.jsonl", b'{"question_id": 1, "category": 3, "turns": ["hi"]}\n'),
    "one_question": ("questions.jsonl", (_Q % '["hi", "and?"]').encode()),
    "gsm8k_number": ("test.jsonl", b'{"question": 12, "answer": "#### 3"}\n'),
    "gsm8k_no_marker": ("test.jsonl", b'{"question": "2+1?", "answer": "3"}\n'),
    "text_number": ("docs.json", b'[{"text": 5}]'),
    "empty_list_json": ("docs.json", b"[]"),
    "short_txt": ("book.txt", b"A short book.\n"),
}


def data_file(tmp: Path, name: str) -> str:
    """`DATA_FILES[name]` written under `tmp` (a folder of its own, so that two never clash)."""
    file_name, content = DATA_FILES[name]
    path = tmp / "data" / name / file_name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return str(path)


DATA_CASES = [
    # refused in the pre-flight: a task.data_path is read and checked before the model loads
    _c("holds a NUL byte at offset 4 (line 1)", "task.data_path={data:binary}"),
    _c("is not UTF-8: byte 0xe9 at offset 56 (line 1)", "task.data_path={data:latin1}"),
    _c("is not UTF-8: byte 0xe9 at offset 115 (line 2)", "task.data_path={data:latin1_line2}"),
    _c("is a folder, not a file", "task.data_path={folder}"),
    _c("/dev/null is a character device: give a file", "task.data_path=/dev/null"),
    _c("is named .gz but is not gzip-compressed", "task.data_path={data:fake_gz}"),
    _c("is gzip-compressed: name it questions.jsonl.gz", "task.data_path={data:gzip_unnamed}"),
    _c("is a damaged gzip archive", "task.data_path={data:cut_gz}"),
    _c("holds no rows", "task.data_path={data:empty}"),
    _c("holds no rows", "task.data_path={data:blank_lines}"),
    _c("malformed JSON at", "task.data_path={data:not_json}"),
    _c("expected a JSON object, got a list", "task.data_path={data:json_list}"),
    _c(
        "field 'turns' must be a non-empty list of non-empty strings, got a string",
        "task.data_path={data:turns_str}",
    ),
    _c(
        "field 'turns' must be a non-empty list of non-empty strings, got an empty list",
        "task.data_path={data:turns_empty}",
    ),
    _c(
        "field 'turns' must hold non-empty strings; its item 0 is a number",
        "task.data_path={data:turns_numbers}",
    ),
    _c(
        "field 'turns' must hold non-empty strings; its item 1 is an empty string",
        "task.data_path={data:turns_blank}",
    ),
    _c(
        "field 'turns' must be a non-empty list of non-empty strings, got null",
        "task.data_path={data:turns_null}",
    ),
    _c("field 'turns' is missing", "task.data_path={data:turns_missing}"),
    _c(
        "questions.jsonl:2: field 'turns' must hold non-empty strings",
        "task.data_path={data:turns_bad_line2}",
    ),
    _c("field 'question_id' is missing", "task.data_path={data:id_missing}"),
    _c("field 'question_id' must be a non-empty string, got a boolean", "task.data_path={data:id_bool}"),
    _c("sample id '1' appears twice", "task.data_path={data:id_twice}"),
    _c("field 'category' must be a string, got a number", "task.data_path={data:category_number}"),
    _c(
        "run.limit=5 exceeds the 1 samples of task mtbench",
        "run.limit=5",
        "task.data_path={data:one_question}",
    ),
    _c("field 'turns'", "-m", "run.seed=0,1", "task.data_path={data:turns_str}"),
    _c("is not UTF-8", "task=gsm8k", "task.data_path={data:latin1}"),
    _c("field 'question' is missing", "task=gsm8k", "task.data_path={data:turns_str}"),
    _c(
        "field 'question' must be a non-empty string, got a number",
        "task=gsm8k",
        "task.data_path={data:gsm8k_number}",
    ),
    _c("answer has no '#### <number>' line", "task=gsm8k", "task.data_path={data:gsm8k_no_marker}"),
    _c("is named .gz but is not gzip-compressed", "task=humaneval", "task.data_path={data:fake_gz}"),
    _c("holds a NUL byte", "task=multi_if", "task.data_path={data:binary}"),
    _c("is not UTF-8", "task=aime24", "task.data_path={data:latin1_json}"),
    _c("is not UTF-8: byte 0xe9", "task=pg19", "task.data_path={data:latin1_txt}"),
    _c("is a folder", "task=pg19", "task.data_path={folder}"),
    _c("field 'text' is missing", "task=pg19", "task.data_path={data:turns_str}"),
    _c(
        "field 'text' must be a non-empty string, got a number",
        "task=narrativeqa",
        "task.data_path={data:text_number}",
    ),
    _c("holds an empty list", "task=narrativeqa", "task.data_path={data:empty_list_json}"),
    _c("no document is long enough", "task=pg19", "task.data_path={data:short_txt}"),
    _c("is a damaged gzip archive", "task=pg19", "task.data_path={data:cut_gz}"),
]
