"""What a decode step costs the host when the host keeps its caches, as a GPU's host does: the paper
experiments' decoder x policy pairs with their forwards played back from a recording.

    flock results/bench/.lock python -m benchmarks.bench_warm_host \\
        [--scale cpu|paper] [--only fafo+streaming ...] [--questions 2] [--new 64] [--repeats 3] [--plays 5]

Between two CPU forwards a decoder's work runs with cold caches: the forward streams the weights through
every cache level. So `bench_host_overhead`'s host ms mixes the decoder's work with cache misses that a
GPU's host, whose forwards run elsewhere, does not pay. Here each method first generates for real on
the fixed-shape forwards (the views a run with CUDA graphs takes) while a tape records what each forward
returns (`core.replay.Replay`: the target's and the draft model's); then it generates again
`--plays` times with every forward played back from the tape instead of run. The same steps run, with
the same host work (the engine's staging, the decoder's bookkeeping, the policy's operators on device
tensors), and no model. A playback must make the recording's forwards and give its tokens (checked: a
method whose playback diverges is reported so, without a number; LongSpec's draft writes its tree into
buffers that the host reads, which the tape does not keep).

Per decode target forward, with the ratio to vanilla's within each repeat (medians over repeats):
- warm host us: a playback's decode time outside the forwards (`Engine.step` and the draft model's), the
  fastest of `--plays`: the decoder's and the policy's work, as `bench_host_overhead` defines host ms;
- warm critical us: the part of it after each step's read until the next forward (`runners.critical_path`:
  what a GPU waits for; the rest runs while it computes);
- warm staging us: the same playback's time inside them, the forward played back: the engine's staging
  of a fixed-shape forward and the selection a policy stages for it (a GPU's host pays it too);
- cold host ms: the recording's decode time outside its forwards (`bench_host_overhead`'s host ms).
Left out of the warm numbers, and in a GPU's host time: CUDA's call for each operator and copy (a few us
each; `bench_host_overhead --fixed-shape` counts them as graph launches/step) and the wait of each read.
Overstated in them: an operator over a large tensor (a 512-row block's visibility) costs its arithmetic
here, and only its launch on a GPU's host.
The forwards' outputs play back as recorded, except tensors of more than `EXACT` elements (a large
block's logits), which play back as zeros: a method that read their values would diverge.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_map

from benchmarks.bench_host_overhead import (
    COMBOS,
    backend_of,
    chosen_combos,
    make_decoder,
    pair_options,
    warm_up,
)
from core.engine import Engine
from core.models import load_model
from core.replay import Replay
from decoders.base import BaseDecoder
from runners.config import resolve_linear, stop_ids_for
from runners.timing import DecodeClocks, timed_generate
from tasks.mtbench import MTBench

EXACT = 1 << 20  # elements: a recorded output up to this size plays back as it was


class ForwardTape:
    """The outputs of every `Replay` call in call order: recorded while `recording()`, handed back in
    the same order instead of running while `playing()`, each to the Replay that made it (another one
    at that place means the playback took other steps)."""

    def __init__(self) -> None:
        self.outputs: list[Any] = []
        self.at = 0
        self.mode = ""
        self.zeros: dict[tuple, torch.Tensor] = {}

    def _keep(self, t: Any) -> Any:
        if not isinstance(t, torch.Tensor):
            return t
        if t.numel() <= EXACT:
            return t.clone()
        key = (tuple(t.shape), t.dtype, t.device)
        if key not in self.zeros:  # one buffer per shape, as a graph's output buffers are
            self.zeros[key] = torch.zeros_like(t)
        return self.zeros[key]

    @contextlib.contextmanager
    def _patched(self, mode: str) -> Iterator[ForwardTape]:
        run = Replay.__call__

        def call(replay: Replay, key: tuple) -> Any:
            if self.mode == "record":
                out = run(replay, key)
                self.outputs.append((replay, tree_map(self._keep, out)))
                return out
            if self.at >= len(self.outputs) or self.outputs[self.at][0] is not replay:
                raise PlaybackDiverged(f"forward {self.at + 1} is not the recording's")
            self.at += 1
            return self.outputs[self.at - 1][1]

        self.mode, self.at = mode, 0
        Replay.__call__ = call  # type: ignore[method-assign]
        try:
            yield self
        finally:
            Replay.__call__ = run  # type: ignore[method-assign]
            self.mode = ""

    def recording(self) -> contextlib.AbstractContextManager[ForwardTape]:
        self.outputs = []
        return self._patched("record")

    def playing(self) -> contextlib.AbstractContextManager[ForwardTape]:
        return self._patched("play")


class PlaybackDiverged(RuntimeError):
    """A playback took other steps than the recording (it read values the tape does not keep)."""


@dataclass
class Method:
    decoder: str
    kv: str
    dec: BaseDecoder
    backend: str = ""
    # per repeat, per decode target forward: warm host, critical and staging us, cold host ms
    warm_us: list[float] = field(default_factory=list)
    critical_us: list[float] = field(default_factory=list)
    staging_us: list[float] = field(default_factory=list)
    cold_ms: list[float] = field(default_factory=list)
    diverged: str = ""

    @property
    def name(self) -> str:
        return f"{self.decoder}+{self.kv}" + (f"/{self.backend}" if self.backend else "")


@dataclass
class Seconds:
    """One prompt's decode seconds: outside the forwards in the recording (cold) and in the fastest
    playback (warm; `critical`, the part after each read), inside the played-back forwards (staging),
    and its decode target forwards."""

    cold: float = 0.0
    warm: float = 0.0
    critical: float = 0.0
    staging: float = 0.0
    forwards: int = 0

    def __iadd__(self, other: Seconds) -> Seconds:
        self.cold, self.warm = self.cold + other.cold, self.warm + other.warm
        self.critical, self.staging = self.critical + other.critical, self.staging + other.staging
        self.forwards += other.forwards
        return self


def record_and_play(m: Method, prompt: list[int], new: int, stop: set[int], plays: int) -> Seconds:
    """One prompt recorded, then played back `plays` times. Forwards are `Engine.step` calls (a
    self-drafting decoder's drafts included) and the draft model's, as `bench_host_overhead` counts."""
    tape = ForwardTape()
    with DecodeClocks(m.dec) as clocks, tape.recording():
        recorded = timed_generate(m.dec, prompt, new, stop, on_prefill_done=clocks.mark, keep_steps=False)
    plays_s: list[tuple[float, float, float, float]] = []  # (decode, outside the forwards, critical, inside)
    for _ in range(plays):
        with DecodeClocks(m.dec) as played, tape.playing():
            again = timed_generate(m.dec, prompt, new, stop, on_prefill_done=played.mark, keep_steps=False)
        if again.output != recorded.output or tape.at != len(tape.outputs):
            raise PlaybackDiverged("the playback's tokens or forwards differ from the recording's")
        outside = played.host_s(again)
        plays_s.append((again.decode_s, outside, played.critical_s(again), again.decode_s - outside))
    _, warm, critical, staging = min(plays_s)
    n = clocks.forwards.forwards_since_mark
    return Seconds(clocks.host_s(recorded), warm, critical, staging, n)


def time_repeat(
    methods: list[Method], prompts: list[list[int]], new: int, stop: set[int], plays: int
) -> None:
    """Every method on every prompt in turn (background load hits all alike)."""
    total = {m.name: Seconds() for m in methods}
    for prompt in prompts:
        for m in methods:
            if m.diverged:
                continue
            try:
                total[m.name] += record_and_play(m, prompt, new, stop, plays)
            except PlaybackDiverged as exc:
                m.diverged = str(exc)
    for m in methods:
        t = total[m.name]
        if not m.diverged:
            m.cold_ms.append(1e3 * t.cold / t.forwards)
            m.warm_us.append(1e6 * t.warm / t.forwards)
            m.critical_us.append(1e6 * t.critical / t.forwards)
            m.staging_us.append(1e6 * t.staging / t.forwards)


def ratio(values: list[float], base: list[float]) -> float:
    return statistics.median(v / b for v, b in zip(values, base, strict=True))


def print_table(methods: list[Method], repeats: int) -> None:
    base = methods[0]
    print(
        "| decoder | kv | warm host us/forward | x vanilla | warm critical us/forward | x vanilla "
        "| warm staging us/forward | x vanilla | cold host ms/forward | x vanilla |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for m in methods:
        kv = m.kv + (f" ({m.backend})" if m.backend else "")
        if m.diverged:
            print(f"| {m.decoder} | {kv} | diverged: {m.diverged} | | | | | | | |")
            continue
        cells = [
            f"{statistics.median(m.warm_us):.0f}",
            f"{ratio(m.warm_us, base.warm_us):.2f}",
            f"{statistics.median(m.critical_us):.0f}",
            f"{ratio(m.critical_us, base.critical_us):.2f}",
            f"{statistics.median(m.staging_us):.0f}",
            f"{ratio(m.staging_us, base.staging_us):.2f}",
            f"{statistics.median(m.cold_ms):.2f}",
            f"{ratio(m.cold_ms, base.cold_ms):.2f}",
        ]
        print(f"| {m.decoder} | {kv} | " + " | ".join(cells) + " |")
    print(f"\nmedians over {repeats} repeats; x vanilla: median of the per-repeat ratios")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    pair_options(ap)
    ap.add_argument("--plays", type=int, default=5, help="playbacks per recording (the fastest counts)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model("packaged", "smollm2-135m", dtype="float32", device="cpu")
    eng = Engine(lm.model, linear=resolve_linear("auto", lm))
    eng.use_graphs(capture=False)  # the fixed-shape forwards, which the tape records
    stop = stop_ids_for(lm.tokenizer, lm.model)
    task = MTBench(limit=args.questions)
    prompts = [task.prompt_ids(s, 0, [], lm.tokenizer) for s in task.load()]
    combos = chosen_combos(COMBOS, args.only, args.scale)
    methods = [
        Method(d, k, make_decoder(d, k, extra, lm, eng, args.scale), backend=backend_of(extra))
        for d, k, extra in combos
    ]
    print(
        f"# bench_warm_host: SmolLM2-135M float32 on cpu ({eng.linear}, fixed-shape forwards), "
        f"scale={args.scale}, MT-Bench turn 1 x {len(prompts)} (lengths {[len(p) for p in prompts]}), "
        f"{args.new} new tokens, {args.plays} playbacks per recording, threads={args.threads}, "
        f"torch {torch.__version__}\n"
    )
    warm_up([m.dec for m in methods], prompts, args.new, stop)
    for _ in range(args.repeats):
        time_repeat(methods, prompts, args.new, stop, args.plays)
    print_table(methods, args.repeats)
    print("overrides: " + "; ".join(f"{d}+{k}: {' '.join(e)}" for d, k, e in combos if e))


if __name__ == "__main__":
    from benchmarks.output import recorded

    naming = argparse.ArgumentParser(add_help=False)
    naming.add_argument("--scale", default="cpu")
    known = naming.parse_known_args()[0]
    with recorded(
        "bench_warm_host" + ("_paper" if known.scale == "paper" else ""), module="benchmarks.bench_warm_host"
    ):
        main()
