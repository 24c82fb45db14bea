"""What one forward of a B-token block costs relative to a 1-token (vanilla) step, on this machine.

    flock results/bench/.lock python -m benchmarks.bench_block_cost \\
        [--model smollm2-135m] [--dtype float32] [--linear onednn] [--threads 2] [--context 400]

Every draftless decoder trades rows for tokens: a step over B rows commits tau tokens, so its
speedup over vanilla is about tau / cost(B), where cost(B) = time(B-row step) / time(1-row step).
On a GPU cost(B) stays near 1 up to hundreds of rows (memory-bound); on a small CPU every row adds
real compute, which decides what a CPU preset can afford (see conf/decoder/fafo_cpu.yaml). This
prints cost(B) for a causal block over a `--context`-token cache (median of --reps, two passes, the
second reported), the marginal cost per row from a least-squares line, and the tau each B needs to
break even and to reach 1.3x. `--sdpa-column` also times every block with the few-rows attention path
off (`core.attention.few_rows_attention`, which serves 2..10 rows over a cache of 2048+ float32 CPU
entries; masked SDPA instead), each block size's two paths in turn, so their ratio comes from one run.
"""

from __future__ import annotations

import argparse
import statistics
from contextlib import contextmanager

import torch

import core.attention
from core.cost_curve import step_seconds
from core.engine import Engine
from core.models import load_model

ROWS = (1, 2, 4, 6, 8, 10, 12, 16, 24, 32, 48, 64)
DEFAULT_CONTEXT = 400


@contextmanager
def few_rows_path_off():
    """Every block goes to masked SDPA, as before `few_rows_attention` existed (benchmark only)."""
    saved = core.attention.FEW_ROWS_MAX
    core.attention.FEW_ROWS_MAX = 1
    try:
        yield
    finally:
        core.attention.FEW_ROWS_MAX = saved


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--linear", default="onednn", choices=["aten", "onednn"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=DEFAULT_CONTEXT)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--sdpa-column", action="store_true", help="also time each block with masked SDPA")
    return ap.parse_args()


def main(args: argparse.Namespace) -> None:
    torch.set_num_threads(args.threads)
    lm = load_model("packaged", args.model, dtype=args.dtype, device=args.device)
    linear = args.linear if args.device == "cpu" else "aten"
    eng = Engine(lm.model, linear=linear)
    eng.reset(args.context + max(ROWS) + 1)
    eng.prefill(list(range(100, 100 + args.context)))
    secs: dict[int, float] = {}
    sdpa_secs: dict[int, float] = {}
    for _ in range(2):  # the first pass warms allocator and kernels
        for b in ROWS:
            secs[b] = step_seconds(eng, args.context, b, args.reps)
            if args.sdpa_column:
                with few_rows_path_off():
                    sdpa_secs[b] = step_seconds(eng, args.context, b, args.reps)
    base = secs[1]
    xs, ys = list(secs), [secs[b] / base for b in secs]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    print(
        f"# bench_block_cost: {args.model} {args.dtype} on {args.device} (linear={linear}, "
        f"{args.threads} threads), cache {args.context} tokens, torch {torch.__version__}\n"
    )
    extra = " ms / step, masked SDPA | few-rows path speedup |" if args.sdpa_column else ""
    print("| block rows | ms / step | cost vs 1 row (= tau to break even) | tau for 1.3x |" + extra)
    print("|---:|---:|---:|---:|" + ("---:|---:|" if args.sdpa_column else ""))
    for b, s in secs.items():
        c = s / base
        cells = f" {sdpa_secs[b] * 1e3:.1f} | {sdpa_secs[b] / s:.2f} |" if args.sdpa_column else ""
        print(f"| {b} | {s * 1e3:.1f} | {c:.2f} | {1.3 * c:.2f} |" + cells)
    print(f"\nmarginal cost per extra row (least squares): {slope:.3f} of a 1-row step")


if __name__ == "__main__":
    from benchmarks.output import recorded

    args = parse_args()
    # another cache length: its own output file
    name = "bench_block_cost" if args.context == DEFAULT_CONTEXT else f"bench_block_cost-ctx{args.context}"
    with recorded(name, module="benchmarks.bench_block_cost"):
        main(args)
