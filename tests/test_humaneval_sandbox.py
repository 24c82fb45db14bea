"""The HumanEval sandbox: timeouts, memory limit, no network, no secrets, throwaway directory; and the
escapes of issue #93, each of which the sandbox before it let through: a program that exits before its
tests passes; a process started past the audit hook outlives the run and holds the timeout open; a
write outside the work folder; a signal to the harness; a stdout flood kept whole in memory."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import tempfile
import textwrap
import tracemalloc
from pathlib import Path

import pytest

from core.types import HarnessError
from tasks.humaneval import HumanEval, truncate_completion
from tasks.sandbox import GRACE_S, network_guard, run_python, sandbox_layers


def _namespaces() -> bool:
    try:
        return "pidns" in sandbox_layers("namespaces")
    except HarnessError:
        return False


NAMESPACES = _namespaces()
needs_namespaces = pytest.mark.skipif(
    not NAMESPACES, reason="unshare with user/PID/mount namespaces is not permitted here"
)
# (isolation, audit hook): each guard on its own where it is the one that must hold
KERNEL_ONLY = pytest.param("namespaces", False, id="namespaces-alone", marks=needs_namespaces)
HOOK_ONLY = pytest.param("process", True, id="audit-hook-alone")


def test_infinite_loop_is_killed_by_the_wall_timeout() -> None:
    result = run_python("while True:\n    pass\n", timeout_s=1.0)
    assert result.status == "timeout" and not result.passed
    assert result.seconds < 5


def test_memory_bomb_hits_the_memory_limit() -> None:
    bomb = "chunks = []\nwhile True:\n    chunks.append(bytearray(50 * 1024 * 1024))\n"
    result = run_python(bomb, timeout_s=10.0, memory_mb=256)
    assert result.status == "memory"
    assert run_python("x = bytearray(64 * 1024 * 1024)\n", memory_mb=256).passed  # under the cap: fine


@pytest.fixture
def listener():
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.5)
    yield server
    server.close()


def _connect_program(port: int) -> str:
    return (
        f"import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\ns.settimeout(2)\n"
        f"s.connect(('127.0.0.1', {port}))\ns.sendall(b'leak')\nprint('CONNECTED')\n"
    )


def _assert_no_connection(server: socket.socket, result) -> None:
    assert result.status == "failed" and "CONNECTED" not in result.stdout
    with pytest.raises(socket.timeout):
        server.accept()


def test_network_blocked_by_audit_hook(listener: socket.socket) -> None:
    """Host network namespace, only the audit hook: connect raises PermissionError in the child."""
    result = run_python(_connect_program(listener.getsockname()[1]), network="audit")
    assert result.network_guard == "audit"
    assert "socket.connect is blocked" in result.stderr
    _assert_no_connection(listener, result)


@needs_namespaces
def test_network_blocked_by_namespace_alone(listener: socket.socket) -> None:
    """Audit hook off, new network namespace: the kernel refuses the connect."""
    result = run_python(_connect_program(listener.getsockname()[1]), network="netns", audit_hook=False)
    assert result.network_guard == "netns"
    assert "blocked" not in result.stderr and "Network is unreachable" in result.stderr
    _assert_no_connection(listener, result)


def test_control_without_guards_does_connect(listener: socket.socket) -> None:
    """The probe itself works: with both network layers off, the child reaches the listener."""
    result = run_python(_connect_program(listener.getsockname()[1]), network="audit", audit_hook=False)
    assert result.network_guard == "none" and result.passed and "CONNECTED" in result.stdout
    conn, _ = listener.accept()
    conn.close()


def test_process_spawning_is_blocked() -> None:
    result = run_python("import os\nos.system('echo hi')\n", network="audit")
    assert result.status == "failed" and "os.system is blocked" in result.stderr


def test_no_inherited_secrets_and_throwaway_directory(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value")
    result = run_python(
        "import os\nprint(os.getcwd())\nprint(sorted(os.environ))\nopen('junk.txt', 'w').write('x')\n"
    )
    assert result.passed and "HF_TOKEN" not in result.stdout and "hf_secret_value" not in result.stdout
    workdir = Path(result.stdout.splitlines()[0])
    assert workdir != Path.cwd() and not workdir.exists()
    assert network_guard("auto") in ("netns+audit", "audit")
    assert result.layers == "+".join(sandbox_layers())


def test_humaneval_canonical_passes_and_wrong_fails() -> None:
    task = HumanEval(limit=2, timeout_s=2.0)
    samples = task.load()
    assert len(samples) == 2 and samples[0].sample_id == "HumanEval/0" and samples[0].raw_prompt
    for s in samples:
        assert task.score(s, [s.reference["canonical_solution"]]) == {"pass@1": 1.0}
    assert task.score(samples[0], ["    return False\n"]) == {"pass@1": 0.0}
    assert task.score(samples[0], ["    while True:\n        pass\n"]) == {"pass@1": 0.0}


def test_a_slice_of_canonical_solutions_pass() -> None:
    """Every 20th problem's canonical solution (all 164, and their cost per problem against an older
    sandbox: `python -m research.probes.probe_sandbox_cost`)."""
    task = HumanEval(timeout_s=10.0)
    for sample in task.load()[::20]:
        result = task.run(sample, sample.reference["canonical_solution"])
        assert result.passed, (sample.sample_id, result.stderr[-500:])


# --- the escapes of issue #93 -------------------------------------------------------------------------

EXITS = ["exit()", "quit()", "import sys; sys.exit(0)", "raise SystemExit", "import os; os._exit(0)"]


@pytest.mark.parametrize("leave", EXITS)
def test_a_program_that_exits_before_its_tests_fails(leave: str) -> None:
    task = HumanEval(limit=1, timeout_s=5.0)
    (sample,) = task.load()
    # a wrong body, then a top-level statement the stop sequences do not cut: the tests never run
    assert task.score(sample, [f"    return None\n{leave}\n"]) == {"pass@1": 0.0}
    assert task.score(sample, [f"{sample.reference['canonical_solution']}\n{leave}\n"]) == {"pass@1": 0.0}


def test_writing_to_every_fd_does_not_forge_the_end() -> None:
    forge = """
        import os
        for fd in range(3, 256):
            try:
                os.write(fd, b"0" * 32)
            except OSError:
                pass
        os._exit(0)
    """
    assert run_python(textwrap.dedent(forge)).status == "failed"


SLEEP = shutil.which("sleep") or "/bin/sleep"


def _spawn_program(tag: str, then: str) -> str:
    """Start `sleep <tag>` in a new session through `_posixsubprocess.fork_exec` (no audit event), its
    stdout the program's own, then do `then`."""
    program = f"""
        import _posixsubprocess, os
        args = [b"{SLEEP}", b"{tag}"]
        fds = (-1,) * 6 + os.pipe()
        rest = (False, True, -1, None, None, None, -1, None)  # Python 3.11's signature; 3.12 adds one
        try:
            _posixsubprocess.fork_exec(args, [args[0]], True, (), None, None, *fds, *rest)
        except TypeError:
            _posixsubprocess.fork_exec(args, [args[0]], True, (), None, None, *fds, *rest, False)
        print("spawned", flush=True)
    """
    return textwrap.dedent(program) + then + "\n"


