"""Who/what/where of a run: git sha, package versions, device name."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

import torch

PACKAGES = ("torch", "transformers", "tokenizers", "hydra-core", "numpy", "pandas")


def _git(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=10)


def git_sha(repo: Path) -> str:
    """The code version: the commit, plus `-dirty-<hash of the diff>` when tracked files differ from it
    (two different uncommitted states never share a version). `HARNESS_CODE_VERSION`, when set, is
    taken instead: for a copy of a commit's code that travels without its data folders or its `.git`
    (a GPU lease's working tree, scripts/gpu_checks.sh), where git cannot tell the version."""
    if os.environ.get("HARNESS_CODE_VERSION"):
        return os.environ["HARNESS_CODE_VERSION"]
    try:
        sha = _git(repo, "rev-parse", "HEAD")
        if sha.returncode != 0:
            return "unknown"
        diff = _git(repo, "diff", "HEAD", "--no-ext-diff", "--binary")
        if diff.returncode != 0:
            return sha.stdout.strip() + "-dirty"
        if not diff.stdout:
            return sha.stdout.strip()
        return f"{sha.stdout.strip()}-dirty-{hashlib.sha1(diff.stdout.encode()).hexdigest()[:10]}"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


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


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {cpu} x{torch.get_num_threads()} threads"
