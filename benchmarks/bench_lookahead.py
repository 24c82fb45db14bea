"""Lookahead Decoding and prompt-lookup decoding vs vanilla greedy on MT-Bench with SmolLM2.

    flock results/bench/.lock python -m benchmarks.bench_lookahead \\
        [--questions 3] [--new 128] [--dtypes float32 bfloat16] [--configs 5,7,7 5,15,15] \\
        [--pld 2,10] [--sweep 5 10 15 20 30 40] [--sweep-dtype bfloat16] [--threads 1]

Part 1: tau, tok/s and speedup for lookahead at several (N, W, G) and for PLD, per dtype.
Part 2 (FAFO Figure 1, Lookahead's curve): speedup and tau against the number of guesses,
N = 5 and W = G (Lookahead's guess set grows with the window).

Protocol: the same prompts for every method in one run (the first --questions MT-Bench questions,
turn 1 and turn 2, turn 2 built from fp32 vanilla's own turn-1 answer with the chat template);
generation stops at EOS or --new tokens. One untimed warm-up generation per method first; then,
per prompt, every method runs in turn (so background noise hits all methods alike), timed with
time.perf_counter; decode time starts when the prefill is done (Counts' prefill callback).
speedup = total vanilla time / total method time over the same prompts (decode-only and wall).
`exact` counts outputs identical to vanilla's in the same dtype (bf16 may drift: block shapes
change the rounding). Timings on a shared 2-core CPU are noisy; run under flock so no other
benchmark overlaps.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from benchmarks.timing import timed_generate
from core.engine import Engine
from core.models import load_model
from core.types import Counts
from decoders.base import BaseDecoder
from decoders.lookahead import Lookahead
from decoders.pld import PromptLookup
from decoders.vanilla import Vanilla
from runners.runner import stop_ids_for
from tasks.mtbench import MTBench

Maker = Callable[[Engine], BaseDecoder]


@dataclass
class Tally:
    name: str
    params: str
    wall: float = 0.0
    decode: float = 0.0
    tokens: int = 0
    forwards: int = 0
    committed: int = 0
    max_block: int = 0
    exact: int = 0
    runs: int = 0
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def tau(self) -> float:
        return self.committed / self.forwards if self.forwards else float("nan")


def build_prompts(n_questions: int, new: int) -> tuple[list[list[int]], set[int]]:
    """Turn-1 and turn-2 prompt ids of the first questions (turn 2 sees fp32 vanilla's answer)."""
    lm = load_model("packaged", "smollm2-135m", dtype="float32", device="cpu")
    tok, eng = lm.tokenizer, Engine(lm.model)
    stop = stop_ids_for(tok, lm.model)
    task = MTBench(limit=n_questions)
    prompts = []
    for sample in task.load():
        first = task.prompt_ids(sample, 0, [], tok)
        answer = Vanilla(eng).generate(first, new, stop, Counts(keep_steps=False))
        prompts += [first, task.prompt_ids(sample, 1, [tok.decode(answer, skip_special_tokens=True)], tok)]
    return prompts, stop


def measure(
    dtype: str, methods: list[tuple[str, str, Maker]], prompts: list[list[int]], new: int, stop: set[int]
) -> list[Tally]:
    """Time every method on every prompt (methods interleaved per prompt); vanilla must be first."""
    lm = load_model("packaged", "smollm2-135m", dtype=dtype, device="cpu")
    eng = Engine(lm.model)
    decoders = [(Tally(name, params), make(eng)) for name, params, make in methods]
    for _, dec in decoders:  # warm-up: layouts, allocator, kernels
        dec.generate(prompts[0][:48], 8, set(), Counts(keep_steps=False))
    with torch.inference_mode():
        for prompt in prompts:
            for i, (tally, dec) in enumerate(decoders):
                timed = timed_generate(dec, prompt, new, stop)
                out, counts = timed.output, timed.counts
                tally.wall += timed.wall_s
                tally.decode += timed.decode_s
                tally.tokens += len(out)
                tally.forwards += counts.forwards
                tally.committed += counts.committed
                tally.max_block = max([tally.max_block, *(s.block_tokens for s in counts.steps)])
                tally.exact += out == (out if i == 0 else decoders[0][0].outputs[-1])  # vanilla ran first
                tally.runs += 1
                tally.outputs.append(out)
    return [t for t, _ in decoders]


def print_table(title: str, dtype: str, tallies: list[Tally]) -> None:
    base = tallies[0]
    print(f"\n### {title} ({dtype})\n")
    print("| method | params | max block | tau | decode tok/s | speedup (decode) | speedup (wall) | exact |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for t in tallies:
        print(
            f"| {t.name} | {t.params} | {t.max_block} | {t.tau:.2f} | {t.committed / t.decode:.2f} | "
            f"{base.decode / t.decode:.2f} | {base.wall / t.wall:.2f} | {t.exact}/{t.runs} |"
        )


def lookahead_maker(n: int, w: int, g: int) -> Maker:
    return lambda e: Lookahead(e, N=n, W=w, G=g)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=3)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--configs", nargs="+", default=["5,7,7", "5,15,15", "4,5,5"], help="N,W,G triples")
    ap.add_argument("--pld", nargs="+", default=["2,10"], help="max_matching_ngram_size,num_tokens pairs")
    ap.add_argument("--sweep", nargs="*", type=int, default=[5, 10, 15, 20, 30, 40], help="guesses (W = G)")
    ap.add_argument("--sweep-dtype", default="bfloat16")
    ap.add_argument("--sweep-questions", type=int, default=2)
    ap.add_argument("--sweep-new", type=int, default=96)
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (1: least hurt by other jobs on a shared box)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(
        f"# bench_lookahead: SmolLM2-135M-Instruct, MT-Bench, threads={args.threads}, "
        f"torch {torch.__version__}"
    )
    prompts, stop = build_prompts(max(args.questions, args.sweep_questions), args.new)
    main_prompts = prompts[: 2 * args.questions]
    print(
        f"prompts: {len(main_prompts)} (questions x 2 turns), lengths {[len(p) for p in main_prompts]}, "
        f"max_new_tokens {args.new}"
    )
    methods: list[tuple[str, str, Maker]] = [("vanilla", "-", lambda e: Vanilla(e))]
    for spec in args.configs:
        n, w, g = (int(x) for x in spec.split(","))
        methods.append(("lookahead", f"N={n} W={w} G={g}", lookahead_maker(n, w, g)))
    for spec in args.pld:
        ng, k = (int(x) for x in spec.split(","))
        methods.append(
            (
                "pld",
                f"ngram={ng} k={k}",
                lambda e, ng=ng, k=k: PromptLookup(e, max_matching_ngram_size=ng, num_tokens=k),
            )
        )
    for dtype in args.dtypes:
        tallies = measure(dtype, methods, main_prompts, args.new, stop)
        print_table("Lookahead and PLD vs vanilla", dtype, tallies)
    if args.sweep:
        sweep_prompts = prompts[: 2 * args.sweep_questions]
        sweep = [("vanilla", "-", lambda e: Vanilla(e))]
        sweep += [("lookahead", f"N=5 W={g} G={g}", lookahead_maker(5, g, g)) for g in args.sweep]
        print(f"\nguess sweep: {len(sweep_prompts)} prompts, max_new_tokens {args.sweep_new}")
        tallies = measure(args.sweep_dtype, sweep, sweep_prompts, args.sweep_new, stop)
        print_table("Guess sweep (FAFO Fig. 1, Lookahead curve)", args.sweep_dtype, tallies)


if __name__ == "__main__":
    from benchmarks.output import recorded

    with recorded("bench_lookahead"):
        main()
