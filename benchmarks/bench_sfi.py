"""SFI (Slow-Fast Inference) against dense decoding as the context grows, with SmolLM2-135M: what a
fast step, a slow step and the Selector cost, and the decode speedup (one run, one row per context).

    flock results/bench/.lock python -m benchmarks.bench_sfi \\
        [--contexts 1024 2048 4096 7168] [--prompts 2] [--new 64] [--budget-frac 0.2] [--repeats 3]

Methods: dense = decoder=vanilla kv=full; SFI = decoder=sfi with kv=sfi (sinks 4, recent --recent,
k = the rest of --budget-frac of each context; the preset of experiment=sfi_figure4_cpu) on the
`sliced` backend, whose fast steps read only the packed long-range set and the recent window.

Columns (milliseconds are medians over every step of that kind in the context's runs):
- `dense ms`: a dense decode step; `fast ms`: an SFI fast step that follows a fast step;
  `fast/dense`: their ratio (below 1: a fast step really skips work);
- `slow ms`: a slow step's forward (dense attention + the Selector's logits) plus the Selector pass
  that follows it; `pack ms`: what the first fast step after a slow one costs more than `fast ms`
  (moving the new selection into the compressed region);
- `slow`: slow steps / steps; `visible`: the share of the cache a fast step reads;
- `speedup`: dense decode time / SFI's over the same prompts, pooled; the last column gives it per
  repeat as median [min-max], so this shared machine's noise can be told from a difference;
- `match`: SFI outputs identical to dense greedy (SFI is lossy: a count, not a requirement).

Protocol: prompts are the pg19 task's offline stand-in (Paul Graham essays) cut to exactly each
context length; one untimed warm-up per method; for every repeat and prompt, dense then SFI run back
to back, so the machine's drift hits both; decode time starts when the prefill is done.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from benchmarks.bench_selfspec import spread
from benchmarks.timing import timed_generate
from core.engine import Engine
from core.models import load_model
from core.types import Counts
from decoders.sfi import SlowFast
from decoders.vanilla import Vanilla
from kv_policies.layer_selection import ObservedCausalView
from kv_policies.registry import build_policy
from kv_policies.sfi_slow import SFIFastView
from tasks.pg19 import PG19


@dataclass
class StepClock:
    """Wraps `engine.step` (and a policy's `end_slow`) to time every decode step by kind."""

    engine: Engine
    steps: list[tuple[str, float]] = field(default_factory=list)
    decoding: bool = False

    def __post_init__(self) -> None:
        real = self.engine.step

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            out = real(*args, **kwargs)
            if self.decoding:
                self.steps.append((kind_of(args[2]), time.perf_counter() - t0))
            return out

        self.engine.step = timed  # type: ignore[method-assign]

    def start_decoding(self) -> None:
        self.decoding = True

    def stop_decoding(self) -> None:
        self.decoding = False

    def time_selector(self, kv: Any) -> None:
        real = kv.end_slow

        def timed() -> None:
            t0 = time.perf_counter()
            real()
            if self.decoding and self.steps and self.steps[-1][0] == "slow":
                self.steps[-1] = ("slow", self.steps[-1][1] + time.perf_counter() - t0)

        kv.end_slow = timed


def kind_of(view: Any) -> str:
    if isinstance(view, ObservedCausalView):
        return "slow"
    return "fast" if isinstance(view, SFIFastView) else "dense"


@dataclass
class Tally:
    decode_s: list[float] = field(default_factory=list)  # per repeat
    ms: dict[str, list[float]] = field(default_factory=dict)
    tokens: int = 0
    steps: int = 0
    slow: int = 0
    visible: list[float] = field(default_factory=list)
    match: int = 0
    runs: int = 0

    def add_steps(self, steps: list[tuple[str, float]]) -> None:
        previous = "slow"
        for kind, secs in steps:
            name = "pack" if kind == "fast" and previous == "slow" else kind
            self.ms.setdefault(name, []).append(secs * 1e3)
            previous = kind
        self.steps += len(steps)
        self.slow += sum(kind == "slow" for kind, _ in steps)

    def median(self, kind: str) -> float:
        return statistics.median(self.ms[kind]) if self.ms.get(kind) else float("nan")


def run(clock: StepClock, dec: Any, prompt: list[int], new: int) -> tuple[list[int], Counts, float]:
    clock.steps, clock.decoding = [], False
    timed = timed_generate(
        dec, prompt, new, on_prefill_done=clock.start_decoding, on_finish=clock.stop_decoding
    )
    return timed.output, timed.counts, timed.decode_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 2048, 4096, 7168])
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--budget-frac", type=float, default=0.2)
    ap.add_argument("--recent", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=3, help="measure the prompt set this many times")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    lm = load_model("packaged", "smollm2-135m", dtype="float32", device="cpu")
    eng = Engine(lm.model, linear="onednn")
    clock = StepClock(eng)

    def sfi() -> SlowFast:
        kv = build_policy("sfi", budget_frac=args.budget_frac, recent=args.recent, backend="sliced")
        clock.time_selector(kv)
        return SlowFast(eng, kv=kv, tokenizer=lm.tokenizer)

    print(
        f"SmolLM2-135M fp32 (oneDNN GEMMs), {torch.get_num_threads()} threads; SFI keeps sinks 4 + recent "
        f"{args.recent} + k = {args.budget_frac:.0%} of each context (sliced backend); {args.prompts} "
        f"prompts x {args.new} new tokens x {args.repeats} repeats per context\n"
    )
    print(
        f"{'context':>7s} {'dense ms':>8s} {'fast ms':>7s} {'fast/dense':>10s} {'slow ms':>7s} "
        f"{'pack ms':>7s} {'slow':>5s} {'visible':>7s} {'speedup':>7s} {'match':>5s}  "
        "speedup per repeat: median [min-max]"
    )
    for ctx in args.contexts:
        task = PG19(context_length=ctx, max_new_tokens=args.new, source="package", limit=args.prompts)
        prompts = [task.prompt_ids(s, 0, [], lm.tokenizer) for s in task.load()]
        for make in (lambda: Vanilla(eng), sfi):  # warm-up
            make().generate(prompts[0], 8, set(), Counts())
        dense, slowfast = Tally(decode_s=[0.0] * args.repeats), Tally(decode_s=[0.0] * args.repeats)
        for repeat in range(args.repeats):
            for prompt in prompts:
                ref, _, secs = run(clock, Vanilla(eng), prompt, args.new)
                dense.decode_s[repeat] += secs
                dense.add_steps(clock.steps)
                dense.tokens += len(ref) - 1
                out, counts, secs = run(clock, sfi(), prompt, args.new)
                slowfast.decode_s[repeat] += secs
                slowfast.add_steps(clock.steps)
                slowfast.tokens += len(out) - 1
                slowfast.visible.append(counts.kv_activity.visible_frac)
                slowfast.match += out == ref
                slowfast.runs += 1
        fast = slowfast.median("fast")
        pooled = (sum(dense.decode_s) / dense.tokens) / (sum(slowfast.decode_s) / slowfast.tokens)
        per_repeat = spread(dense.decode_s, slowfast.decode_s)
        print(
            f"{ctx:7d} {dense.median('dense'):8.1f} {fast:7.1f} {fast / dense.median('dense'):10.2f} "
            f"{slowfast.median('slow'):7.1f} {slowfast.median('pack') - fast:7.1f} "
            f"{slowfast.slow / slowfast.steps:5.2f} {statistics.mean(slowfast.visible):7.2f} "
            f"{pooled:7.2f} {slowfast.match:>2d}/{slowfast.runs:<2d}  {per_repeat}"
        )


if __name__ == "__main__":
    from benchmarks.output import recorded

    with recorded("bench_sfi"):
        main()
