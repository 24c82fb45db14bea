"""How fast `training.longspec` gets the target's own continuations, the self-distillation data of the
LongSpec draft (LongSpec §3.2, stage 3): one after another by prompt lookup (`continuations=
prompt_lookup`, lossless greedy) against several prompts per forward (`continuations=batched`).

    python -m benchmarks.bench_longspec_continuations [--prompts 16] [--new 512] [--gen-batch 16]
        [--device auto] [--dtype float32] [--threads 2]

The prompts are the default training recipe's (`training.longspec.data`): the first `--gen-prompt`
tokens of its first sequences after the validation ones, which a run's `generated` take.
Printed side by side from one run: seconds, new tokens per second, the speedup over prompt lookup, and
how many batched continuations equal the greedy ones token for token (batched GEMMs round differently,
so a near-tie can go the other way; from there on the text differs, which training data may).
"""

from __future__ import annotations

import argparse
import time

import torch

from core.engine import Engine
from core.models import load_model
from runners.timing import synchronize
from training.longspec.config import TrainConfig
from training.longspec.data import build_sequences
from training.longspec.steps import continuations


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.bench_longspec_continuations")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--gen-prompt", type=int, default=512)
    ap.add_argument("--new", type=int, default=512)
    ap.add_argument("--gen-batch", type=int, nargs="+", default=[16])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=2)
    return ap


def timed(engine: Engine, prompts: list[list[int]], new: int, method: str, per_call: int):
    synchronize(engine.device)
    start = time.perf_counter()
    out = []
    for i in range(0, len(prompts), per_call):
        out += continuations(engine, prompts[i : i + per_call], new, method)
    synchronize(engine.device)
    return out, time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if (
        args.prompts < 1
        or args.new < 1
        or not 0 < args.gen_prompt < TrainConfig.seq_len
        or min(args.gen_batch) < 1
    ):
        raise SystemExit(
            "error: --prompts, --new and --gen-batch must be positive, "
            f"--gen-prompt in 1..{TrainConfig.seq_len - 1}"
        )
    torch.set_num_threads(args.threads)
    lm = load_model("packaged", "smollm2-135m", dtype=args.dtype, device=args.device)
    engine = Engine(lm.model)
    recipe = TrainConfig()  # the default data recipe: its sequences, after the validation ones
    seqs, _ = build_sequences(
        lm.tokenizer, recipe.seq_len, recipe.sources, recipe.seed, recipe.max_chars_per_source
    )
    first = recipe.validation
    prompts = [s[: args.gen_prompt] for s in seqs[first : first + args.prompts]]
    continuations(engine, prompts[:2], 8, "batched")  # warm-up: first-call allocations, kernel choice
    greedy, base_s = timed(engine, prompts, args.new, "prompt_lookup", 1)
    tokens = len(prompts) * args.new
    print(f"{len(prompts)} prompts of {args.gen_prompt} tokens, {args.new} new tokens each, {args.dtype}\n")
    print("| continuations | seconds | new tokens/s | speedup | equal to greedy | tokens equal |")
    print("|---|---:|---:|---:|---:|---:|")
    print(f"| prompt_lookup (greedy) | {base_s:.1f} | {tokens / base_s:.0f} | 1.00x | all | all |")
    for per_call in args.gen_batch:
        out, secs = timed(engine, prompts, args.new, "batched", per_call)
        same = sum(a == b for a, b in zip(out, greedy, strict=True))
        agree = sum(x == y for a, b in zip(out, greedy, strict=True) for x, y in zip(a, b, strict=True))
        print(
            f"| batched, gen_batch={per_call} | {secs:.1f} | {tokens / secs:.0f} | {base_s / secs:.2f}x "
            f"| {same}/{len(prompts)} | {agree / tokens:.3f} |"
        )


if __name__ == "__main__":
    from benchmarks.output import recorded

    with recorded("bench_longspec_continuations"):
        main()
