"""A fixed-shape function of device buffers, run eagerly or captured once as a CUDA graph and replayed
(`run.cuda_graphs`): the fixed-shape decode forwards (`core.decode_graph`), LongSpec's draft steps
(`decoders/longspec/static_draft.py`) and whatever an engine makes replayable for a KV policy
(`core.engine.Engine.replayable`). `runners.emulated_graphs` emulates the capture on any device.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch


class Replay:
    """One fixed-shape forward `run()` -> output, run eagerly or captured once per `key` (the addresses
    and sizes it was captured on) and replayed. `state`: tensors `run` updates in place from their own
    values (not idempotent), restored after the warm-up runs that precede a capture. `total_captures`
    counts the captures of every Replay of the process: a clock tells by it whether a timed generation
    paid for some (`runners.timing.DecodeClocks`)."""

    total_captures = 0
    total_compile_s = 0.0  # seconds of every compiling call (`compiled`) of the process

    def __init__(
        self, run: Callable[[], Any], capture: bool, device: torch.device, state=(), compiled: bool = False
    ) -> None:
        self.run, self.capture, self.device, self.state = run, capture, device, tuple(state)
        self.compiled = compiled  # `run` is compiled: its first call per shape compiles it
        self.graph: torch.cuda.CUDAGraph | None = None
        self.key: tuple | None = None
        self.out: Any = None  # the graph's output buffers
        self.captures = 0
        self.compiled_for: tuple | None = None  # the shape (the key less its address) last compiled for

    def __call__(self, key: tuple) -> Any:
        if not self.capture:
            if self.compiled and key[1:] != self.compiled_for:
                return self._compiling_call(key)
            return self.run()
        if self.graph is None or key != self.key:
            if self.compiled and key[1:] != self.compiled_for:
                self._compiling_call(key)  # compiled outside the capture (and timed apart from it)
            self._capture()
            Replay.total_captures += 1
            self.key = key
        self.graph.replay()
        return self.out

    def _compiling_call(self, key: tuple) -> Any:
        """The first run of a compiled `run` at a new shape: it compiles (or takes inductor's cache), so
        it counts as a capture (a clock sees a timed decode that paid for one) and its seconds go to
        `total_compile_s`, reported apart from decode time. Its state is restored like a warm-up's."""
        saved = [t.clone() for t in self.state] if self.capture else []  # a warm-up only under a capture
        start = time.perf_counter()
        out = self.run()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        Replay.total_compile_s += time.perf_counter() - start
        Replay.total_captures += 1
        self.compiled_for = key[1:]
        if self.capture:
            for t, before in zip(self.state, saved, strict=True):
                t.copy_(before)
        return out

    def _capture(self) -> None:
        """Warm up on a side stream (allocator, kernel selection), then record one run."""
        saved = [t.clone() for t in self.state]
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self.run()
        torch.cuda.current_stream(self.device).wait_stream(side)
        for t, before in zip(self.state, saved, strict=True):
            t.copy_(before)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self.run()
        self.captures += 1
