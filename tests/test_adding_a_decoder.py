"""docs/adding-a-decoder.md, followed literally: its three files, copied into a copy of the
repository, give a decoder whose lossless test passes and which `run.py` runs by its config name
with every output matching vanilla. Nothing else in the repository has to change."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
DOC = REPO / "docs" / "adding-a-decoder.md"
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


def overlay(tmp: Path) -> Path:
    """A copy of the repository: the folders the doc writes into are copied, the rest linked."""
    root = tmp / "repo"
    root.mkdir()
    for entry in REPO.iterdir():
        if entry.name in COPIED and entry.is_dir():
            shutil.copytree(entry, root / entry.name, ignore=shutil.ignore_patterns("__pycache__"))
        elif entry.name in COPIED:
            shutil.copy(entry, root / entry.name)
        elif entry.name not in LEFT_OUT:
            (root / entry.name).symlink_to(entry)
    return root


def test_the_doc_names_exactly_a_decoder_its_config_and_its_test():
    assert set(doc_files(DOC.read_text())) == {
        "decoders/bigram.py",
        "conf/decoder/bigram.yaml",
        "tests/test_lossless_bigram.py",
    }
    assert not (REPO / "decoders" / "bigram.py").exists()  # the example lives in the doc only


def test_the_doc_decoder_passes_its_lossless_test_and_runs(tmp_path):
    root = overlay(tmp_path)
    for path, source in doc_files(DOC.read_text()).items():
        (root / path).write_text(source)
    env = {**os.environ, "PYTHONPATH": str(root), "TQDM_DISABLE": "1", "WANDB_MODE": "disabled"}

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, *args], cwd=root, env=env, capture_output=True, text=True, timeout=900
        )

    tests = run(
        "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not smollm", "tests/test_lossless_bigram.py"
    )
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert " passed" in tests.stdout and "failed" not in tests.stdout
    out = tmp_path / "records"
    cli = run(
        "run.py",
        "decoder=bigram",
        "model=tiny_llama",
        "run.limit=2",
        "run.max_new_tokens=16",
        f"run.out_dir={out}",
    )
    assert cli.returncode == 0, cli.stdout[-3000:] + cli.stderr[-2000:]
    (samples,) = out.glob("runs/*-bigram-full-*/samples.parquet")
    rows = pd.read_parquet(samples)
    assert len(rows) >= 2 and rows["matches_vanilla"].all() and rows["error"].isna().all()
