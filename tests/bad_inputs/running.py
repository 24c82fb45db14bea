"""One case of `CASES` through run.py: its placeholders filled (`expand`, `expand_env`), run with
debug=quick, and its outcome (`classify`): clean / traceback / accepted / noisy / wrote / skipped."""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.bad_inputs.command import Case
from tests.bad_inputs.data_files import data_file

REPO = Path(__file__).resolve().parents[2]


_MOUNTED: list[str] = []


def _mount_readonly() -> str | None:
    """A small read-only tmpfs in a fresh temporary folder (root only), unmounted at exit."""
    if _MOUNTED:
        return _MOUNTED[0]
    if os.geteuid() != 0:
        return None
    where = tempfile.mkdtemp(prefix="harness-ro-")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", where], capture_output=True)
    if done.returncode != 0:
        os.rmdir(where)
        return None
    _MOUNTED.append(where)

    def unmount() -> None:
        subprocess.run(["umount", where], capture_output=True)
        with contextlib.suppress(OSError):
            os.rmdir(where)

    atexit.register(unmount)
    return where


def readonly_dir() -> str | None:
    """A folder on a read-only file system of this machine: one already mounted, else a read-only
    tmpfs mounted for the test (as root); None where neither is possible."""
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 3 and "ro" in parts[3].split(",") and Path(parts[1]).is_dir():
            if parts[1].startswith(("/proc", "/sys", "/dev", "/mnt")):
                continue
            return parts[1]
    return _mount_readonly()


def _fill(text: str, tmp: Path, ro: str | None) -> str:
    text = re.sub(r"\{data:(\w+)\}", lambda m: data_file(tmp, m.group(1)), text)
    return (
        text.replace("{file}", str(tmp / "a-file"))
        .replace("{dir}", str(tmp / "a-dir"))
        .replace("{folder}", str(tmp / "a-folder"))
        .replace("{ro}", ro or "")
    )


def expand(case: Case, tmp: Path) -> tuple[list[str], Path] | None:
    """The case's arguments with its placeholders filled, plus the out dir it writes to (None when
    the case needs what this machine lacks)."""
    (tmp / "a-file").write_text("not a folder\n")
    (tmp / "a-dir").mkdir(exist_ok=True)
    (tmp / "a-folder").mkdir(exist_ok=True)
    needs_ro = any("{ro}" in a for a in (*case.args, *(v for _, v in case.env)))
    ro = readonly_dir() if needs_ro else None
    if needs_ro and ro is None:
        return None
    args = [_fill(a, tmp, ro) for a in case.args]
    out = tmp / "out"
    if not any(a.startswith("run.out_dir=") for a in args):
        args.append(f"run.out_dir={out}")
    return args, out


def expand_env(case: Case, tmp: Path) -> dict[str, str]:
    """The case's environment variables with their placeholders filled (after `expand`)."""
    ro = readonly_dir() if any("{ro}" in v for _, v in case.env) else None
    return {k: _fill(v, tmp, ro) for k, v in case.env}


def hydra_dirs() -> set[Path]:
    """Hydra's default output folders in the repository (a rejected input must add none)."""
    return {p for top in ("outputs", "multirun") for p in (REPO / top).glob("*/*")}


def classify(res: subprocess.CompletedProcess, wrote: list[str]) -> str:
    err = res.stderr
    if "Traceback" in err or "HYDRA_FULL_ERROR" in err or "Error executing job" in err:
        return "traceback"
    if res.returncode == 0:
        return "accepted"
    lines = [line for line in err.splitlines() if line.strip()]
    if len(lines) != 1 or not lines[0].startswith("error:"):
        return "noisy"
    return "wrote" if wrote else "clean"


def run_case(case: Case, tmp: Path) -> tuple[str, str]:
    """(outcome, the last stderr line) of one case, run through run.py with debug=quick."""
    filled = expand(case, tmp)
    if filled is None:
        return "skipped", "no read-only file system here"
    args, out = filled
    before = hydra_dirs()
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    env.update(expand_env(case, tmp))
    flags = [a for a in args if a.startswith("-")]  # Hydra takes -m before the overrides
    cmd = [sys.executable, str(REPO / "run.py"), *flags, "debug=quick", *[a for a in args if a not in flags]]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600, env=env)
    mine = [p for p in hydra_dirs() - before if str(tmp) in _read(p / ".hydra" / "overrides.yaml")]
    wrote = [str(p) for p in mine] + ([str(out)] if out.exists() and any(out.iterdir()) else [])
    if out.exists() and not wrote:
        wrote = [f"{out} (empty)"]
    last = next((line for line in reversed(res.stderr.splitlines()) if line.strip()), "")
    return classify(res, wrote), last[:200] + (f"  [wrote {wrote[0]}]" if wrote else "")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