def _running(tag: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and tag.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            pass
    return found


LOOPS, RETURNS = "while True: pass", "pass"  # the program loops past its deadline / returns at once
SPAWNS = [
    pytest.param("auto", True, LOOPS, id="defaults"),
    pytest.param(*KERNEL_ONLY.values, LOOPS, id="namespaces-alone-loops", marks=needs_namespaces),
    pytest.param(*KERNEL_ONLY.values, RETURNS, id="namespaces-alone-returns", marks=needs_namespaces),
    pytest.param(*HOOK_ONLY.values, LOOPS, id="audit-hook-alone"),
    pytest.param("process", False, LOOPS, id="pipe-sweep-alone-loops"),
    pytest.param("process", False, RETURNS, id="pipe-sweep-alone-returns"),
]


@pytest.mark.parametrize(("isolation", "hook", "then"), SPAWNS)
def test_a_process_started_in_a_new_session_does_not_outlive_the_run(
    isolation: str, hook: bool, then: str
) -> None:
    tag = f"8.{os.getpid()}{len(then)}{int(hook)}{len(isolation)}"
    kw = {} if isolation == "auto" else {"isolation": isolation, "audit_hook": hook}
    result = run_python(_spawn_program(tag, then), timeout_s=1.0, **kw)
    assert result.seconds < 1.0 + GRACE_S + 1.5, result  # the old sandbox waited for the sleep (8 s)
    assert _running(tag) == []
    if hook:
        assert "starting processes is blocked" in result.stderr and result.status == "failed"
    else:
        assert result.status == ("timeout" if then == LOOPS else "passed")


@pytest.fixture
def outside() -> Path:
    """A folder the sandbox must not write into, on a file system it can see (not under /tmp)."""
    where = Path(tempfile.mkdtemp(prefix=".sandbox-probe-", dir=Path.cwd()))
    yield where
    shutil.rmtree(where, ignore_errors=True)


WRITES = [
    "open({path!r}, 'w').write('x')",
    "import os; os.mkdir({path!r})",
    "import shutil; shutil.copy('/etc/hostname', {path!r})",
    "import os; d = os.open(os.path.dirname({path!r}), os.O_RDONLY); os.mkdir('escaped', dir_fd=d)",
]
INSIDE = "import os, shutil\nos.mkdir('d')\nopen('d/f', 'w').write('x')\nos.rename('d/f', 'd/g')\n"
INSIDE += "shutil.rmtree('d')\n"


@pytest.mark.parametrize(("isolation", "hook"), [("auto", True), KERNEL_ONLY, HOOK_ONLY])
@pytest.mark.parametrize("write", WRITES, ids=["open", "mkdir", "copy", "dir_fd"])
def test_no_write_outside_the_work_folder(outside: Path, isolation: str, hook: bool, write: str) -> None:
    kw = {} if isolation == "auto" else {"isolation": isolation, "audit_hook": hook}
    result = run_python(write.format(path=str(outside / "escaped")) + "\n", **kw)
    assert result.status == "failed" and not list(outside.iterdir()), result.stderr
    inside = run_python(INSIDE, **kw)
    assert inside.passed, inside.stderr


@pytest.mark.parametrize(("isolation", "hook"), [("auto", True), KERNEL_ONLY, HOOK_ONLY])
def test_no_signal_reaches_the_harness(isolation: str, hook: bool) -> None:
    got: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda sig, _frame: got.append(sig))
    kw = {} if isolation == "auto" else {"isolation": isolation, "audit_hook": hook}
    try:
        for target in ("os.getppid()", str(os.getpid()), "-1"):
            program = (
                f"import os, signal\ntry:\n    os.kill({target}, signal.SIGUSR1)\nexcept OSError:\n    pass\n"
            )
            if target == "-1":  # everything this user may signal: tried only where it is init of its own
                program = program.replace("try:", "if os.getpid() != 1:\n    raise SystemExit\ntry:")
            run_python(program, **kw)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert got == []


