"""A task whose loading fails the way a machine can fail a run after its model loaded: a full disk
(OSError) or no memory left (MemoryError); `fails=none` loads as tests.fake_task.FakeTask."""

from __future__ import annotations

import errno

from tests.fake_task import FakeTask


class RaisingTask(FakeTask):
    def __init__(self, fails: str = "none", **kw) -> None:
        super().__init__(**kw)
        self.fails = fails

    def _load(self):
        if self.fails == "disk":
            raise OSError(errno.ENOSPC, "No space left on device", "/data/questions.jsonl")
        if self.fails == "memory":
            raise MemoryError("cannot allocate 64 GiB")
        return super()._load()
