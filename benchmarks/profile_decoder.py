"""Where a decoder's step time goes: inside the engine's forward or outside it, and which operators.

    python -m benchmarks.profile_decoder [--device cpu] [--dtype float32] [--decoders vanilla lookahead]
        [--threads 1 16] [--questions 1] [--new 64] [--top 12] [--cuda-graphs]

For each intra-op thread count and decoder: one untimed warm-up, then one MT-Bench turn-2 generation
timed per step (ms per forward, and the share spent inside `Engine.step`), then the same generation
under `torch.profiler` (CPU, and CUDA when the device is) with its operators by self CPU time, and
the host-device synchronisations and copies per step. On a GPU whose forwards are launch-bound,
this tells a slow decoder's Python and CPU-side tensor work
from its forward, and whether the CPU thread count matters.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.bench_lookahead import build_prompts
from benchmarks.timing import StepClock, timed_generate
from core.engine import Engine
from core.models import load_model
from core.types import Counts
from decoders.base import BaseDecoder
from decoders.fafo.decoder import FAFO
from decoders.lookahead import Lookahead
from decoders.pld import PromptLookup
from decoders.vanilla import Vanilla
from kv_policies.base import build_policy

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
        with profile(activities=activities) as prof:
            dec.generate(prompts[-1], new, stop, Counts(keep_steps=False))
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
    print("\n```")
    print(events.table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=48))
    print("```")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--decoders", nargs="+", default=["vanilla", "lookahead"], choices=sorted(DECODERS))
    ap.add_argument("--threads", type=int, nargs="+", default=[torch.get_num_threads()])
    ap.add_argument("--questions", type=int, default=1)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--top", type=int, default=12)
    ap.add_argument("--cuda-graphs", action="store_true", help="fixed-shape forwards replayed as CUDA graphs")
    args = ap.parse_args()
    prompts, stop = build_prompts(args.questions, args.new)
    lm = load_model("packaged", "smollm2-135m", dtype=args.dtype, device=args.device)
    eng = Engine(lm.model, cuda_graphs=args.cuda_graphs)
    for threads in args.threads:
        torch.set_num_threads(threads)
        graphs = " CUDA graphs" if args.cuda_graphs else ""
        where = f"{args.device} {args.dtype}{graphs}, {threads} intra-op threads"
        print(f"\n### {where}, MT-Bench turn 2, {args.new} tokens")
        for name in args.decoders:
            profile_one(name, eng, prompts, args.new, stop, args.top)


if __name__ == "__main__":
    from benchmarks.output import recorded

    with recorded("profile_decoder"):
        main()
