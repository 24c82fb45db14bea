"""The cost curve t(B, ctx) of this device: one forward of B query rows over a cache of ctx entries,
measured on a grid, cached per (device, model, dtype, linear, threads), and written as a record.

    flock results/bench/.lock python -m benchmarks.block_cost \\
        [--model smollm2-135m] [--dtype float32] [--linear onednn] [--threads 2] \\
        [--rows 1 2 4 ... 512] [--contexts 256 1024 4096] [--refresh] [--device cuda --cuda-graphs]

With `--cuda-graphs` every forward is replayed from a CUDA graph, as in a `run.cuda_graphs` run: the
curve that prices such runs (a block costs what the power of two it is padded to costs).

The curve is also written beside the benchmark's output (`results/bench/<device>/<cache name>`), where
`make paper` finds it. A cached curve (in `~/.cache/draftless-harness/block_cost/`, or
`$HARNESS_COST_CACHE`; one file per device, model, dtype, linear and threads) is reused unless
`--refresh`; `python -m analysis.cost_model` turns runs' steps tables into predicted speedups with
it. Printed beside the measured cost ratios: the roofline model's ratios for the same model on
A100/H100/H200 (`analysis.cost_model.GPUS`), and the roofline's predictions against the papers' own
(tau, block, speedup) pairs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from analysis.cost_model import GPUS, SHAPES, ModelShape, check_pairs, shape_of
from benchmarks.output import environment, out_dir
from core.cost_curve import (
    CostCurve,
    cache_dir,
    cache_name,
    curve_key,
    fill_cache,
    measure_grid,
    measurement_meta,
    read_cached,
    step_seconds,
    store_curve,
)
from core.engine import Engine
from core.models import load_model
from runners.provenance import device_name

ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
CONTEXTS = (256, 1024, 4096)


def read_bandwidth(mb: int = 1024, reps: int = 5) -> float:
    """Bytes/s this process reads from memory with its threads: the best of `reps` sums over an
    `mb`-MB fp32 tensor (a read-bound reduction: every byte read once, nothing written back)."""
    x = torch.ones(mb * 2**20 // 4)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best


def bandwidth_share(
    eng: Engine, shape: ModelShape, contexts: list[int], nbytes: int, repeats: int = 5
) -> list[dict]:
    """Vanilla decode against this machine's memory-read limit (weights + KV bytes per token / read
    bandwidth), per cache size. The bandwidth of a shared box drifts by tens of percent within minutes,
    so each repeat measures the bandwidth and the step back to back and the share is the median of
    the repeats' own ratios."""
    out = []
    for ctx in contexts:
        fill_cache(eng, ctx, 2)
        step_seconds(eng, ctx, 1, 5)  # warm-up; a 1-row step is vanilla's own (no mask)
        reads = shape.weight_bytes(nbytes) + ctx * shape.kv_bytes_per_entry(nbytes)
        pairs = [(read_bandwidth(reps=3), step_seconds(eng, ctx, 1, 15)) for _ in range(repeats)]
        shares = [reads / bw / step for bw, step in pairs]
        out.append(
            {
                "cache": ctx,
                "mb": reads / 2**20,
                "gb_s": statistics.median(bw for bw, _ in pairs) / 1e9,
                "step_ms": statistics.median(step for _, step in pairs) * 1e3,
                "share": statistics.median(shares),
                "share_min": min(shares),
                "share_max": max(shares),
            }
        )
    return out