@needs_namespaces
def test_the_namespace_hides_and_confines() -> None:
    """Kernel layers alone: only the sandbox's own processes are visible, no capability is left, the
    host's /tmp is an empty tmpfs, devices other than null/zero/random are closed."""
    program = """
        import os
        print(sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
        print([line.split()[1] for line in open("/proc/self/status") if line.startswith("CapEff")][0])
        print(all(name.startswith("sandbox-") for name in os.listdir("/tmp")))
        open("/dev/null", "w").write("x")
        try:
            os.open("/dev/full", os.O_WRONLY)
            print("device")
        except OSError:
            print("no device")
        print(os.getppid())
    """
    result = run_python(textwrap.dedent(program), isolation="namespaces", audit_hook=False)
    assert result.passed, result.stderr
    pids, caps, tmp, device, ppid = result.stdout.splitlines()
    assert pids == "[1]" and int(caps, 16) == 0 and tmp == "True" and device == "no device" and ppid == "0"


def test_a_stdout_flood_is_read_in_bounded_chunks() -> None:
    flood = "import sys\nfor _ in range(128):\n    sys.stdout.buffer.write(b'x' * (1 << 20))\nprint('end')\n"
    tracemalloc.start()
    try:
        result = run_python(flood, timeout_s=10.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.passed and result.stdout.endswith("end\n")
    assert "bytes left out" in result.stdout and len(result.stdout) < 10_000
    assert peak < 8 << 20, f"the harness held {peak >> 20} MiB"  # the old one: the whole 128 MiB, twice


def test_bad_options_are_refused() -> None:
    with pytest.raises(HarnessError, match="task.network must be one of"):
        sandbox_layers(network="bogus")
    with pytest.raises(HarnessError, match="task.isolation must be one of"):
        sandbox_layers(isolation="vm")
    with pytest.raises(HarnessError, match="task.timeout_s must be a number > 0"):
        HumanEval(timeout_s=-1)
    with pytest.raises(HarnessError, match="task.memory_mb must be an integer >= 32"):
        HumanEval(memory_mb=0)
    assert sandbox_layers("process") == ("audit",) and sandbox_layers("process", "audit", False) == ()


def test_truncation_at_stop_sequences() -> None:
    body = "    return 1\n\ndef helper():\n    pass\n"
    assert truncate_completion(body) == "    return 1\n"
    assert truncate_completion("    if x:\n        return 2\n") == "    if x:\n        return 2\n"


def test_rescore_reports_old_and_new_pass_at_1(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import pandas as pd

    from tasks.humaneval import main

    task = HumanEval(limit=2)
    first, second = task.load()
    run_dir = tmp_path / "runs" / "humaneval-vanilla-full-0"
    run_dir.mkdir(parents=True)
    run = {
        "run_id": run_dir.name,
        "task": "humaneval",
        "task_params": '{"timeout_s": 5.0, "memory_mb": 1024}',
    }
    pd.DataFrame([run]).to_parquet(run_dir / "runs.parquet")
    texts = [first.reference["canonical_solution"], "    return []\nexit()\n"]  # the second passed by exiting
    ids = [first.sample_id, second.sample_id]
    pd.DataFrame({"sample_id": ids, "output_text": texts}).to_parquet(run_dir / "samples.parquet")
    scores = {"run_id": run_dir.name, "sample_id": ids, "metric": "pass@1", "value": [1.0, 1.0]}
    pd.DataFrame(scores).to_parquet(run_dir / "scores.parquet")
    assert main(["--rescore", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert [run_dir.name, "2", "1.0000", "0.5000"] in [line.split() for line in out.splitlines()]
    assert f"changed {run_dir.name} HumanEval/1: 1 -> 0 (failed: sandbox: the program exited (None)" in out
    assert main(["--rescore", str(tmp_path / "none")]) == 2
