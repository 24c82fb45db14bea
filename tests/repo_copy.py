"""A how-to page followed in a copy of the repository (tests/test_adding_a_decoder.py,
tests/test_adding_a_policy.py): the page's files and registry lines (`doc_files`, `doc_lines`), the copy
(`overlay`: what the pages write into copied, the rest linked), the page done there (`follow`), and
Python run in the copy as a user would (`runner`)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COPIED = {
    "decoders",
    "conf",
    "tests",
    "run.py",
}  # what the doc writes into, and the entry point that finds conf/
LEFT_OUT = {".git", ".venv", "outputs", "multirun", "results"}


def doc_files(text: str) -> dict[str, str]:
    """Each fenced block whose first line is a comment naming a repository path: {path: source}."""
    blocks = re.findall(r"```(?:python|yaml)\n# ([\w/.]+)\n(.*?)```", text, re.S)
    return {path: f"# {path}\n{body}" for path, body in blocks}


def doc_lines(text: str) -> dict[tuple[str, str], str]:
    """Each fenced block headed `# <path>: a line in <NAME>`: {(path, NAME): the line to add}."""
    blocks = re.findall(r"```python\n# ([\w/.]+): a line in (\w+)\n(.*?)```", text, re.S)
    return {(path, name): body for path, name, body in blocks}


def follow(doc: Path, root: Path) -> None:
    """Do what the page says in the repository copy `root`: write its files, add its lines."""
    text = doc.read_text()
    for path, source in doc_files(text).items():
        (root / path).write_text(source)
    for (path, name), line in doc_lines(text).items():
        target = root / path
        source = target.read_text()
        opening = f"{name} = {{\n"
        assert source.count(opening) == 1, f"{path} has no one `{opening.strip()}`"
        target.write_text(source.replace(opening, opening + line, 1))


def overlay(tmp: Path, extra: frozenset[str] = frozenset()) -> Path:
    """A copy of the repository: the folders the doc writes into (+ `extra`) are copied, the rest linked."""
    root = tmp / "repo"
    root.mkdir()
    for entry in REPO.iterdir():
        if entry.name in COPIED | extra and entry.is_dir():
            shutil.copytree(entry, root / entry.name, ignore=shutil.ignore_patterns("__pycache__"))
        elif entry.name in COPIED:
            shutil.copy(entry, root / entry.name)
        elif entry.name not in LEFT_OUT:
            (root / entry.name).symlink_to(entry)
    return root


def runner(root: Path) -> Callable[..., subprocess.CompletedProcess]:
    """`run(*args)`: Python run in the repository copy `root`, as a user would (its own imports first)."""
    env = {**os.environ, "PYTHONPATH": str(root), "TQDM_DISABLE": "1", "WANDB_MODE": "disabled"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=900
        )

    return run