def print_bandwidth_share(args: argparse.Namespace, shape: ModelShape) -> None:
    lm = load_model("packaged", args.model, dtype=args.dtype, device=args.device)
    eng = Engine(lm.model, linear=args.linear)
    nbytes = 4 if args.dtype == "float32" else 2
    rows = bandwidth_share(eng, shape, list(args.contexts), nbytes)
    print(
        "\nVanilla decode vs this machine's bandwidth limit (weights + KV bytes per token / memory read "
        "bandwidth; each of 5 repeats measures both back to back, the share is their median ratio):"
    )
    print(
        "| cache | weights + KV MB per token | read GB/s | limit ms | vanilla step ms "
        "| share of the limit (min-max) |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        limit = r["mb"] * 2**20 / (r["gb_s"] * 1e9) * 1e3
        print(
            f"| {r['cache']} | {r['mb']:.0f} | {r['gb_s']:.1f} | {limit:.1f} | {r['step_ms']:.1f} | "
            f"{r['share']:.0%} ({r['share_min']:.0%}-{r['share_max']:.0%}) |"
        )


def curve_for(args: argparse.Namespace, device_name: str) -> tuple[CostCurve, Path, bool]:
    """The cached curve of this environment, or a fresh measurement (then cached)."""
    key = curve_key(device_name, args.model, args.dtype, args.linear, args.threads, graphs=args.cuda_graphs)
    path = cache_dir() / cache_name(key)
    curve, why = (None, "") if args.refresh else read_cached(key)  # checked: its own key, a whole grid
    if curve is not None and curve.rows == list(args.rows) and curve.contexts == list(args.contexts):
        return curve, path, True
    if why:
        print(f"[block_cost] measuring again: {why}")
    lm = load_model("packaged", args.model, dtype=args.dtype, device=args.device)
    linear = args.linear if args.device == "cpu" else "aten"
    eng = Engine(lm.model, linear=linear, cuda_graphs=args.cuda_graphs)
    shape = ModelShape.from_hf_config(lm.model.config)
    seconds = measure_grid(eng, list(args.rows), list(args.contexts), args.reps)
    meta = measurement_meta(args.reps)
    curve = CostCurve(key, list(args.rows), list(args.contexts), seconds, shape.__dict__, meta)
    return curve, store_curve(curve), False


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--linear", default="onednn", choices=["aten", "onednn"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    ap.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--refresh", action="store_true", help="measure again even if a cached curve exists")
    ap.add_argument("--cuda-graphs", action="store_true", help="forwards replayed as CUDA graphs (CUDA only)")
    args = ap.parse_args(argv)
    if args.cuda_graphs and not args.device.startswith("cuda"):
        raise SystemExit("error: --cuda-graphs needs --device cuda")
    if sorted(set(args.rows)) != args.rows or args.rows[0] != 1:
        raise SystemExit("error: --rows must be increasing, distinct and start at 1")
    if sorted(set(args.contexts)) != args.contexts or args.contexts[0] < 1:
        raise SystemExit("error: --contexts must be increasing, distinct and positive")
    torch.set_num_threads(args.threads)
    dev = device_name(torch.device(args.device))
    curve, path, cached = curve_for(args, dev)
    shape = shape_of(curve) or SHAPES.get(args.model)
    print(
        f"# block_cost: {args.model} {args.dtype} on {dev} (linear={curve.key['linear']}"
        f"{', CUDA graphs' if curve.graphed else ''})"
        f", torch {torch.__version__}; curve {'from the cache' if cached else 'measured now'}: {path}\n"
    )
    gpus = list(GPUS)
    for j, ctx in enumerate(curve.contexts):
        print(f"cache {ctx} entries: cost of a B-row forward / a 1-row forward (= tau needed to break even)")
        print("| rows | ms here | here | " + " | ".join(f"{g} (roofline)" for g in gpus) + " |")
        print("|---:|---:|---:|" + "---:|" * len(gpus))
        for i, b in enumerate(curve.rows):
            here = curve.seconds[j][i] / curve.seconds[j][0]
            roof = (
                [GPUS[g].seconds(shape, b, ctx) / GPUS[g].seconds(shape, 1, ctx) for g in gpus]
                if shape
                else []
            )
            cells = " | ".join(f"{r:.2f}" for r in roof)
            print(f"| {b} | {curve.seconds[j][i] * 1e3:.1f} | {here:.2f} | {cells} |")
        print()
    pairs = check_pairs(GPUS["A100-80GB"], SHAPES["llama-2-7b"])
    if len(pairs):
        print("Roofline (A100-80GB, Llama-2-7b fp16, ~600-entry cache) vs the papers' own pairs:")
        print(pairs.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    if args.device == "cpu" and shape is not None:
        print_bandwidth_share(args, shape)
    env = environment()
    print(f"\ncpu flags: {', '.join(env['cpu_flags']) or 'none'}")  # type: ignore[arg-type]
    folder = out_dir(env)
    if folder is not None:  # the curve itself beside the benchmark output: the analysis reads it
        folder.mkdir(parents=True, exist_ok=True)
        (folder / cache_name(curve.key)).write_text(curve.to_json())


if __name__ == "__main__":
    from benchmarks.output import recorded

    with recorded("block_cost"):
        main()
