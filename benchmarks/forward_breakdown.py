"""Where one vanilla decode forward's time goes, against the memory-bandwidth limit of the same machine.

    python -m benchmarks.forward_breakdown [--threads 2] [--context 512] [--reps 64] [--linear auto]

The engine's one-row greedy step (`Engine.step(..., argmax=True, with_logits=False)`, what vanilla
runs) over a cache of `--context` entries, profiled with `torch.profiler`. Every operator called from
Python (an outermost one: its children's time is inside it) goes to one group: the layers' GEMMs
(QKV, output, gate/up, down projections), the LM head, attention (SDPA or the split kernels), the
KV-cache writes, the norms, and the rest (RoPE, activation, residual adds, embedding, argmax). The
forward's wall time less all operators is dispatch: Python, the profiler's own cost included (so the
unprofiled wall time is printed too, and each group's count of operators, inner ones included: each
carries the profiler's cost).

The limit: a token must read every weight it multiplies by (layers and LM head; the embedding only
one row) and the cache it attends to, once. `sum` over `--probe-mib` of float32 with the same threads
measures the read bandwidth, in the same run; bytes per token / bandwidth = the fastest forward, and
its inverse the tok/s limit.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.block_cost import read_bandwidth
from core.attention import CausalView
from core.cost_curve import fill_cache
from core.engine import Engine, onednn_applies
from core.models import load_model
from runners.provenance import device_name

GROUPS = ("layer GEMMs", "LM head", "attention", "KV write", "norms", "elementwise etc.", "dispatch")
LINEAR_OPS = {"aten::linear", "mkldnn::_linear_pointwise", "aten::addmm", "aten::mm", "aten::matmul"}
ATTENTION_OPS = {
    "aten::scaled_dot_product_attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu",  # what a compiled forward calls
    "aten::softmax",
    "aten::bmm",
    "aten::_softmax",
}
KV_WRITE_OPS = {"aten::copy_", "aten::index_copy_", "aten::index_put_", "aten::slice_scatter"}


def group_of(name: str, shapes: list, vocab: int) -> str:
    if name in LINEAR_OPS:
        # the head's weight [vocab, hidden], or its transpose as a compiled forward passes it
        is_head = any(len(s) == 2 and vocab in s for s in shapes if isinstance(s, list))
        return "LM head" if is_head else "layer GEMMs"
    if name in ATTENTION_OPS:
        return "attention"
    if name in KV_WRITE_OPS:
        return "KV write"
    if name in ("aten::rms_norm", "aten::_fused_rms_norm"):
        return "norms"
    return "elementwise etc."


def bytes_per_token(eng: Engine, context: int) -> int:
    """Weights every token multiplies by (the layers' and the LM head's; the embedding's one row is
    negligible) plus the K and V of `context` cached entries."""
    w = eng.w
    mats = [w.lm_head.weight] + [getattr(lw, n) for lw in w.layers for n in ("wqkv", "wo", "wgu", "wdown")]
    return sum(m.numel() * m.element_size() for m in mats) + context * eng.cache.bytes_per_entry()


def one_step(eng: Engine, tok: torch.Tensor, context: int, view: CausalView) -> None:
    eng.step(tok, eng.positions(context, 1), view, argmax=True, with_logits=False)
    eng.commit([])


COMPILED_GRAPH = "## Call CompiledFxGraph"  # a compiled forward (`--compile`): its fused kernels inside


def is_operator(ev) -> bool:
    """An aten or oneDNN operator (outside a compiled forward, or one it calls: its GEMMs, its SDPA)."""
    return ev is not None and ev.name.startswith(("aten::", "mkldnn::"))


def operators(ev) -> int:
    """An operator event and all the operators it calls (each pays the profiler's own cost)."""
    return 1 + sum(operators(c) for c in ev.cpu_children)


def breakdown(eng: Engine, context: int, reps: int) -> tuple[dict[str, float], dict[str, float], float]:
    """(ms per forward in each group, operators per forward in each group, unprofiled wall ms per
    forward: the lower of the medians before and after the profile)."""
    fill_cache(eng, context, 2)
    view, tok = CausalView(eng.scale), torch.tensor([7])
    unprofiled = [_wall_median(eng, tok, context, view, reps)]
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        t0 = time.perf_counter()
        for _ in range(reps):
            one_step(eng, tok, context, view)
        profiled_wall = (time.perf_counter() - t0) / reps
    per: dict[str, float] = defaultdict(float)
    ops: dict[str, float] = defaultdict(float)
    for ev in prof.events():
        if ev.name.startswith(COMPILED_GRAPH):  # inductor's fused kernels: the graph's own time
            per["elementwise etc."] += ev.self_cpu_time_total / 1e3 / reps
            continue
        if is_operator(ev.cpu_parent) or not is_operator(ev):
            continue  # an outermost operator only: its children's time is inside its own
        group = group_of(ev.name, ev.input_shapes or [], eng.w.vocab_size)
        per[group] += ev.cpu_time_total / 1e3 / reps
        ops[group] += operators(ev) / reps
    per["dispatch"] = max(profiled_wall * 1e3 - sum(per.values()), 0.0)
    # before and after the profile: on a shared machine a busy moment can slow one of the two
    unprofiled.append(_wall_median(eng, tok, context, view, reps))
    return dict(per), dict(ops), min(unprofiled) * 1e3


def _wall_median(eng: Engine, tok: torch.Tensor, context: int, view: CausalView, reps: int) -> float:
    walls = []
    for _ in range(reps):
        t0 = time.perf_counter()
        one_step(eng, tok, context, view)
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=512, help="cached entries the step attends to")
    ap.add_argument("--reps", type=int, default=64)
    ap.add_argument("--linear", choices=("auto", "aten", "onednn"), default="auto")
    ap.add_argument("--probe-mib", type=int, default=1024, help="MiB the bandwidth probe sums")
    ap.add_argument(
        "--compile",
        action="store_true",
        help="the step compiled by inductor (run.compile: aten GEMMs; fused elementwise work)",
    )
    args = ap.parse_args(argv)
    if min(args.threads, args.context, args.reps, args.probe_mib) < 1:
        raise SystemExit("error: --threads, --context, --reps and --probe-mib must be positive")
    torch.set_num_threads(args.threads)
    lm = load_model("packaged", args.model, dtype="float32", device="cpu")
    if args.compile and args.linear == "onednn":
        raise SystemExit("error: --compile compiles aten GEMMs, not prepacked oneDNN ones: use --linear aten")
    auto = "onednn" if onednn_applies(lm.model) and not args.compile else "aten"
    linear = args.linear if args.linear != "auto" else auto
    eng = Engine(lm.model, linear=linear, compiled=args.compile)
    per, ops, wall = breakdown(eng, args.context, args.reps)
    bandwidth = read_bandwidth(args.probe_mib, reps=7)
    need = bytes_per_token(eng, args.context)
    floor_ms = need / bandwidth * 1e3
    where = f"{args.model} float32 on {device_name(eng.device)}, torch {torch.__version__}"
    print(f"# forward_breakdown: {where}")
    how = "compiled (inductor), " if args.compile else ""
    print(
        f"\n{args.threads} threads, {how}linear={linear}, one-row greedy step over {args.context} entries\n"
    )
    print("| group | ms per forward | share | operators per forward |\n|---|---:|---:|---:|")
    total = sum(per.values())
    for g in GROUPS:
        print(f"| {g} | {per.get(g, 0.0):.2f} | {per.get(g, 0.0) / total:.0%} | {ops.get(g, 0.0):.0f} |")
    print(f"| profiled forward | {total:.2f} | 100% | {sum(ops.values()):.0f} |")
    print(
        "\nEach operator, a group's inner ones too, carries the profiler's own few microseconds: a group of "
        "many small operators (F.rms_norm runs ~20 on a CPU) is inflated, and the profiled forward is "
        "slower than the unprofiled one."
    )
    print(f"\nunprofiled forward: {wall:.2f} ms = {1e3 / wall:.1f} tok/s")
    probe = f"sum over {args.probe_mib} MiB, {args.threads} threads"
    print(f"read bandwidth ({probe}): {bandwidth / 1e9:.1f} GB/s")
    print(
        f"bytes per token: {need / 1e6:.0f} MB -> limit {floor_ms:.2f} ms = {1e3 / floor_ms:.1f} tok/s; "
        f"the forward runs at {floor_ms / wall:.0%} of it"
    )


if __name__ == "__main__":
    import sys

    from benchmarks.output import recorded

    with recorded("forward_breakdown-compiled" if "--compile" in sys.argv else "forward_breakdown"):
        main()
