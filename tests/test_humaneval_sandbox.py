"""The HumanEval sandbox: timeouts, memory limit, no network, no secrets, throwaway directory."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tasks.humaneval import HumanEval, truncate_completion
from tasks.sandbox import _netns_works, network_guard, run_python


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


@pytest.mark.skipif(not _netns_works(), reason="unshare --net --map-root-user is not permitted here")
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


def test_humaneval_canonical_passes_and_wrong_fails() -> None:
    task = HumanEval(limit=2, timeout_s=2.0)
    samples = task.load()
    assert len(samples) == 2 and samples[0].sample_id == "HumanEval/0" and samples[0].raw_prompt
    for s in samples:
        assert task.score(s, [s.reference["canonical_solution"]]) == {"pass@1": 1.0}
    assert task.score(samples[0], ["    return False\n"]) == {"pass@1": 0.0}
    assert task.score(samples[0], ["    while True:\n        pass\n"]) == {"pass@1": 0.0}


def test_truncation_at_stop_sequences() -> None:
    body = "    return 1\n\ndef helper():\n    pass\n"
    assert truncate_completion(body) == "    return 1\n"
    assert truncate_completion("    if x:\n        return 2\n") == "    if x:\n        return 2\n"
