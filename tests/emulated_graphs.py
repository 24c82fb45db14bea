"""The tests' CUDA-graph capture emulation: it lives in `runners.emulated_graphs` (`run.cuda_graphs=emulate`
uses it too)."""

from runners.emulated_graphs import EmulatedGraph, captured, emulated_capture

__all__ = ["EmulatedGraph", "captured", "emulated_capture"]
