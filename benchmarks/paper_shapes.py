"""Forwards at the papers' model sizes: a config-only model (`conf/model/shapes/`, random weights built on
the device) timed per forward of B rows over a cache of C entries, eagerly and replayed as CUDA graphs,
beside HF `generate`'s eager ms per token on the same weights; with the peak device memory of each.

    python -m benchmarks.paper_shapes --device cuda --configs conf/model/shapes/llama-2-7b.json \\
        [--rows 1 2 11 57 481] [--contexts 1024 4096 32768] [--modes eager graphed] [--hf-new 32] \\
        [--rows-out rows.csv]

The papers' regime: FAFO, TriForce and SFI ran Llama-2-7B and Llama-3.1-8B at 1k-128k tokens, where a
forward reads 14-16 GB; the rows are a chain's (1, 2), Lookahead's and PLD's blocks (11), a small FAFO
block (57) and FAFO's paper block (481). Every measured point is printed and appended to `--rows-out` as
it is measured, and each mode's curve is written (cost cache and `HARNESS_BENCH_OUT`) after every cache
length, so a run stopped at its time limit keeps what it finished; `analysis.cost_model` prices runs on
those curves. `--modes graphed` on a CPU needs `--graphs-emulate` (the captures emulated as in the tests).
"""

from __future__ import annotations

import argparse
import csv
import gc
import resource
import statistics
import time
from pathlib import Path

import torch

from analysis.cost_model import ModelShape
from benchmarks.output import environment, out_dir
from core.cost_curve import (
    CostCurve,
    cache_name,
    curve_key,
    fill_cache,
    measurement_meta,
    step_times,
    store_curve,
    synchronize,
    synthetic_prompt,
)
from core.engine import Engine
from core.models import load_model
from runners.emulated_graphs import emulate_graphs
from runners.provenance import device_name

ROWS = (1, 2, 11, 57, 481)
CONTEXTS = (1024, 4096, 32768)
FIELDS = ("model", "mode", "rows", "cache", "ms", "peak_gib", "device", "torch")


def peak_gib(device: torch.device) -> float:
    """Peak memory since the last reset: the device's allocator on CUDA, the process's resident set
    on a CPU (which never resets)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


class Rows:
    """Measured points: printed, and appended to a CSV (flushed) as each is measured."""

    def __init__(self, path: Path | None, device_name: str) -> None:
        self.path, self.device_name = path, device_name
        if path is not None and not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w", newline="") as f:
                csv.writer(f).writerow(FIELDS)

    def add(self, model: str, mode: str, rows: int, cache: int, ms: float, peak: float) -> None:
        row = (model, mode, rows, cache, f"{ms:.3f}", f"{peak:.2f}", self.device_name, torch.__version__)
        print(" | ".join(str(c) for c in row), flush=True)
        if self.path is not None:
            with open(self.path, "a", newline="") as f:
                csv.writer(f).writerow(row)


def engine_for(lm, mode: str, emulate: bool) -> Engine:
    graphed = mode == "graphed"
    eng = Engine(lm.model, cuda_graphs=graphed and not emulate)
    if graphed and emulate:
        emulate_graphs(eng)
    return eng


def write_curve(curve: CostCurve, out: Path | None) -> None:
    """The curve into the cost cache and beside the benchmark's output, where the analysis reads it."""
    store_curve(curve)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / cache_name(curve.key)).write_text(curve.to_json())


def time_mode(
    lm, mode: str, args: argparse.Namespace, rows_out: Rows, out: Path | None, dev_name: str
) -> None:
    """One mode's grid, cache length by cache length, its curve rewritten after each."""
    eng = engine_for(lm, mode, args.graphs_emulate)
    key = curve_key(dev_name, lm.name, args.dtype, "aten", torch.get_num_threads(), graphs=mode == "graphed")
    shape = ModelShape.from_hf_config(lm.model.config).__dict__
    done: list[int] = []
    seconds: list[list[float]] = []
    for ctx in args.contexts:
        reset_peak(lm.device)
        try:
            fill_cache(eng, ctx, max(args.rows) + 1)
            line = []
            for rows in args.rows:
                step_times(eng, ctx, rows, 2)  # warm-up (a graph is captured here)
                t = statistics.median(step_times(eng, ctx, rows, args.reps))
                rows_out.add(lm.name, mode, rows, ctx, t * 1e3, peak_gib(lm.device))
                line.append(t)
        except torch.OutOfMemoryError:
            print(
                f"{lm.name} {mode}: out of memory at {ctx} cache entries; longer caches skipped", flush=True
            )
            break
        done.append(ctx)
        seconds.append(line)
        write_curve(CostCurve(key, list(args.rows), done, seconds, shape, measurement_meta(args.reps)), out)
    del eng
    gc.collect()


