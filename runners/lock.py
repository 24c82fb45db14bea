"""One writer per run directory: a second process on the same run id stops with one clear line; and a
second identical command stops before its model loads (`CommandLock`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from core.types import HarnessError


def _hold(path: Path, busy: Callable[[str], str], holder_line: str) -> IO[str]:
    """`path` opened and exclusively `flock`ed, `holder_line` written into it; when another process holds
    it, `busy(holder)` (given what the file says of that process) is the one error line."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(path, "a+")  # noqa: SIM115 - held for the lifetime of the run
    except OSError as exc:  # a read-only or full file system, a file where a folder should be
        raise HarnessError(
            f"cannot write the run's records in {path.parent} ({exc.strerror}): "
            "set run.out_dir to a writable folder"
        ) from None
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().strip() or "another process"
        fh.close()
        raise HarnessError(busy(holder)) from None
    fh.seek(0)
    fh.truncate()
    fh.write(holder_line)
    fh.flush()
    return fh


class RunLock:
    """An exclusive `fcntl.flock` on `<run dir>/LOCK`, held while a run writes its records. The kernel
    drops it when the holder dies (crash, kill, scancel), so a stale file never blocks a rerun."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "LOCK"
        self._fh: IO[str] | None = None

    def __enter__(self) -> RunLock:
        self._fh = _hold(
            self.path,
            lambda holder: (
                f"run {self.path.parent.name} is being written by {holder}; wait for it to finish "
                "(its records are resumed, not duplicated, by a rerun afterwards)"
            ),
            f"pid {os.getpid()} on {socket.gethostname()}\n",
        )
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None


class CommandLock:
    """An exclusive `flock` on `<runs dir>/.command-<key>.lock`, taken before the model loads: `key`
    digests the config that makes a run's identity, so a second identical command is refused at once
    rather than after loading its model (the run id itself needs the model: its device, dtype, linear).
    Only a fast path: two commands that differ in form but share a run id still meet at `RunLock`, which
    stays the guarantee (also where removing this file at exit races with a third command opening it).
    The file, and the folders made for it, are removed at exit, so a refused run leaves nothing."""

    def __init__(self, runs_dir: Path, key: str) -> None:
        self.path = runs_dir / f".command-{key}.lock"
        self._fh: IO[str] | None = None
        self._made: list[Path] = []

    def __enter__(self) -> CommandLock:
        self._made = [p for p in (self.path.parent, *self.path.parent.parents) if not p.exists()]
        try:
            self._fh = _hold(
                self.path,
                lambda holder: (
                    f"the same run is already running ({holder}) with its records in {self.path.parent}; "
                    "wait for it to finish (a rerun afterwards skips or resumes it)"
                ),
                f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}\n",
            )
        except HarnessError:
            self._remove_made()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fh is None:
            return
        with contextlib.suppress(OSError):
            self.path.unlink()  # while still held: a command waiting on it then makes a new one
        fcntl.flock(self._fh, fcntl.LOCK_UN)
        self._fh.close()
        self._fh = None
        self._remove_made()

    def _remove_made(self) -> None:
        """The folders made for the lock file, those of them left empty (a refused run leaves nothing)."""
        for level in self._made:
            try:
                level.rmdir()
            except OSError:
                return
