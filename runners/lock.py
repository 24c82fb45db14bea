"""One writer per run directory: a second process on the same run id stops with one clear line."""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path
from typing import IO

from core.types import HarnessError


class RunLock:
    """An exclusive `fcntl.flock` on `<run dir>/LOCK`, held while a run writes its records. The kernel
    drops it when the holder dies (crash, kill, scancel), so a stale file never blocks a rerun."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "LOCK"
        self._fh: IO[str] | None = None

    def __enter__(self) -> RunLock:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fh = open(self.path, "a+")  # noqa: SIM115 - held for the lifetime of the run
        except OSError as exc:  # a read-only or full file system, a file where a folder should be
            raise HarnessError(
                f"cannot write the run's records in {self.path.parent} ({exc.strerror}): "
                "set run.out_dir to a writable folder"
            ) from None
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise HarnessError(
                f"run {self.path.parent.name} is being written by {holder}; wait for it to finish "
                "(its records are resumed, not duplicated, by a rerun afterwards)"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        fh.flush()
        self._fh = fh
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None
