"""Bad input anywhere on the command line is one `error:` line, no traceback, and nothing written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

CASES = [
    (["decoder=lookahead", "decoder.N=0"], "decoder.N must be an integer >= 3"),
    (["decoder=lookahead", "decoder.W=-1"], "decoder.W must be an integer >= 1"),
    (["decoder=lookahead", "decoder.G=0"], "decoder.G must be an integer >= 1"),
    (["decoder=fafo", "decoder.k=0"], "decoder.k must be an integer >= 1"),
    (["decoder=fafo", "decoder.n=0"], "decoder.n must be an integer >= 1"),
    (["decoder=fafo", "decoder.pool_capacity=0"], "decoder.pool_capacity must be an integer >= 1"),
    (["decoder=pld", "decoder.num_tokens=0"], "decoder.num_tokens must be an integer >= 1"),
    (
        ["decoder=pld", "decoder.max_matching_ngram_size=0"],
        "decoder.max_matching_ngram_size must be an integer >= 1",
    ),
    (["decoder=selfspec", "decoder.gamma=0"], "decoder.gamma must be an integer >= 1"),
    (["sampling.temperature=-1"], "sampling.temperature must be a number >= 0"),
    (["sampling.temperature=abc"], "sampling.temperature must be a number >= 0"),
    (["sampling.top_p=2"], "sampling.top_p must be a number in (0, 1]"),
    (["sampling.top_k=-3"], "sampling.top_k must be an integer >= 0"),
    (["model=hf"], "model.name is required"),
    (["run.limitt=2"], "unknown key run.limitt; run has: audit,"),
    (["+run.limitt=2"], "unknown key run.limitt; run has:"),
    (["+sampling.temp=1"], "unknown key sampling.temp; sampling has: temperature, top_k, top_p"),
    (["kv.backend=sliced"], "unknown key kv.backend; kv has no settings"),  # kv=full
    (
        ["decoder=fafo", "decoder.kk=3"],
        "unknown key decoder.kk; decoder has: backend, block, fumble_sees_last, generator_share, k,",
    ),
    (["run.limit=-1"], "run.limit must be an integer >= 1"),
    (["run.max_new_tokens=abc"], "run.max_new_tokens must be an integer >= 1"),
    (["kv=streaming", "kv.budget_frac=2"], "budget_frac must be in (0, 1]"),
    (["kv=retrieval", "kv.budget=8"], "must exceed the chunk size"),
    (["kv=retrieval", "kv.dense_layers=-1"], "dense_layers must be a non-negative integer"),
    (["decoder=triforce", "draft=tiny", "decoder.gamma1=0"], "decoder.gamma1 must be an integer >= 1"),
    (["decoder=triforce", "draft=tiny", "decoder.gamma2=-1"], "decoder.gamma2 must be an integer >= 1"),
    (["decoder=triforce"], "draft=self_layers: layers must be an integer in [1, 1], got 4"),
    (
        ["decoder=vanilla", "draft=tiny"],
        "draft=tiny drafts for a hierarchical decoder: use it with decoder=triforce",
    ),
    (["decoder=triforce", "draft=tiny", "draft.budget=4090"], "exceeds the draft model's context (4096)"),
    (["decoder=triforce", "draft=tiny", "draft.room=4"], "need draft.room >= 10"),
    (["decoder=triforce", "draft=hf"], "draft=hf needs draft.name"),
    (["decoder=sfi"], "decoder=sfi needs kv=sfi"),
    (["decoder=sfi", "kv=sfi", "kv.k=0"], "k (entries selected per KV head) must be a positive integer"),
    (["decoder=sfi", "kv=sfi", "kv.sinks=-1"], "sinks must be a non-negative integer"),
    (["decoder=sfi", "kv=sfi", "kv.window=-4"], "window must be a non-negative integer"),
    (["decoder=sfi", "kv=sfi", "kv.lambda_clip=1.5"], "lambda_clip must be in [0, 1]"),
    (["decoder=sfi", "kv=sfi", "decoder.triggers=[]"], "triggers must be a non-empty list"),
]


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "run.py"), "debug=quick", *args, f"run.out_dir={tmp_path}"]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300)


def _assert_one_line(res: subprocess.CompletedProcess, message: str, tmp_path: Path, *kept: Path) -> None:
    """One `error:` line (besides library warnings), no traceback, and nothing written in the out dir
    (`tmp_path`) beyond what the test put there (`kept`)."""
    assert res.returncode != 0
    lines = [line for line in res.stderr.splitlines() if line.strip() and "WARNING" not in line]
    assert lines and lines[-1].startswith("error:"), res.stderr[-1500:]
    assert sum(line.startswith("error:") for line in lines) == 1, res.stderr[-1500:]
    assert message in lines[-1], lines[-1]
    assert "Traceback" not in res.stderr and "HYDRA_FULL_ERROR" not in res.stderr
    assert sorted(tmp_path.iterdir()) == sorted(kept), sorted(tmp_path.rglob("*"))


@pytest.mark.parametrize(("args", "message"), CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_is_one_line(tmp_path, args, message):
    _assert_one_line(_run(tmp_path, *args), message, tmp_path)


def test_model_folder_without_a_model(tmp_path):
    empty = tmp_path / "empty-model"
    empty.mkdir()
    res = _run(tmp_path, "model=hf", f"model.name={empty}")
    _assert_one_line(res, "holds no model (no config.json)", tmp_path, empty)


def test_offline_hints_name_commands_that_exist():
    """Every `task=<name>` an error message or docstring of tasks/ suggests is a real option."""
    options = {p.stem for p in (REPO / "conf" / "task").glob("*.yaml")}
    named = set()
    for path in (REPO / "tasks").glob("*.py"):
        named |= set(re.findall(r"task=([A-Za-z0-9_]+)", path.read_text()))
    assert named and named <= options, sorted(named - options)
