"""One layer's attention as a fixed-shape block runs it, beside variants of its inputs and SDPA backends.

    python -m benchmarks.bench_block_attention --device cuda --dtype bfloat16 [--rows 1 2 16 512] \\
        [--cache 1024]

A graphed forward attends over the whole allocation: `q [1, H, n, d]` (a transposed view of the
block's projections), the cache's `k, v [1, H_kv, C, d]` and a boolean visibility `[1, 1, n, C]`, with
`enable_gqa` (`core.decode_graph.StaticForward.forward`). On a GPU a 2-row block costs far more than a
1-row step (`benchmarks.block_cost --cuda-graphs`). This times that one call at each block size, then
with one thing changed at a time: only the used prefix of the allocation attended, `q` made contiguous,
the mask as additive floats, K/V expanded to every query head instead of `enable_gqa`, and each SDPA
backend forced (the allocation's first half is cached). Microseconds per call: on CUDA each
variant is captured once as a CUDA graph and replayed (GPU time, no launch cost); elsewhere timed
eagerly. `n/a`: the backend refuses those inputs.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SMOLLM2 = {"heads": 9, "kv_heads": 3, "head_dim": 64}
SPAN_STEP = 256
BACKENDS = {
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}


def inputs(rows: int, cache: int, dtype: torch.dtype, device: torch.device, seed: int = 0) -> dict:
    """The tensors one layer's attention gets in a fixed-shape forward of `rows` rows over a `cache`-slot
    allocation whose first half is cached: q as the engine slices it out of the rotated projections."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    H, Hkv, d = SMOLLM2["heads"], SMOLLM2["kv_heads"], SMOLLM2["head_dim"]
    qk = torch.randn(rows, H + Hkv, d, generator=g).to(device, dtype)
    q = qk[:, :H].transpose(0, 1).unsqueeze(0)  # [1, H, n, d], not contiguous when n > 1
    k = torch.randn(1, Hkv, cache, d, generator=g).to(device, dtype)
    v = torch.randn(1, Hkv, cache, d, generator=g).to(device, dtype)
    length = cache // 2
    slot = torch.arange(cache, device=device)
    row = torch.arange(rows, device=device)[:, None]
    visible = (slot < length) | (slot - length <= row) & (slot >= length)  # the cache, then causal
    return {"q": q, "k": k, "v": v, "mask": visible.view(1, 1, rows, cache), "scale": d**-0.5}


def used_span(cache: int, rows: int) -> int:
    """The slots a forward keyed by its span would attend: the cached half and the block, rounded up to
    `SPAN_STEP` slots, at most the allocation."""
    return min(cache, -(-(cache // 2 + rows) // SPAN_STEP) * SPAN_STEP)


def variants(t: dict) -> dict[str, Callable[[], torch.Tensor]]:
    """name -> the call; the first is the forward's own."""
    q, k, v, mask, scale = t["q"], t["k"], t["v"], t["mask"], t["scale"]
    group = q.shape[1] // k.shape[1]
    additive = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
    k_all, v_all = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    qc = q.contiguous()

    def call(q=q, k=k, v=v, m=mask, gqa=True) -> Callable[[], torch.Tensor]:
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=scale, enable_gqa=gqa)

    # what a forward keyed by the span it attends would read instead of the whole allocation
    span = used_span(k.shape[2], q.shape[2])
    out = {
        "as run (bool mask, enable_gqa)": call(),
        "used prefix only": call(k=k[:, :, :span], v=v[:, :, :span], m=mask[..., :span]),
        "q contiguous": call(q=qc),
        "additive float mask": call(m=additive),
        "K/V expanded, no enable_gqa": call(k=k_all, v=v_all, gqa=False),
    }
    for name, backend in BACKENDS.items():
        out[f"{name} backend"] = _forced(call(), backend)
        out[f"{name}, float mask, K/V expanded"] = _forced(
            call(k=k_all, v=v_all, m=additive, gqa=False), backend
        )
    return out


def _forced(fn: Callable[[], torch.Tensor], backend: SDPBackend) -> Callable[[], torch.Tensor]:
    def run() -> torch.Tensor:
        with sdpa_kernel(backend):
            return fn()

    return run


def microseconds(fn: Callable[[], torch.Tensor], reps: int) -> float | None:
    """Median microseconds of one call; None when it raises (a backend that refuses the inputs) or, on
    CUDA, cannot be captured."""
    try:
        out = fn()
    except RuntimeError:
        return None
    if out.device.type != "cuda":
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times) * 1e6
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # warm on the side stream, as a capture wants
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except RuntimeError:  # a backend that runs eagerly but cannot be captured: not what a graph can use
        return None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    graph.replay()
    start.record()
    for _ in range(reps):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def table(rows: list[int], cache: int, dtype: torch.dtype, device: torch.device, reps: int) -> str:
    results = {
        b: {n: microseconds(fn, reps) for n, fn in variants(inputs(b, cache, dtype, device)).items()}
        for b in rows
    }
    names = list(results[rows[0]])
    lines = ["| variant | " + " | ".join(f"{b} rows" for b in rows) + " |", "|---|" + "---:|" * len(rows)]
    for n in names:
        cells = [results[b][n] for b in rows]
        lines.append(f"| {n} | " + " | ".join("n/a" if c is None else f"{c:.1f}" for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 16, 512])
    ap.add_argument("--cache", type=int, default=1024, help="slots of the allocation attended")
    ap.add_argument("--reps", type=int, default=50)
    args = ap.parse_args(argv)
    if sorted(set(args.rows)) != args.rows or args.rows[0] < 1 or args.cache < 2 or args.reps < 1:
        raise SystemExit("error: --rows must be increasing and positive, --cache >= 2, --reps >= 1")
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"# bench_block_attention: SmolLM2 heads (9 query, 3 KV, d 64), {args.dtype} on {where}")
    print(f"\nmicroseconds per layer's attention over {args.cache} slots (x 30 layers per forward)\n")
    print(table(list(args.rows), args.cache, dtype, device, args.reps))
    spans = ", ".join(f"{used_span(args.cache, b)} at {b} rows" for b in args.rows)
    print(f"\nused prefix: {spans} (the cached {args.cache // 2} and the block, to {SPAN_STEP} slots)")


if __name__ == "__main__":
    from benchmarks.output import recorded

    with recorded("bench_block_attention"):
        main()
