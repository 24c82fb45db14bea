"""Records under results/paper/ back the committed report: the runner writes them only from a clean tree
at a commit (`runners.provenance.require_clean_tree`), so no table of the report holds `-dirty` runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from core.types import HarnessError
from runners import provenance


def git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A committed repository with a results/paper/records/ folder."""
    git(tmp_path, "init", "-q")
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "results" / "paper" / "records" / "runs").mkdir(parents=True)
    (tmp_path / "results" / "paper" / "REPORT.md").write_text("# report\n")
    git(tmp_path, "add", ".")
    git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
    return tmp_path


def test_a_clean_tree_may_write_paper_records(repo: Path):
    records = repo / "results" / "paper" / "records"
    provenance.require_clean_tree(repo, records)
    # a sweep's earlier runs are new files in the records folder being written: not a dirty tree
    (records / "runs" / "a-run").mkdir()
    (records / "runs" / "a-run" / "runs.parquet").write_bytes(b"x")
    provenance.require_clean_tree(repo, records)


@pytest.mark.parametrize("change", ["modified", "untracked"])
def test_a_dirty_tree_is_refused_for_paper_records(repo: Path, change: str):
    if change == "modified":
        (repo / "code.py").write_text("x = 2\n")
    else:
        (repo / "scratch.py").write_text("y = 1\n")
    with pytest.raises(HarnessError, match="results/paper/, whose records must come from a commit") as err:
        provenance.require_clean_tree(repo, repo / "results" / "paper" / "records")
    assert "\n" not in str(err.value) and ("code.py" in str(err.value) or "scratch.py" in str(err.value))


def test_other_folders_are_not_checked(repo: Path, tmp_path_factory):
    (repo / "code.py").write_text("x = 2\n")
    provenance.require_clean_tree(repo, repo / "results")  # everyday records: any tree
    provenance.require_clean_tree(repo, tmp_path_factory.mktemp("elsewhere"))


def test_a_tree_git_cannot_read_is_refused(tmp_path: Path):
    (tmp_path / "results" / "paper" / "records").mkdir(parents=True)
    with pytest.raises(HarnessError, match="git status failed"):
        provenance.require_clean_tree(tmp_path, tmp_path / "results" / "paper" / "records")


def test_the_runner_refuses_a_dirty_tree_before_writing(repo: Path, monkeypatch):
    """The runner checks the tree where it sets the run's code version: nothing is written."""
    from runners import runner as runner_module
    from tests.helpers import make_cfg

    (repo / "code.py").write_text("x = 2\n")
    monkeypatch.setattr(runner_module, "REPO", repo)
    out = repo / "results" / "paper" / "records"
    with pytest.raises(HarnessError, match="whose records must come from a commit"):
        runner_module.Runner(make_cfg(out))
    assert list((out / "runs").iterdir()) == []


def test_the_code_version_ignores_records_and_sees_code(repo: Path):
    """Replacing committed records (a rerun deletes a slice's old runs first) keeps the code version;
    any change to code makes it `-dirty`."""
    clean = provenance.git_sha(repo)
    assert "-dirty" not in clean and len(clean) == 40
    (repo / "results" / "paper" / "REPORT.md").unlink()
    assert provenance.git_sha(repo) == clean
    (repo / "code.py").write_text("x = 2\n")
    assert provenance.git_sha(repo).startswith(clean + "-dirty-")
