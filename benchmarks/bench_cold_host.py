"""How much the wait for a CPU forward inflates the host work timed right after it.

On a CPU the target's forward runs on the host's own cores and streams the model's weights (540 MB for
SmolLM2-135M in fp32) through the caches. The host work that follows (the decoder's bookkeeping, the
next block's staging, the first operators) then starts with cold caches. `bench_host_overhead`'s CPU
`host ms/forward` includes these refills. Its ratios therefore say how much code and data a decoder
touches between forwards, more than how long that work takes once cached. A GPU's host does not run the
forward; how warm it stays depends on how it waits (by default CUDA spins while the host has a core to
spare), so the GPU run's own `host ms/forward` is the measure that counts there.

This times three pieces of a decode step's host work, each in four settings (median over repeats):
- warm: run again straight after itself;
- after a forward: straight after a one-row decode forward (what `bench_host_overhead` times);
- after sleeping as long as that forward took: whether the forward's sweep or the wait itself cools the
  caches (on a shared VM an idle core loses them too);
- after spinning for `--gpu-wait-ms` (3 ms: a graphed GPU forward of a small model): a GPU host's wait
  for the device, as CUDA spins by default.

Pieces: staging a 64-token block (`torch.tensor` of a list), a walk over 300 n-gram pool entries (Python
dictionaries), and one operator on a small tensor (`x + 1` on 30 longs, like a per-layer count).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from core.attention import CausalView
from core.engine import Engine
from core.models import load_model
from runners.config import resolve_linear


def pieces() -> dict[str, Callable[[], object]]:
    block = list(range(100, 164))
    pool = {(i,): {(i, i + 1, i + 2): None} for i in range(300)}
    small = torch.arange(30)

    def walk() -> int:
        return sum(len(next(iter(pool[(i,)]))) for i in range(300))

    return {
        "stage a 64-token block": lambda: torch.tensor(block),
        "walk 300 pool entries": walk,
        "one small operator": lambda: small + 1,
    }


def micros(work: Callable[[], object]) -> float:
    begun = time.perf_counter_ns()
    work()
    return (time.perf_counter_ns() - begun) / 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--gpu-wait-ms", type=float, default=3.0, help="the spin: a GPU forward's length")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model("packaged", "smollm2-135m", dtype="float32", device="cpu")
    eng = Engine(lm.model, linear=resolve_linear("auto", lm))
    eng.reserve(128)
    with torch.inference_mode():
        eng.prefill(list(range(1, 65)))
        token, position = torch.tensor([7]), torch.tensor([64])

        def forward() -> float:  # one decode row; nothing committed, so every forward has one shape
            begun = time.perf_counter()
            eng.step(token, position, CausalView(eng.scale), argmax=True, with_logits=False)
            return time.perf_counter() - begun

        forward()
        times: dict[str, dict[str, list[float]]] = {}
        forward_s: list[float] = []
        for name, work in pieces().items():
            t = times[name] = {"warm": [], "forward": [], "sleep": [], "spin": []}
            for _ in range(args.repeats):
                work()
                t["warm"].append(micros(work))
                forward_s.append(forward())
                t["forward"].append(micros(work))
                time.sleep(forward_s[-1])
                t["sleep"].append(micros(work))
                until = time.perf_counter() + args.gpu_wait_ms / 1e3
                while time.perf_counter() < until:
                    pass
                t["spin"].append(micros(work))
    print(
        f"# bench_cold_host: SmolLM2-135M float32 on cpu, one-row forward "
        f"{1e3 * statistics.median(forward_s):.1f} ms, threads={args.threads}, median of {args.repeats}\n"
    )
    spin = f"after spinning {args.gpu_wait_ms:g} ms, us"
    columns = f"after a forward, us | x warm | after sleeping, us | x warm | {spin} | x warm"
    print(f"| host work | warm, us | {columns} |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, t in times.items():
        warm, *after = (statistics.median(t[k]) for k in ("warm", "forward", "sleep", "spin"))
        cells = " | ".join(f"{us:.1f} | {us / warm:.1f}" for us in after)
        print(f"| {name} | {warm:.1f} | {cells} |")


if __name__ == "__main__":
    from benchmarks.output import recorded

    with recorded("bench_cold_host"):
        main()
