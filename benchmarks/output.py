"""Benchmarks as committed outputs: what a benchmark prints is also written, with the environment
and the exact command, to `results/bench/<device-slug>/<name>.md` and a JSON twin.

`HARNESS_BENCH_OUT=<folder>` writes elsewhere; `HARNESS_BENCH_OUT=none` writes nothing. Speed claims
in the README and in config comments point here instead of quoting numbers.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import platform
import re
import shlex
import sys
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path

import torch

from runners import provenance

REPO = Path(__file__).resolve().parents[1]
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile")


def environment() -> dict[str, object]:
    """Device name, CPU flags that decide the fast paths, threads, versions, code version."""
    cpu, flags = platform.processor() or platform.machine(), set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "device": gpu or f"cpu: {cpu}",
        "cpu": cpu,
        "cpu_flags": [f for f in CPU_FLAGS if f in flags],
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "code_version": provenance.git_sha(REPO),  # looked up at each call: a test replaces it
        "time": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def slug(device: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-")[:60]


def out_dir(env: dict[str, object]) -> Path | None:
    where = os.environ.get("HARNESS_BENCH_OUT", str(REPO / "results" / "bench"))
    return None if where.lower() == "none" else Path(where) / slug(str(env["device"]))


class _Tee(io.TextIOBase):
    def __init__(self, stream: io.TextIOBase) -> None:
        self.stream, self.buffer_text = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.buffer_text.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()


@contextlib.contextmanager
def recorded(name: str, module: str | None = None) -> Iterator[None]:
    """Run a benchmark's main() inside: its stdout is also written as `<name>.md` + `<name>.json`, with
    the command that ran (`python -m <module>`, default `benchmarks.<name>`, and its arguments). The
    environment (code version included) is taken before the benchmark runs: the code that ran, even
    when files change while it does."""
    env = environment()
    tee = _Tee(sys.stdout)
    with contextlib.redirect_stdout(tee):
        yield
    write(name, tee.buffer_text.getvalue(), env, module)


def write(name: str, text: str, env: dict[str, object], module: str | None = None) -> Path | None:
    folder = out_dir(env)
    if folder is None:
        return None
    folder.mkdir(parents=True, exist_ok=True)
    args = " " + shlex.join(sys.argv[1:]) if sys.argv[1:] else ""
    command = f"python -m {module or 'benchmarks.' + name}{args}"
    header = "\n".join(f"- {k}: {v}" for k, v in env.items())
    (folder / f"{name}.md").write_text(f"# {name}\n\n`{command}`\n\n{header}\n\n```\n{text.rstrip()}\n```\n")
    blob = {"benchmark": name, "command": command, "environment": env, "output": text.splitlines()}
    (folder / f"{name}.json").write_text(json.dumps(blob, indent=1) + "\n")
    print(f"[bench] written: {folder / name}.md (+ .json)", file=sys.stderr)
    return folder / f"{name}.md"
