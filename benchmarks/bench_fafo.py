"""FAFO vs Lookahead, PLD and vanilla on MT-Bench with SmolLM2-135M-Instruct (one run, one table).

    flock results/bench/.lock python -m benchmarks.bench_fafo \\
        [--questions 2] [--new 96] [--dtype float32] [--linear onednn] [--threads 2] \\
        [--only cpu,pld] [--fafo 'k=6 n=1 m=2 tree=true'] [--repeats 3] [--profile]

Methods (paper rows first, then the CPU preset and the layout rows, reported separately):
- vanilla (kv=full), the baseline;
- FAFO-Stream / FAFO-Quest / FAFO-SnapKV: the paper's setting (k 6, n 40, m 40: a 481-token block)
  with kv=streaming / quest / snapkv at the paper's 760-token budget; FAFO-2forward (Table 1);
- Lookahead (README N 5, W 7, G 7) and PLD (HF defaults: 2-gram match, 10 tokens), the baselines;
- FAFO CPU preset (`conf/decoder/fafo_cpu.yaml`: a ~8-row block, prefix-trie candidates, prompt /
  output n-grams in the pool), and a small preset without the prompt pool (the paper's mechanism only);
- layout rows: the same FAFO block (padded to a static shape) at a 128-token streaming budget with
  the dense mask, the compressed region + SDPA on its slice (`sliced`) and the compressed region +
  static compiled FlexAttention block mask (`flex`), so the layout's gain is measured, not assumed.
`--linear onednn` (default) prepacks the weights for oneDNN in every method's engine (aten's MKL
sgemm is 2-3x slower on this AMD CPU); `--linear aten` is the engine's default path.

Protocol (as benchmarks/bench_lookahead.py): the first --questions MT-Bench questions, turn 1 and turn 2
(turn 2 built from fp32 vanilla's turn-1 answer), stop at EOS or --new tokens; one untimed warm-up
generation per method; per prompt every method runs in turn (noise hits all alike); decode time starts
when the prefill is done. speedup = total vanilla time / total method time over the same prompts.
`--repeats R` runs the whole prompt set R times and adds each method's speedup per repeat as median
[min-max], so a difference between two methods can be told from this machine's noise.
Peak memory: the process's peak RSS during the method's generations (VmHWM, reset before each one;
on CUDA the peak allocated), minus the same before any generation (weights, allocator): "extra MB".
`exact` = outputs identical to vanilla's in the same dtype. Timings on a shared 2-core CPU are noisy:
run under flock.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from benchmarks.timing import timed_generate
from core.engine import Engine
from core.models import load_model
from core.types import Counts
from decoders.base import BaseDecoder
from decoders.fafo.decoder import FAFO, FAFO2Forward
from decoders.lookahead import Lookahead
from decoders.pld import PromptLookup
from decoders.vanilla import Vanilla
from kv_policies.registry import build_policy
from runners.timing import peak_memory_mb

Maker = Callable[[Engine], BaseDecoder]
PAPER = dict(k=6, n=40)
CPU = dict(k=3, n=1, m=3, tree=True, pool_from_prompt=True, pool_capacity=16)  # conf/decoder/fafo_cpu.yaml


@dataclass
class Tally:
    name: str
    params: str
    group: str
    wall: float = 0.0
    decode: float = 0.0
    tokens: int = 0
    forwards: int = 0
    committed: int = 0
    block: list[int] = field(default_factory=list)
    exact: int = 0
    runs: int = 0
    peak_mb: float = 0.0
    rep_decode: list[float] = field(default_factory=list)  # decode seconds of each repeat

    @property
    def tau(self) -> float:
        return self.committed / self.forwards if self.forwards else float("nan")

    def speedups(self, base: Tally) -> list[float]:
        """Decode speedup over `base` within each repeat (same prompts, same minutes)."""
        return [b / t for b, t in zip(base.rep_decode, self.rep_decode)]


def fafo(kv: str, budget: int = 760, cls=FAFO, **kw) -> Maker:
    """A FAFO (or FAFO-2forward) maker over `kv` at `budget` (StreamingLLM with 4 sinks)."""
    extra = {"sinks": 4} if kv == "streaming" else {}
    return lambda e: cls(e, kv=build_policy(kv, budget=budget, **extra), **kw)


def methods() -> list[tuple[str, str, str, Maker]]:
    paper = f"k={PAPER['k']} n={PAPER['n']} m={PAPER['n']} budget=760"
    cpu = "k=3 n=1 m=3 tree pool_from_prompt cap=16 budget=760"
    pure = "k=3 n=4 m=4 tree budget=760"
    lay = "k=4 n=6 m=6 padded budget=128"
    out = [
        ("vanilla", "-", "baseline", lambda e: Vanilla(e)),
        ("FAFO-Stream", paper, "paper", fafo("streaming", **PAPER)),
        ("FAFO-Quest", paper, "paper", fafo("quest", **PAPER)),
        ("FAFO-SnapKV", paper, "paper", fafo("snapkv", **PAPER)),
        ("FAFO-2forward", paper + " (Stream)", "paper", fafo("streaming", cls=FAFO2Forward, **PAPER)),
        ("Lookahead", "N=5 W=7 G=7", "baseline", lambda e: Lookahead(e, N=5, W=7, G=7)),
        (
            "PLD",
            "ngram=2 k=10",
            "baseline",
            lambda e: PromptLookup(e, max_matching_ngram_size=2, num_tokens=10),
        ),
        ("FAFO-Stream", cpu + " (fafo_cpu)", "cpu", fafo("streaming", **CPU)),
        ("FAFO-Stream", pure, "cpu", fafo("streaming", k=3, n=4, m=4, tree=True)),
    ]
    for backend in ("dense", "sliced", "flex"):  # the compressed-region layout, measured not assumed
        out.append(
            (
                "FAFO-Stream",
                f"{lay} {backend}",
                "layout",
                fafo("streaming", 128, k=4, n=6, m=6, pad_candidates=True, backend=backend),
            )
        )
    return out


def custom_fafo(spec: str) -> tuple[str, str, str, Maker]:
    """A `--fafo` row from 'key=value ...' (values parsed as int / float / bool / str)."""
    kw: dict = {}
    for item in spec.split():
        key, sep, raw = item.partition("=")
        if not sep:
            raise SystemExit(f"--fafo: expected key=value, got {item!r}")
        low = raw.lower()
        if low in ("true", "false"):
            kw[key] = low == "true"
        else:
            try:
                kw[key] = int(raw)
            except ValueError:
                try:
                    kw[key] = float(raw)
                except ValueError:
                    kw[key] = raw
    kv = kw.pop("kv", "streaming")
    return f"FAFO-{kv}", spec, "custom", fafo(kv, **kw)


def build_prompts(n_questions: int, new: int) -> tuple[list[list[int]], set[int]]:
    """Turn-1 and turn-2 prompt ids (turn 2 sees fp32 vanilla's answer), as bench_lookahead does."""
    from benchmarks.bench_lookahead import build_prompts as shared

    return shared(n_questions, new)


def measure(
    dtype: str,
    chosen: list[tuple[str, str, str, Maker]],
    prompts: list[list[int]],
    new: int,
    stop: set[int],
    profile: bool,
    linear: str = "aten",
    repeats: int = 1,
    device: str = "cpu",
) -> tuple[list[Tally], float]:
    lm = load_model("packaged", "smollm2-135m", dtype=dtype, device=device)
    eng = Engine(lm.model, linear=linear if device == "cpu" else "aten")
    decs = [(Tally(name, params, group), make(eng)) for name, params, group, make in chosen]
    for _, dec in decs:  # warm-up: layouts, allocator, compiled kernels
        dec.generate(prompts[0], 16, stop, Counts(keep_steps=False))
    base_rss = peak_memory_mb(eng.device)
    prof = cProfile.Profile() if profile else None
    with torch.inference_mode():
        for _rep in range(repeats):
            for tally, _ in decs:
                tally.rep_decode.append(0.0)
            for prompt in prompts:
                run_prompt(decs, prompt, new, stop, eng.device, prof)
    if prof is not None:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    return [t for t, _ in decs], base_rss


def run_prompt(
    decs: list[tuple[Tally, BaseDecoder]],
    prompt: list[int],
    new: int,
    stop: set[int],
    device: torch.device,
    prof: cProfile.Profile | None,
) -> None:
    """Every method on one prompt in turn (vanilla first: its output is the reference)."""
    ref = None
    for tally, dec in decs:
        if prof is not None and tally.group != "baseline":
            prof.enable()
        timed = timed_generate(dec, prompt, new, stop)  # resets the peak memory at its start
        if prof is not None:
            prof.disable()
        out, counts = timed.output, timed.counts
        tally.peak_mb = max(tally.peak_mb, peak_memory_mb(device))
        tally.wall += timed.wall_s
        tally.decode += timed.decode_s
        tally.rep_decode[-1] += timed.decode_s
        tally.tokens += len(out)
        tally.forwards += counts.forwards
        tally.committed += counts.committed
        tally.block += [s.block_tokens for s in counts.steps]
        ref = out if ref is None else ref
        tally.exact += out == ref
        tally.runs += 1


def print_table(dtype: str, where: str, tallies: list[Tally], base_rss: float) -> None:
    base = tallies[0]
    print(f"\n### FAFO vs baselines, MT-Bench, SmolLM2-135M-Instruct {dtype}, {where}\n")
    print(
        "| group | method | params | mean block | tau | decode tok/s | wall tok/s | speedup decode | "
        "speedup decode per repeat: median [min-max] | speedup wall | peak MB (+extra) | exact |"
    )
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for t in tallies:
        block = sum(t.block) / len(t.block) if t.block else 0
        print(
            f"| {t.group} | {t.name} | {t.params} | {block:.0f} | {t.tau:.2f} | "
            f"{t.committed / t.decode:.2f} | {t.tokens / t.wall:.2f} | {base.decode / t.decode:.2f} | "
            f"{spread(t.speedups(base))} | {base.wall / t.wall:.2f} | "
            f"{t.peak_mb:.0f} (+{t.peak_mb - base_rss:.0f}) | {t.exact}/{t.runs} |"
        )


def spread(xs: list[float]) -> str:
    """'median [min-max]' of per-repeat values (a single value when there is one)."""
    if len(xs) == 1:
        return f"{xs[0]:.2f}"
    return f"{statistics.median(xs):.2f} [{min(xs):.2f}-{max(xs):.2f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--questions", type=int, default=2)
    ap.add_argument("--new", type=int, default=96)
    ap.add_argument(
        "--dtype", default="float32", help="float32 | bfloat16 (bf16 GEMMs are ~5x slower on AVX2-only CPUs)"
    )
    ap.add_argument(
        "--linear", default="onednn", choices=["aten", "onednn"], help="core.engine.Engine(linear=...)"
    )
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu | cuda (on CUDA the engine's linear is aten)")
    ap.add_argument("--only", default=None, help="comma-separated substrings of 'group method params' to run")
    ap.add_argument(
        "--repeats", type=int, default=1, help="measure every prompt this many times (speedup spread)"
    )
    ap.add_argument("--profile", action="store_true", help="cProfile the FAFO generations")
    ap.add_argument(
        "--fafo",
        action="append",
        default=[],
        metavar="SPEC",
        help="extra FAFO row, e.g. 'k=3 n=1 m=4 tree=true kv=streaming budget=760' (repeatable; "
        "any FAFO keyword, plus kv and budget)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    chosen = methods()
    if args.only:
        keys = [s.strip().lower() for s in args.only.split(",")]
        chosen = [chosen[0]] + [
            m for m in chosen[1:] if any(k in f"{m[2]} {m[0]} {m[1]}".lower() for k in keys)
        ]
    chosen += [custom_fafo(spec) for spec in args.fafo]
    prompts, stop = build_prompts(args.questions, args.new)
    print(
        f"# bench_fafo: torch {torch.__version__}, threads {args.threads}, {len(prompts)} prompts "
        f"(lengths {[len(p) for p in prompts]}), max_new_tokens {args.new}"
    )
    tallies, base_rss = measure(
        args.dtype, chosen, prompts, args.new, stop, args.profile, args.linear, args.repeats, args.device
    )
    if args.device == "cpu":
        print_table(f"{args.dtype}, linear={args.linear}", f"CPU {args.threads} threads", tallies, base_rss)
    else:
        print_table(args.dtype, torch.cuda.get_device_name(args.device), tallies, base_rss)


if __name__ == "__main__":
    from benchmarks.output import recorded

    with recorded("bench_fafo"):
        main()
