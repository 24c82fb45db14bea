"""Does the cost curve price each forward a decoder runs at what it costs? The predictor's inputs.

    flock results/bench/.lock python -m benchmarks.forward_prices [--mtbench 6] [--new 128]

`bench_block_auto` predicts a decoder's speedup from the cost curve: Σ price of vanilla's 1-row
steps / Σ price of the decoder's forwards. This times every `Engine.step` of each decoder on
MT-Bench prompts and prints, per decoder, Σ measured forward time against Σ curve price of the same
(rows, cache length) pairs, and the share of decode time spent outside forwards (drafting, pools,
verification, Python). Both near 1 and near 0 mean the prediction's inputs are right. Last, the
decode speedup over vanilla (the first method) measured here beside the one the curve predicts
(Σ vanilla's forward prices / Σ the method's), and their ratio, which those two columns explain.
`--order both` runs the runner's order (one method over all prompts, then the next) and the
interleaved one (per prompt, every method in turn) in one process, one table each.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

import torch

from benchmarks.bench_block_auto import curve_here, methods, prompts_of
from benchmarks.timing import StepClock, timed_generate
from core.engine import Engine
from core.models import load_model
from core.types import Counts
from runners.provenance import device_name
from runners.runner import stop_ids_for


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mtbench", type=int, default=6)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--order",
        choices=("grouped", "interleaved", "both"),
        default="grouped",
        help="grouped: each method runs all prompts in turn (the runner's order); interleaved: per prompt, "
        "every method in turn; both: one table each, in this process",
    )
    ap.add_argument("--stop", action="store_true", help="stop at the stop tokens (default: --new tokens)")
    args = ap.parse_args(argv)
    if args.mtbench <= 0 or args.new <= 1:
        raise SystemExit("error: --mtbench must be positive and --new above 1")
    torch.set_num_threads(args.threads)
    lm = load_model("packaged", "smollm2-135m", dtype="float32", device="cpu")
    eng = Engine(lm.model, linear="onednn")
    dev = device_name(lm.device)
    decoders = [(name, make(eng)) for name, make in methods()]
    curve, source = curve_here(eng, dev, args.threads, max(d.max_block() for _, d in decoders))
    for _, dec in decoders:
        dec.use_cost(curve)
    prompts = [p for _, p in prompts_of("mtbench", args.mtbench, lm.tokenizer)]
    print(
        f"# forward_prices: SmolLM2-135M-Instruct fp32 (linear={eng.linear}), {dev}, "
        f"threads={args.threads}; cost curve {source}; "
        f"{len(prompts)} MT-Bench prompts x {args.new} new tokens{' (to a stop token)' if args.stop else ''}"
    )
    stop = stop_ids_for(lm.tokenizer, lm.model) if args.stop else set()
    clock = StepClock(eng)
    with torch.inference_mode():
        for _, dec in decoders:
            dec.generate(prompts[0], 16, set(), Counts(keep_steps=False))  # warm-up
        for order in ("grouped", "interleaved") if args.order == "both" else (args.order,):
            tally = run_order(order, decoders, prompts, args.new, stop, clock)
            print(f"\n{order}: " + ORDERS[order] + "\n")
            print_table(tally, curve)


ORDERS = {
    "grouped": "each method runs every prompt in turn (the runner's order)",
    "interleaved": "per prompt, every method in turn",
}


def run_order(order: str, decoders, prompts, new: int, stop: set[int], clock: StepClock) -> dict[str, Tally]:
    """Generate every (method, prompt) pair in `order`; per method, its decode seconds and forwards."""
    pairs = (
        [(d, p) for d in decoders for p in prompts]
        if order == "grouped"
        else [(d, p) for p in prompts for d in decoders]
    )
    tally = {name: Tally() for name, _ in decoders}
    for (name, dec), p in pairs:
        # the forwards logged after the prefill's end are the decode forwards
        timed = timed_generate(dec, p, new, stop, keep_steps=False, on_prefill_done=clock.mark)
        t = tally[name]
        t.decode += timed.decode_s
        t.steps += clock.calls[clock.marked_at :]
    return tally


def print_table(tally: dict[str, Tally], curve) -> None:
    """Per method: forward time against curve price, time outside forwards, and the decode speedup over
    the first method (vanilla) measured beside the one its prices predict."""
    print(
        "| method | forwards | Σ forward s | Σ curve price s | measured / price | outside forwards "
        "| decode speedup | predicted | pred / meas |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    base = next(iter(tally.values()))
    base_price = sum(curve(rows, ctx) for rows, ctx, _ in base.steps)
    for name, t in tally.items():
        spent = sum(c[2] for c in t.steps)
        price = sum(curve(rows, ctx) for rows, ctx, _ in t.steps)
        measured, predicted = base.decode / t.decode, base_price / price
        print(
            f"| {name} | {len(t.steps)} | {spent:.2f} | {price:.2f} | {spent / price:.3f} | "
            f"{max(t.decode - spent, 0.0) / t.decode:.1%} | {measured:.2f} | {predicted:.2f} | "
            f"{predicted / measured:.2f} |"
        )


@dataclass
class Tally:
    decode: float = 0.0  # seconds from the end of each prefill to the end of its generation
    steps: list = field(default_factory=list)  # (rows, cache length, seconds) per decode forward


if __name__ == "__main__":
    from benchmarks.output import recorded

    with recorded("forward_prices"):
        main()
