"""Blocks sized by cost (`decoder.block=auto`) against the fixed settings, on MT-Bench (turn 1,
every category) and GSM8K with SmolLM2 fp32; and the blocks the same configs choose on GPU curves.

    flock results/bench/.lock python -m benchmarks.bench_block_auto \\
        [--mtbench 16] [--gsm8k 8] [--new 128] [--repeats 3] [--threads 2] [--fafo-shares 0.001 0.1 ...]

Protocol: one process, one engine (prepacked oneDNN GEMMs), this environment's cost curve (the
cached one, or measured now on the runtime grid: `core.cost_curve`). Per repeat, each method runs
every prompt of the task in turn, as the runner does, and the repeats rotate which method goes first
(drift of the box then hits each method in a different slot). `benchmarks.forward_prices --order
both` times both orders in one process. Decode time starts when the prefill is done.
`plan`: the (window width / streams, run every n-th step) a block=auto config chose from the curve.
Speedup = Σ vanilla decode time / Σ method decode time over a task's prompts, per repeat; the table
gives the median over repeats and the range. `pred` = the speedup the cost curve predicts from the
blocks the method ran (Σ 1-row step costs of its committed tokens / Σ costs of its forwards): a gap
to the measured one is time spent outside forwards or curve drift. `exact` counts outputs identical
to vanilla's. Per MT-Bench category: each method's median speedup over vanilla. Last: mean and max
block rows the block=auto configs choose when the same generation is priced on roofline GPU curves
(`analysis.cost_model`, Llama-2-7b shape, fp16) instead of this CPU's. `--fafo-shares`: an ablation
that runs vanilla, PLD block=auto and FAFO block=auto at each given generator share instead (output
`bench_block_auto-shares`): how much FAFO's streams add over prompt lookup on this curve.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from analysis.cost_model import GPUS, SHAPES, roofline_cost
from benchmarks.timing import timed_generate
from core.cost_curve import CostCurve, CostFn, cached_or_measured, curve_key
from core.engine import Engine
from core.models import load_model
from core.types import Counts
from decoders.base import BaseDecoder
from decoders.fafo.decoder import FAFO
from decoders.lookahead import Lookahead
from decoders.pld import PromptLookup
from decoders.vanilla import Vanilla
from runners.provenance import device_name
from runners.runner import stop_ids_for

REPO = Path(__file__).resolve().parents[1]
Maker = Callable[[Engine], BaseDecoder]
FAFO_CPU = dict(k=3, n=1, m=3, tree=True, pool_from_prompt=True, pool_capacity=16)  # decoder=fafo_cpu
FAFO_AUTO = dict(k=6, n=40, m=40, tree=True, pool_from_prompt=True, block="auto")  # paper maxima
LOOKAHEAD_AUTO = dict(N=5, W=7, G=7, pool_from_prompt=True, block="auto")


def share_methods(shares: list[float]) -> list[tuple[str, Maker]]:
    """The `--fafo-shares` ablation: FAFO block=auto at each generator share (the streams' average
    cost as a share of a 1-row step) beside vanilla and PLD block=auto: what FAFO's own guesses add
    over prompt lookup on this cost curve."""
    out: list[tuple[str, Maker]] = [
        ("vanilla", lambda e: Vanilla(e)),
        ("pld auto", lambda e: PromptLookup(e, block="auto")),
    ]
    for share in shares:
        name = f"fafo auto, generator share {share:g}"
        out.append((name, lambda e, s=share: FAFO(e, **FAFO_AUTO, generator_share=s)))
    return out


def methods() -> list[tuple[str, Maker]]:
    return [
        ("vanilla", lambda e: Vanilla(e)),
        ("pld", lambda e: PromptLookup(e)),
        ("pld auto", lambda e: PromptLookup(e, block="auto")),
        ("lookahead 5,7,7", lambda e: Lookahead(e, N=5, W=7, G=7)),
        ("lookahead auto (pool_from_prompt)", lambda e: Lookahead(e, **LOOKAHEAD_AUTO)),
        ("fafo_cpu", lambda e: FAFO(e, **FAFO_CPU)),
        ("fafo auto (k6 n<=40 m<=40 tree pool_from_prompt)", lambda e: FAFO(e, **FAFO_AUTO)),
    ]


@dataclass
class Cell:
    decode: float = 0.0
    committed: int = 0
    forwards: int = 0
    rows: int = 0
    max_rows: int = 0
    exact: int = 0
    runs: int = 0
    pred_num: float = 0.0  # Σ cost of 1-row steps for the committed tokens
    pred_den: float = 0.0  # Σ cost of the forwards run
    plan: tuple[int, int] | None = None  # block=auto generator (size, period) of the last generation
    per_category: dict[str, float] = field(default_factory=lambda: defaultdict(float))


def prompts_of(task_name: str, n: int, tokenizer) -> list[tuple[str, list[int]]]:
    """(category, turn-1 prompt ids) of `n` samples, round-robin over the task's categories."""
    cfg = OmegaConf.load(REPO / "conf" / "task" / f"{task_name}.yaml")
    task = instantiate(cfg, limit=n, stratify=True)
    return [(s.category or task_name, task.prompt_ids(s, 0, [], tokenizer)) for s in task.load()]


