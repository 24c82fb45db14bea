"""Bad input ends in one `error:` line, no traceback, and nothing written anywhere: every case of
tests/bad_inputs/, those the pre-flight check can see in process (fast) and those only the runner
can refuse through run.py; a few end to end through run.py started from an empty folder (which must
stay empty); a model folder without a model; and the same for the summary's figure."""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import run as entry
from tests.bad_inputs import CASES, Case, expand, expand_env, run_case
from tests.synthetic_runs import write_synthetic_runs

REPO = Path(__file__).resolve().parents[1]
PREFLIGHT = [c for c in CASES if not c.model]


@pytest.mark.parametrize("case", PREFLIGHT, ids=[c.id for c in PREFLIGHT])
def test_preflight_refuses_before_anything_is_loaded_or_written(case: Case, tmp_path, monkeypatch):
    filled = expand(case, tmp_path)
    if filled is None:
        pytest.skip("no read-only file system here")
    args, out = filled
    for var, value in expand_env(case, tmp_path).items():
        monkeypatch.setenv(var, value)
    before = sorted(tmp_path.rglob("*"))
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        problem = entry.preflight(["debug=quick", *args])
    assert problem is not None and case.message in problem, problem
    assert "\n" not in problem
    assert not out.exists()
    assert sorted(tmp_path.rglob("*")) == before  # nothing made where the environment points either


# refused once the runner has built the model (a subprocess each: the runner's refusal, printed by
# run.py); run.limit=100000 is the end-to-end case below
AFTER_LOADING = [c for c in CASES if c.model and c.args != ("run.limit=100000",)]


@pytest.mark.parametrize("case", AFTER_LOADING, ids=[c.id for c in AFTER_LOADING])
def test_bad_input_the_runner_refuses_is_one_line_through_run_py(case: Case, tmp_path):
    outcome, last = run_case(case, tmp_path)
    assert outcome == "clean", last
    assert last.startswith("error:") and case.message in last, last


def test_model_folder_without_a_model_is_one_line(tmp_path):
    empty = tmp_path / "empty-model"
    empty.mkdir()
    case = Case(("model=hf", f"model.name={empty}"), "holds no model (no config.json)", model=True)
    outcome, last = run_case(case, tmp_path)
    assert outcome == "clean" and case.message in last, last
    assert not any(empty.iterdir())


def test_offline_hints_name_commands_that_exist():
    """Every `task=<name>` an error message or docstring of tasks/ suggests is a real option."""
    options = {p.stem for p in (REPO / "conf" / "task").glob("*.yaml")}
    named = set()
    for path in (REPO / "tasks").glob("*.py"):
        named |= set(re.findall(r"task=([A-Za-z0-9_]+)", path.read_text()))
    assert named and named <= options, sorted(named - options)


def _run_from_empty_folder(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, Path]:
    """run.py started from an empty folder (where Hydra used to leave outputs/<date>/<time>/)."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    cmd = [sys.executable, str(REPO / "run.py"), "debug=quick", *args]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=cwd, timeout=600, env=env), cwd


END_TO_END = [
    (("run.seed=abc",), "run.seed must be an integer >= 0"),
    (("run.stratify=maybe",), "run.stratify must be true or false"),
    (("model.device=cuda",), "model.device"),
    (("-m", "decoder=vanilla,fafo", "decoder.k=0"), "decoder.k"),
    (("decoder=fafo", "decoder.backend=flash"), "decoder.backend=flash needs a CUDA device"),
    (("run.limit=100000",), "run.limit=100000 exceeds the 80 samples of task mtbench"),  # after loading
]


@pytest.mark.parametrize(("args", "message"), END_TO_END, ids=[" ".join(a) for a, _ in END_TO_END])
def test_bad_input_end_to_end_writes_nothing(tmp_path, args, message):
    if "cuda" in " ".join(args):
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has CUDA")
    out = tmp_path / "out"
    res, cwd = _run_from_empty_folder(tmp_path, *args, f"run.out_dir={out}")
    assert res.returncode == 2 or res.returncode == 1, res.stderr[-2000:]
    lines = [line for line in res.stderr.splitlines() if line.strip() and "Warning" not in line]
    assert len(lines) == 1 and lines[0].startswith("error:") and message in lines[0], res.stderr[-2000:]
    assert "Traceback" not in res.stderr and "HYDRA_FULL_ERROR" not in res.stderr
    assert not out.exists(), sorted(str(p) for p in out.rglob("*"))
    assert not any(cwd.iterdir()), sorted(str(p) for p in cwd.rglob("*"))


def test_a_run_keeps_its_hydra_files_beside_its_records_and_says_why_scores_are_empty(tmp_path):
    out = tmp_path / "out"
    res, cwd = _run_from_empty_folder(tmp_path, f"run.out_dir={out}")
    assert res.returncode == 0, res.stderr[-2000:]
    assert not any(cwd.iterdir())  # nothing where the command was started
    (run_dir,) = (out / "runs").iterdir()
    assert (run_dir / "COMPLETE").exists() and not (run_dir / "parts").exists()  # each sample stored once
    assert "debug=quick" in (run_dir / "config.yaml").read_text().splitlines()[0]
    assert "task mtbench has no automatic score" in res.stdout


def test_summary_figure_to_an_unwritable_path_is_one_line(tmp_path):
    from analysis.summary import main as summary_main

    write_synthetic_runs(tmp_path)
    target = tmp_path / "a-file"
    target.write_text("not a folder\n")
    with pytest.raises(SystemExit) as exc, contextlib.redirect_stdout(io.StringIO()):
        summary_main(["--root", str(tmp_path), "--figure", str(target / "summary.png")])
    assert str(exc.value.code).startswith("error: cannot write the figure")
    assert "\n" not in str(exc.value.code)


@pytest.mark.parametrize("name", ["a-folder", "a-folder/", "summary.txt", "summary"])
def test_summary_figure_that_is_no_image_file_is_one_line_and_writes_nothing(tmp_path, name):
    """matplotlib wrote `<folder>.png` beside a folder (at the root for a top-level one) and failed with
    a traceback on `.txt`: both are refused before anything is read or written."""
    from analysis.summary import main as summary_main

    write_synthetic_runs(tmp_path)
    (tmp_path / "a-folder").mkdir()
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(SystemExit) as exc, contextlib.redirect_stdout(io.StringIO()) as out:
        summary_main(["--root", str(tmp_path), "--figure", str(tmp_path / name)])
    line = str(exc.value.code)
    assert line.startswith("error: --figure ") and "\n" not in line, line
    assert ("is a folder" if "folder" in name else "is not an image format") in line, line
    assert out.getvalue() == "" and sorted(tmp_path.rglob("*")) == before