class _Stamps:
    """A logits processor: called once per new token, right after that token's forward, it notes the time
    (after a device sync), so the gaps between calls are generate's decode steps, its prefill left out."""

    def __init__(self, device: torch.device) -> None:
        self.device, self.times = device, []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        synchronize(self.device)
        self.times.append(time.perf_counter())
        return scores


def hf_generate(lm, args: argparse.Namespace, rows_out: Rows) -> None:
    """HF `generate`'s eager greedy ms per new token after a prompt of each cache length: the median gap
    between its decode steps (the prefill apart, as ours is), after a warm-up generation."""
    from transformers import LogitsProcessorList

    dev = lm.device
    for ctx in args.contexts:
        reset_peak(dev)
        ids = torch.tensor([synthetic_prompt_ids(lm, ctx)], device=dev)
        try:
            with torch.inference_mode():
                for new in (2, args.hf_new):  # a warm-up, then the timed one
                    stamps = _Stamps(dev)
                    lm.model.generate(
                        ids,
                        attention_mask=torch.ones_like(ids),
                        max_new_tokens=new,
                        min_new_tokens=new,
                        do_sample=False,
                        pad_token_id=0,
                        logits_processor=LogitsProcessorList([stamps]),
                    )
        except torch.OutOfMemoryError:
            print(
                f"{lm.name} hf_generate: out of memory at {ctx} cache entries; longer caches skipped",
                flush=True,
            )
            break
        gaps = [b - a for a, b in zip(stamps.times, stamps.times[1:])]
        rows_out.add(lm.name, "hf_generate", 1, ctx, statistics.median(gaps) * 1e3, peak_gib(dev))


def synthetic_prompt_ids(lm, ctx: int) -> list[int]:
    class _Vocab:  # synthetic_prompt reads the vocabulary from an engine's model
        model = lm.model

    return synthetic_prompt(_Vocab, ctx)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--configs", nargs="+", required=True, help="HF config JSONs (conf/model/shapes/)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--rows", type=int, nargs="+", default=list(ROWS))
    ap.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS))
    ap.add_argument("--modes", nargs="+", default=["eager", "graphed"], choices=["eager", "graphed"])
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--hf-new", type=int, default=32, help="HF generate's new tokens (0: not timed)")
    ap.add_argument("--rows-out", type=Path, default=None, help="CSV the measured points are appended to")
    ap.add_argument("--graphs-emulate", action="store_true", help="graphed mode on a CPU (a rehearsal)")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    if "graphed" in args.modes and dev.type != "cuda" and not args.graphs_emulate:
        raise SystemExit("error: --modes graphed needs --device cuda (or --graphs-emulate on a CPU)")
    if sorted(set(args.rows)) != args.rows or args.rows[0] != 1:
        raise SystemExit("error: --rows must be increasing, distinct and start at 1")
    if sorted(set(args.contexts)) != args.contexts or args.contexts[0] < 1:
        raise SystemExit("error: --contexts must be increasing, distinct and positive")
    if args.hf_new == 1 or args.hf_new < 0:
        raise SystemExit("error: --hf-new must be 0 (not timed) or at least 2")
    missing = [c for c in args.configs if not Path(c).is_file()]
    if missing:
        raise SystemExit(f"error: no config file {missing[0]}")

    dev_name = device_name(dev)
    rows_out = Rows(args.rows_out, dev_name)
    out = out_dir(environment())
    print(f"# paper_shapes on {dev_name}, torch {torch.__version__}, {args.dtype}")
    print(" | ".join(FIELDS), flush=True)
    for config in args.configs:
        lm = load_model("config", config, dtype=args.dtype, device=args.device)
        room = lm.context_length - max(args.rows) - 1
        if args.contexts[-1] > room:
            raise SystemExit(f"error: {config} holds {lm.context_length} positions: contexts up to {room}")
        for mode in args.modes:
            time_mode(lm, mode, args, rows_out, out, dev_name)
        if args.hf_new:
            hf_generate(lm, args, rows_out)
        del lm
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