def curve_here(
    eng: Engine, dev: str, threads: int, max_rows: int, refresh: bool = False
) -> tuple[CostCurve, str]:
    key = curve_key(dev, "smollm2-135m", "float32", eng.linear, threads, graphs=eng.graphs is not None)
    curve, measured = cached_or_measured(eng, key, max_rows, refresh=refresh)
    return curve, "measured now" if measured else "cached"


def priced(steps, prompt_len: int, cost: CostFn) -> tuple[float, float]:
    """(Σ cost of vanilla's 1-row steps for the committed tokens, Σ cost of the forwards run)."""
    ctx, num, den = prompt_len, 0.0, 0.0
    for s in steps:
        den += cost(s.block_tokens, ctx)
        for j in range(s.committed):
            num += cost(1, ctx + j)
        ctx += s.committed
    return num, den


def run_repeat(
    eng: Engine,
    decoders: list[tuple[str, BaseDecoder]],
    prompts,
    new: int,
    stop: set[int],
    cost: CostFn,
    rotation: int = 0,
) -> dict[str, Cell]:
    """One repeat: each method generates every prompt in turn (the runner's order: one decoder over a
    task), starting with method `rotation` of the list, so repeats rotate which method runs first."""
    cells = {name: Cell() for name, _ in decoders}
    outputs: dict[str, list[list[int]]] = {name: [] for name, _ in decoders}
    start = rotation % len(decoders)
    for name, dec in decoders[start:] + decoders[:start]:
        c = cells[name]
        for category, prompt in prompts:
            timed = timed_generate(dec, prompt, new, stop)
            counts = timed.counts
            outputs[name].append(timed.output)
            c.decode += timed.decode_s
            c.per_category[category] += timed.decode_s
            c.committed += counts.committed
            c.forwards += counts.forwards
            c.rows += sum(s.block_tokens for s in counts.steps)
            c.max_rows = max([c.max_rows, *(s.block_tokens for s in counts.steps)])
            c.runs += 1
            c.plan = getattr(dec, "plan", None)
            num, den = priced(counts.steps, len(prompt), cost)
            c.pred_num += num
            c.pred_den += den
    reference = outputs[decoders[0][0]]  # vanilla's
    for name, outs in outputs.items():
        cells[name].exact = sum(o == r for o, r in zip(outs, reference, strict=True))
    return cells


