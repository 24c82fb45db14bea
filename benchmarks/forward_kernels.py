"""Where a fixed-shape forward's device time goes, kernel by kernel, as its block grows.

    python -m benchmarks.forward_kernels --device cuda --dtype bfloat16 [--rows 1 2 16 512] [--context 1024]

The forward a `run.cuda_graphs` run replays, run through its eager twin (the graph records the same
kernels), profiled at each block size over a cache of `--context` entries. Printed: each kernel's device
microseconds per forward at every block size, the kernels that grow the most first, and the forward's
wall milliseconds, each synchronised, beside them. On a CPU the rows are the operators' own CPU time.

The graphed cost curve (`benchmarks.block_cost --cuda-graphs`) says what a block costs; this says which
kernels make the difference between a 1-row step and a block.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from core.cost_curve import fill_cache, step_times
from core.engine import Engine
from core.models import load_model
from runners.provenance import device_name

NAME_CHARS = 70  # kernel names run to hundreds of characters of template arguments


def kernel_times(eng: Engine, context: int, rows: int, reps: int) -> tuple[dict[str, float], float]:
    """(microseconds per forward of each kernel, or each operator on a CPU; median wall ms per forward)
    of `reps` causal `rows`-row steps over the engine's `context`-entry cache, after three unprofiled."""
    step_times(eng, context, rows, 3)  # shapes seen once (kernel choice, allocator) before the profile
    on_gpu = eng.device.type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_gpu else [])]
    with profile(activities=activities) as prof:
        wall = step_times(eng, context, rows, reps)
    per: dict[str, float] = defaultdict(float)
    for ev in prof.key_averages():
        us = ev.self_device_time_total if on_gpu else ev.self_cpu_time_total
        is_kernel = ev.device_type.name == "CUDA" if on_gpu else ev.key.startswith("aten::")
        if is_kernel and us > 0:
            per[ev.key[:NAME_CHARS]] += us / reps
    return dict(per), statistics.median(wall) * 1e3


def table(eng: Engine, rows: list[int], context: int, reps: int, top: int) -> str:
    """Markdown: the `top` kernels by their growth from the fewest rows to the most, one column per
    block size, then every kernel's total and the forward's wall time."""
    fill_cache(eng, context, max(rows) + 1)
    runs = {b: kernel_times(eng, context, b, reps) for b in rows}
    names = set().union(*(per for per, _ in runs.values()))
    growth = {n: runs[rows[-1]][0].get(n, 0.0) - runs[rows[0]][0].get(n, 0.0) for n in names}
    shown = sorted(names, key=lambda n: (-growth[n], n))[:top]
    head = "| kernel | " + " | ".join(f"{b} rows" for b in rows) + " |"
    lines = [head, "|---|" + "---:|" * len(rows)]
    for n in shown:
        lines.append(f"| `{n}` | " + " | ".join(f"{runs[b][0].get(n, 0.0):.1f}" for b in rows) + " |")
    lines.append("| all kernels | " + " | ".join(f"{sum(runs[b][0].values()):.1f}" for b in rows) + " |")
    lines.append("| forward wall ms | " + " | ".join(f"{runs[b][1]:.2f}" for b in rows) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a packaged model, or a config file (.json)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 16, 512])
    ap.add_argument("--context", type=int, default=1024)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--top", type=int, default=15, help="kernels shown (those that grow the most)")
    args = ap.parse_args(argv)
    if sorted(set(args.rows)) != args.rows or args.rows[0] < 1:
        raise SystemExit("error: --rows must be increasing, distinct and positive")
    if args.context < 1 or args.reps < 1:
        raise SystemExit("error: --context and --reps must be positive")
    torch.set_num_threads(args.threads)
    # a config file (conf/model/shapes/) builds that model with random weights: the papers' sizes
    source = "config" if args.model.endswith(".json") else "packaged"
    lm = load_model(source, args.model, dtype=args.dtype, device=args.device)
    eng = Engine(lm.model, linear="onednn" if args.device == "cpu" and args.dtype == "float32" else "aten")
    eng.use_graphs(capture=False)  # the fixed-shape forwards, run as the graphs replay them
    unit = "device" if eng.device.type == "cuda" else "CPU"
    where = f"{args.model} {args.dtype} on {device_name(eng.device)}, torch {torch.__version__}"
    print(f"# forward_kernels: {where}\n")
    print(f"{unit} microseconds per fixed-shape forward over {args.context} entries ({args.reps} reps)\n")
    print(table(eng, list(args.rows), args.context, args.reps, args.top))
    print(f"\nfixed-shape forwards: {eng.fixed_shape_steps} (every step profiled took that path)")


if __name__ == "__main__":
    from benchmarks.output import recorded

    with recorded("forward_kernels"):
        main()
