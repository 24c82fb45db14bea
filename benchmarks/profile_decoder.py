"""Where a decoder's step time goes: inside the engine's forward or outside it, and which operators.

    python -m benchmarks.profile_decoder [--device cpu] [--dtype float32] [--decoders vanilla lookahead]
        [--threads 1 16] [--questions 1] [--new 64] [--top 12] [--cuda-graphs | --fixed-shape]

For each intra-op thread count and decoder: one untimed warm-up, then one MT-Bench turn-2 generation
timed per step (ms per forward, and the share spent inside `Engine.step`), then the same generation
twice more with only its decode loop profiled (no prefill, and no CUDA graph captured: the timed run
made them, and the count of any new one is printed):
- under `torch.profiler` (CPU, and CUDA when the device is): its operators by self CPU time, and the
  host-device synchronisations and copies per forward;
- under `cProfile`, the model's body left out (an eager engine's whole step; with fixed-shape forwards,
  what the graph holds): the Python functions and C calls by their own time per decode step, i.e. the
  decoder's work, the engine's staging and, with CUDA graphs, the replay's launch. On a GPU the step's
  read (`tolist`, `item`) holds the wait for the device; the rest is the host work that sits between
  two forwards. cProfile's own cost inflates code that makes many calls: compare within one table.
On a GPU whose forwards are launch-bound, this tells a slow decoder's Python and CPU-side tensor work
from its forward, and whether the CPU thread count matters.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
from collections.abc import Callable
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.bench_host_overhead import forward_mode, forward_options, take_fixed_shape
from benchmarks.bench_lookahead import build_prompts
from benchmarks.timing import StepClock, timed_generate
from core.decode_graph import StaticForward, StaticForwards
from core.engine import Engine
from core.models import load_model
from core.types import Counts
from decoders.base import BaseDecoder
from decoders.fafo.decoder import FAFO
from decoders.lookahead import Lookahead
from decoders.pld import PromptLookup
from decoders.vanilla import Vanilla
from kv_policies.registry import build_policy
from runners.forwards import MethodPatch

DECODERS: dict[str, Callable[[Engine], BaseDecoder]] = {
    "vanilla": lambda e: Vanilla(e),
    "pld": lambda e: PromptLookup(e, max_matching_ngram_size=2, num_tokens=10),
    "lookahead": lambda e: Lookahead(e, N=5, W=7, G=7),
    "fafo-paper": lambda e: FAFO(e, kv=build_policy("streaming", budget=760, sinks=4), k=6, n=40),
}
SYNC_EVENTS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def profile_one(name: str, eng: Engine, prompts: list[list[int]], new: int, stop: set[int], top: int) -> None:
    dec = DECODERS[name](eng)
    with torch.inference_mode():
        dec.generate(prompts[0], 16, stop, Counts(keep_steps=False))  # warm-up
        with StepClock(eng) as clock:
            timed = timed_generate(dec, prompts[-1], new, stop, keep_steps=False)
        counts, wall = timed.counts, timed.wall_s
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if eng.device.type == "cuda" else [])
        captures = graph_captures(eng)
        prof = profile(activities=activities)
        dec.generate(prompts[-1], new, stop, decode_only(prof.start, prof.stop))
        python, py_steps = profile_python(dec, prompts[-1], new, stop)
        captured = graph_captures(eng) - captures
    f = counts.forwards
    print(
        f"\n#### {name}: {f} forwards, tau {counts.committed / f:.2f}, {1000 * wall / f:.2f} ms per forward, "
        f"{100 * clock.seconds / wall:.0f}% inside Engine.step\n"
    )
    events = prof.key_averages()
    syncs = {e.key: e.count for e in events if e.key.startswith(SYNC_EVENTS)}
    print(
        "host-device syncs and copies per forward: "
        + (", ".join(f"{k} {v / f:.1f}" for k, v in sorted(syncs.items())) or "none")
    )
    if captured:
        print(f"CUDA graphs captured while profiling: {captured} (their warm-up runs are in the tables)")
    print("\n```")
    print(events.table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=48))
    print("```")
    print(
        "\nPython and C calls by own time in the decode loop, the model's body left out "
        "(cProfile), microseconds per decode step:\n"
    )
    print(python_table(python, py_steps, top))


def decode_only(start, stop) -> Counts:
    """Counts whose generation calls `start` when its prefill is done and `stop` when its decode loop is."""
    return Counts(keep_steps=False, on_prefill_done=start, on_decode_done=stop)


def profile_python(
    dec: BaseDecoder, prompt: list[int], new: int, stop: set[int]
) -> tuple[cProfile.Profile, int]:
    """A generation's decode loop under cProfile, the model's body left out: an eager step whole; a step
    on the fixed-shape forwards keeps its staging and the replay's call, not what the graph holds.
    Returns the profile and the decode steps."""
    switch = ProfileSwitch(cProfile.Profile())
    patch = MethodPatch([(dec.engine, "step")], lambda f: switch.around(f, on=False))
    staging, body = StaticForwards.__call__, StaticForward.forward  # class attributes (a call's lookup)
    StaticForwards.__call__ = switch.around(staging, on=True)  # type: ignore[method-assign]
    StaticForward.forward = switch.around(body, on=False)  # type: ignore[method-assign]
    counts = decode_only(lambda: switch.set(True), lambda: switch.set(False))
    try:
        dec.generate(prompt, new, stop, counts)
    finally:
        StaticForwards.__call__, StaticForward.forward = staging, body  # type: ignore[method-assign]
        patch.undo()
        switch.set(False)
    return switch.python, counts.forwards


class ProfileSwitch:
    """Runs a cProfile while a generation's decode loop is `active`, except inside calls wrapped `around`
    with on=False (the model's body); a call wrapped with on=True inside one (a step's staging) profiles
    again. The innermost wrapped call decides."""

    def __init__(self, python: cProfile.Profile) -> None:
        self.python, self.active, self.on = python, False, False
        self.wanted: list[bool] = []

    def set(self, active: bool) -> None:
        self.active = active
        self._apply()

    def _apply(self) -> None:
        on = self.active and (self.wanted[-1] if self.wanted else True)
        if on != self.on:
            (self.python.enable if on else self.python.disable)()
            self.on = on

    def around(self, f: Callable, on: bool) -> Callable:
        def run(*args, **kwargs):
            self.wanted.append(on)
            self._apply()
            try:
                return f(*args, **kwargs)
            finally:
                self.wanted.pop()
                self._apply()

        return run


def graph_captures(eng: Engine) -> int:
    return eng.graphs.captures if eng.graphs is not None else 0


def python_table(python: cProfile.Profile, steps: int, top: int) -> str:
    """The `top` functions by own time (tottime) per step: this repository's by path and name, the rest
    (torch, the standard library, C calls) as cProfile names them."""
    repo = str(Path(__file__).resolve().parents[1]) + "/"
    rows = []
    for (path, line, func), (_, calls, own, _, _) in pstats.Stats(python).stats.items():  # type: ignore[attr-defined]
        if path.startswith(repo) or "site-packages/" in path:  # no machine's own paths in the table
            where = f"{path.removeprefix(repo).rpartition('site-packages/')[2]}:{line} {func}"
        else:
            where = func
        rows.append((own, calls, where))
    rows.sort(reverse=True)
    total = sum(own for own, _, _ in rows)
    steps = max(steps, 1)
    lines = ["| own us/step | calls/step | function |", "|---:|---:|---|"]
    for own, calls, where in rows[:top]:
        lines.append(f"| {1e6 * own / steps:.1f} | {calls / steps:.1f} | `{where}` |")
    lines.append(f"| {1e6 * total / steps:.1f} | | all |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--decoders", nargs="+", default=["vanilla", "lookahead"], choices=sorted(DECODERS))
    ap.add_argument("--threads", type=int, nargs="+", default=[torch.get_num_threads()])
    ap.add_argument("--questions", type=int, default=1)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--top", type=int, default=12)
    forward_options(ap)
    args = ap.parse_args()
    prompts, stop = build_prompts(args.questions, args.new)
    lm = load_model("packaged", "smollm2-135m", dtype=args.dtype, device=args.device)
    eng = Engine(lm.model, cuda_graphs=args.cuda_graphs)
    take_fixed_shape(eng, args)
    for threads in args.threads:
        torch.set_num_threads(threads)
        where = " ".join(filter(None, (args.device, args.dtype, forward_mode(args))))
        where += f", {threads} intra-op threads"
        print(f"\n### {where}, MT-Bench turn 2, {args.new} tokens")
        for name in args.decoders:
            profile_one(name, eng, prompts, args.new, stop, args.top)


if __name__ == "__main__":
    from benchmarks.output import recorded

    with recorded("profile_decoder"):
        main()
