"""Who/what/where of a run: git sha, package versions, device name (with a CPU's ISA features)."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch

from core.types import HarnessError

PACKAGES = ("torch", "transformers", "tokenizers", "hydra-core", "numpy", "pandas")


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10)


def git_sha(repo: Path) -> str:
    """The code version: the commit, plus `-dirty-<hash of the diff>` when tracked files outside `results/`
    differ from it (two different uncommitted states never share a version; records and benchmark
    outputs are not code, so replacing committed records keeps the version). `HARNESS_CODE_VERSION`,
    when set, is taken instead: for a copy of a commit's code that travels without its data folders or
    its `.git` (a GPU lease's working tree, scripts/gpu_checks.sh), where git cannot tell the version."""
    if os.environ.get("HARNESS_CODE_VERSION"):
        return os.environ["HARNESS_CODE_VERSION"]
    try:
        sha = _git(repo, "rev-parse", "HEAD")
        if sha.returncode != 0:
            return "unknown"
        diff = _git(repo, "diff", "HEAD", "--no-ext-diff", "--binary", "--", ".", ":(exclude)results")
        if diff.returncode != 0:
            return sha.stdout.strip() + "-dirty"
        if not diff.stdout:
            return sha.stdout.strip()
        return f"{sha.stdout.strip()}-dirty-{hashlib.sha1(diff.stdout.encode()).hexdigest()[:10]}"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def require_clean_tree(repo: Path, out_dir: Path | str) -> None:
    """Refuse to write records under `<repo>/results/paper/` from anything but a commit: those records
    back the committed report, which states the code version of every table. `git status --porcelain`
    must be empty, the records folder being written aside (a sweep's earlier runs are new files there);
    a tree git cannot read (a copy without `.git`) is refused too."""
    paper, out = (repo / "results" / "paper").resolve(), Path(out_dir).resolve()
    if not out.is_relative_to(paper):
        return
    where = f"run.out_dir={out_dir} is under results/paper/, whose records must come from a commit"
    aside = f":(exclude){out.relative_to(repo.resolve()).as_posix()}"
    try:
        status = _git(repo, "status", "--porcelain", "--", ".", aside)
    except (OSError, subprocess.SubprocessError) as exc:
        raise HarnessError(f"{where}, and git status failed: {exc}") from None
    if status.returncode != 0:
        first = (status.stderr.strip().splitlines() or ["no message"])[0]
        raise HarnessError(f"{where}, and git status failed: {first}")
    changed = status.stdout.splitlines()
    if changed:
        more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
        raise HarnessError(
            f"{where}: the tree has uncommitted changes ({changed[0].strip()}{more}); commit them, or "
            "write elsewhere (run.out_dir=results)"
        )


def source_digest(repo: Path, paths: tuple[str, ...]) -> str:
    """Hash of the contents of `paths` (the code that computes something cached, e.g. vanilla outputs)."""
    h = hashlib.sha1()
    for rel in paths:
        p = repo / rel
        h.update(rel.encode())
        h.update(p.read_bytes() if p.exists() else b"missing")
    return h.hexdigest()[:12]


def versions() -> dict[str, str]:
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "missing"
    return out


# CPU features oneDNN branches on: it takes other kernels where they are present (bf16 ones with
# model.dtype=bfloat16), so two CPUs of one model name but different features give different numbers
# and different vanilla outputs
ISA_FEATURES = ("avx512_bf16", "amx_bf16")


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def cpu_isa(cpuinfo: str | None = None) -> str:
    """The `ISA_FEATURES` this CPU has, comma-separated, or "none"."""
    text = _cpuinfo() if cpuinfo is None else cpuinfo
    lines = (line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags"))
    flags = next(lines, [])
    return ",".join(f for f in ISA_FEATURES if f in flags) or "none"


def device_name(device: torch.device, cpuinfo: str | None = None) -> str:
    """The device as keyed in run identities, vanilla references and cost curves: a GPU's name; a CPU's
    model name with the ISA features the code branches on, and the thread count."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    text = _cpuinfo() if cpuinfo is None else cpuinfo
    cpu = platform.processor() or platform.machine()
    for line in text.splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return f"cpu: {cpu} [{cpu_isa(text)}] x{torch.get_num_threads()} threads"