def med_range(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def report(task: str, reps: list[dict[str, Cell]]) -> None:
    names = list(reps[0])
    ref = "pld" if "pld" in names else "pld auto"  # the prompt-lookup column's reference
    print(f"\n### {task}: median over {len(reps)} repeats (range)\n")
    print(
        f"| method | plan | tau | mean rows | max rows | vs vanilla | vs {ref} | pred | pred/meas | exact |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in names:
        cells = [r[name] for r in reps]
        c = cells[0]
        tau = statistics.median(x.committed / x.forwards for x in cells)
        sp = [r["vanilla"].decode / r[name].decode for r in reps]
        vs_pld = [r[ref].decode / r[name].decode for r in reps]
        pred = statistics.median(x.pred_num / x.pred_den for x in cells) if c.pred_den else float("nan")
        print(
            f"| {name} | {c.plan or '-'} | {tau:.2f} | {c.rows / c.forwards:.1f} | {c.max_rows} | "
            f"{med_range(sp)} | "
            f"{med_range(vs_pld)} | {pred:.2f} | {pred / statistics.median(sp):.2f} | {c.exact}/{c.runs} |"
        )
    cats = sorted(reps[0]["vanilla"].per_category)
    if len(cats) > 1:
        print(f"\n{task} per category: median speedup vs vanilla\n")
        print("| method | " + " | ".join(cats) + " | worst |")
        print("|---|" + "---:|" * (len(cats) + 1))
        for name in names[1:]:
            meds = [
                statistics.median(r["vanilla"].per_category[k] / r[name].per_category[k] for r in reps)
                for k in cats
            ]
            print(f"| {name} | " + " | ".join(f"{m:.2f}" for m in meds) + f" | {min(meds):.2f} |")


def gpu_choices(eng: Engine, prompts, new: int, stop: set[int]) -> None:
    """Block rows the auto configs choose when priced on roofline GPU curves (same generations)."""
    print("\n### Blocks chosen by the same block=auto configs on other cost curves (2 prompts)\n")
    print("| curve | method | plan (generator size, every n-th step) | mean rows | max rows | tau |")
    print("|---|---|---|---:|---:|---:|")
    curves = {f"{g} roofline, Llama-2-7b fp16": roofline_cost(GPUS[g], SHAPES["llama-2-7b"]) for g in GPUS}
    for label, cost in curves.items():
        for name, make in methods():
            if "auto" not in name:
                continue
            dec = make(eng)
            dec.use_cost(cost)
            rows = forwards = committed = peak = 0
            for _, prompt in prompts[:2]:
                counts = Counts()
                dec.generate(prompt, new, stop, counts)
                rows += sum(s.block_tokens for s in counts.steps)
                peak = max([peak, *(s.block_tokens for s in counts.steps)])
                forwards, committed = forwards + counts.forwards, committed + counts.committed
            plan = getattr(dec, "plan", "-")
            print(
                f"| {label} | {name} | {plan} | {rows / forwards:.1f} | {peak} | {committed / forwards:.2f} |"
            )


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mtbench", type=int, default=16, help="MT-Bench questions (turn 1), round-robin")
    ap.add_argument("--gsm8k", type=int, default=8)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--fresh-curve",
        action="store_true",
        help="measure the cost curve now (and cache it) instead of reading a cached one: pred/meas then "
        "compares forwards priced at this session's speed, not the speed the box had when it was cached",
    )
    ap.add_argument(
        "--fafo-shares",
        type=float,
        nargs="+",
        help="ablation: run vanilla, pld auto and fafo auto at these generator shares instead of the "
        "method list (written as bench_block_auto-shares)",
    )
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    lm = load_model("packaged", "smollm2-135m", dtype="float32", device="cpu")
    eng = Engine(lm.model, linear="onednn")
    dev = device_name(lm.device)
    stop = stop_ids_for(lm.tokenizer, lm.model)
    chosen = share_methods(args.fafo_shares) if args.fafo_shares else methods()
    decoders = [(name, make(eng)) for name, make in chosen]
    curve, source = curve_here(
        eng, dev, args.threads, max(d.max_block() for _, d in decoders), refresh=args.fresh_curve
    )
    for _, dec in decoders:
        dec.use_cost(curve)
    print(
        f"# bench_block_auto: SmolLM2-135M-Instruct fp32 (linear={eng.linear}), {dev}, "
        f"threads={args.threads}, torch {torch.__version__}; cost curve {source} "
        f"(rows {curve.rows[0]}..{curve.rows[-1]}, contexts {curve.contexts})"
    )
    tasks = {"mtbench": args.mtbench, "gsm8k": args.gsm8k}
    prompts = {t: prompts_of(t, n, lm.tokenizer) for t, n in tasks.items() if n}
    for t, ps in prompts.items():
        print(f"{t}: {len(ps)} prompts, lengths {min(len(p) for _, p in ps)}-{max(len(p) for _, p in ps)}")
    print(f"max_new_tokens {args.new}")
    with torch.inference_mode():
        for _, dec in decoders:  # warm-up: layouts, allocator, kernels
            dec.generate(next(iter(prompts.values()))[0][1], 16, set(), Counts(keep_steps=False))
        results = {
            t: [run_repeat(eng, decoders, ps, args.new, stop, curve, rotation=r) for r in range(args.repeats)]
            for t, ps in prompts.items()
        }
        for t, reps in results.items():
            report(t, reps)
        if not args.fafo_shares:
            gpu_choices(eng, next(iter(prompts.values())), args.new, stop)


def output_name(argv: list[str]) -> str:
    """The committed output's name: the share ablation is kept apart from the main table."""
    shares = build_parser().parse_known_args(argv)[0].fafo_shares
    return "bench_block_auto-shares" if shares else "bench_block_auto"


if __name__ == "__main__":
    import sys

    from benchmarks.output import recorded

    with recorded(output_name(sys.argv[1:]), module="benchmarks.bench_block_auto"):
        main()
