"""What each decoder x KV policy of the paper experiments costs besides its forwards, at a small CPU size.

    flock results/bench/.lock python -m benchmarks.bench_host_overhead \\
        [--questions 2] [--new 64] [--repeats 3] [--count-new 32] [--threads 1] [--only fafo+streaming ...]
        [--device cuda --dtype bfloat16 --cuda-graphs --scale paper] [--long [--context 2048]] [--fixed-shape]

Per decoder/policy (SmolLM2-135M, by default fp32 on the CPU; `--scale cpu`: each experiment's decoder
settings, KV budgets at 10% of the context, FAFO at its CPU size; `--scale paper`: the papers' decoder
settings and absolute budgets; the first MT-Bench questions, turn 1): the counters every
run record carries (`runners.records.host_counters`):
- static_frac: share of decode target forwards that took, or with `run.cuda_graphs` would take, the
  fixed-shape path (core/decode_graph.py);
- syncs/step: host-device synchronisations per decode step (runners/host_syncs.py), counted in untimed
  generations of the same prompts up to --count-new tokens (as the runner's `run.count_syncs`);
- launches/step: operators on device tensors per decode step outside the target's and the draft
  model's forwards, counted in the same generations (views excluded): the decoder's own kernel
  launches on a GPU. On a CPU they run on the host and are part of host ms; on a GPU they are queued
  without waiting (a few microseconds of launch each), so this tells device work from bookkeeping;
- graph launches/step (`--fixed-shape`, `--cuda-graphs`): what a decode step launches with CUDA graphs
  on, counted on the fixed-shape forwards run eagerly: one per graph replayed (target and draft), the
  operators that stage their buffers, and the decoder's own (`runners.host_syncs.graph_bodies_apart`);
- host ms/forward: decode seconds outside the target's and the draft model's forwards, per decode target
  forward, summed over the prompts (on CUDA, where forwards are timed by events, the device's idle
  time); `x vanilla` is its ratio to vanilla's in the same repeat;
- critical ms/forward: the part of host ms a GPU would wait for (`runners.critical_path`): host work after
  a step's read of the device until the next forward; work queued between a forward and its read runs
  while a GPU computes. On a CPU both are serial, so host ms is their sum with the overlapped part;
  `x vanilla` again within each repeat.
`--temperature T` (with `--top-p`): every method samples, each from its own seeded sampler; `exact`
is then not asked. Its syncs are counted with the sampled checks gathering as a GPU's do, its host ms
timed as a CPU runs them (`decoders.sampled_verify.gathers`).
Timed like the runner (`runners.timing`): every method runs on every prompt in turn within a repeat (so
background load hits all alike); the medians over repeats are printed. `exact` counts outputs identical
to vanilla's (expected for lossless methods only). `sites` lists where the syncs come from.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from core.engine import Engine
from core.models import load_model
from core.sampling import Sampler
from core.types import Counts
from decoders import sampled_verify
from decoders.base import BaseDecoder
from decoders.draft_model import build_draft
from runners.config import build, resolve_linear, stop_ids_for
from runners.host_syncs import HostSyncs, forwards_apart, graph_bodies_apart
from runners.schemas import register_schemas
from runners.timing import DecodeClocks, timed_generate
from tasks.mtbench import MTBench
from tasks.pg19 import PG19

REPO = Path(__file__).resolve().parents[1]
# (decoder, kv, overrides) of the experiments in conf/experiment/ on this model (decoder=triforce brings
# its default draft, the layer-truncated self-draft); block=auto variants and sweeps of one setting
# omitted. FAFO at the CPU size conf/experiment/fafo_table1.yaml names (its paper setting's 481-row
# blocks take a second per forward here); kvpress with a press that scores MT-Bench's short prompts.
FAFO_CPU = ("decoder.k=4", "decoder.n=6", "decoder.m=6")
COMBOS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("vanilla", "full", ()),
    ("pld", "full", ()),
    ("lookahead", "full", ()),
    ("fafo", "streaming", FAFO_CPU),
    ("fafo", "quest", FAFO_CPU),
    ("fafo", "snapkv", FAFO_CPU),
    ("fafo", "h2o", FAFO_CPU),
    ("fafo_2forward", "streaming", FAFO_CPU),
    ("longspec", "full", ()),
    ("selfspec", "streaming", ()),
    ("selfspec", "retrieval", ()),
    ("triforce", "retrieval", ()),
    ("sfi", "sfi_ctx20", ()),
    ("vanilla", "kvpress", ("kv.press=StreamingLLMPress",)),
)

# `--long`: the long-context experiments (PG-19 windows of --context tokens, the package's stand-in
# offline): self-speculation and TriForce over retrieval and SFI on the compressed-region backend
# (triforce_figure6a/6b, triforce_table8a/8b, sfi_figure4: kv.backend=sliced) and on the dense one
# (triforce_table1: retrieval and the Top-K oracle, first two layers full)
LONG_COMBOS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("vanilla", "full", ()),
    ("selfspec", "retrieval", ("kv.backend=sliced", "kv.budget_frac=0.034")),
    ("triforce", "retrieval", ("kv.backend=sliced", "kv.budget_frac=0.034")),
    ("sfi", "sfi_ctx20", ("kv.backend=sliced",)),
    ("selfspec", "retrieval", ("kv.budget_frac=0.04", "kv.dense_layers=2")),
    ("selfspec", "topk", ("kv.budget_frac=0.04", "kv.dense_layers=2")),
)


@dataclass
class Method:
    decoder: str
    kv: str
    dec: BaseDecoder
    host_ms: list[float] = field(default_factory=list)  # per repeat
    critical_ms: list[float] = field(default_factory=list)  # per repeat: host ms a GPU would wait for
    forward_ms: list[float] = field(default_factory=list)
    static: list[float] = field(default_factory=list)  # per timed generation
    forwards: int = 0
    committed: int = 0
    exact: int = 0
    outputs: list[list[int]] = field(default_factory=list)
    syncs: float = float("nan")
    launches: float = float("nan")  # device operators per step outside the forwards (GPU: kernel launches)
    graph_launches: float = float("nan")  # with graphs: replays + staging + the decoder's own operators
    sites: list[tuple[str, float]] = field(default_factory=list)  # (where, syncs per decode step)
    backend: str = ""  # a KV backend other than the configured one, named in the table
    draft_static: list[float] = field(default_factory=list)  # per timed generation, with a draft model

    @property
    def name(self) -> str:
        return f"{self.decoder}+{self.kv}" + (f"/{self.backend}" if self.backend else "")


def make_decoder(
    decoder: str,
    kv: str,
    extra_overrides: tuple[str, ...],
    lm,
    eng: Engine,
    scale: str = "cpu",
    sampler: Sampler | None = None,
) -> BaseDecoder:
    """The decoder the runner would build for `decoder=<decoder> kv=<kv> scale=<scale> <extra_overrides>`
    (greedy unless `sampler` samples)."""
    overrides = [f"decoder={decoder}", f"kv={kv}", f"scale={scale}", "model=smollm2-135m", *extra_overrides]
    register_schemas()
    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    factory = build(cfg.decoder, "decoder")
    needs = getattr(factory, "func", factory).needs
    extra: dict = {"tokenizer": lm.tokenizer} if "tokenizer" in needs else {}
    if "draft" in needs:
        extra["draft"] = build_draft(cfg.get("draft"), lm, eng)
    return factory(engine=eng, kv=build(cfg.kv, "kv"), sampler=sampler or Sampler(), **extra)


def pair_options(ap: argparse.ArgumentParser) -> None:
    """The options that choose the pairs and the prompts, shared with `bench_warm_host`."""
    ap.add_argument("--questions", type=int, default=2, help="MT-Bench questions (turn 1)")
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument(
        "--scale", default="cpu", choices=("cpu", "paper"), help="cpu: FAFO at its CPU size, budgets at 10%%"
    )
    ap.add_argument("--only", nargs="*", default=None, help="decoder+kv names (vanilla+full always runs)")


def forward_options(ap: argparse.ArgumentParser) -> None:
    """Which forwards a decode step takes, shared with `profile_decoder`."""
    ap.add_argument("--cuda-graphs", action="store_true", help="fixed-shape forwards replayed as CUDA graphs")
    ap.add_argument(
        "--fixed-shape",
        action="store_true",
        help="the fixed-shape forwards run eagerly (the views a run with graphs takes, on any device)",
    )


def take_fixed_shape(eng: Engine, args: argparse.Namespace) -> None:
    """`--fixed-shape` without `--cuda-graphs` (which the engine was built with): the eager twin."""
    if args.fixed_shape and not args.cuda_graphs:
        eng.use_graphs(capture=False)


def forward_mode(args: argparse.Namespace) -> str:
    """The forwards `forward_options` chose, for a table's header (empty: the eager path)."""
    return "CUDA graphs" if args.cuda_graphs else "fixed-shape forwards" if args.fixed_shape else ""


def chosen_combos(
    every: tuple[tuple[str, str, tuple[str, ...]], ...], only: list[str] | None, scale: str
) -> list[tuple[str, str, tuple[str, ...]]]:
    """The `--only` pairs of `every` (its first, vanilla, always), with the experiments' own decoder
    settings (FAFO's CPU size dropped) at a scale other than `cpu`."""
    combos = [c for c in every if only is None or c == every[0] or f"{c[0]}+{c[1]}" in only]
    if scale != "cpu":
        combos = [(d, k, tuple(e for e in extra if e not in FAFO_CPU)) for d, k, extra in combos]
    return combos


def warm_up(decoders: list[BaseDecoder], prompts: list[list[int]], new: int, stop: set[int]) -> None:
    """Their engine's cache reserved for the longest prompt, then a short generation of each decoder
    (layouts, allocator, kernels) before anything is timed."""
    decoders[0].engine.reserve(max(len(p) for p in prompts) + new + 512)
    for dec in decoders:
        dec.generate(prompts[0], 8, stop, Counts(keep_steps=False))


def backend_of(overrides: tuple[str, ...]) -> str:
    """The KV backend an override sets (empty: the policy's configured one)."""
    return next((o.split("=", 1)[1] for o in overrides if o.startswith("kv.backend=")), "")


def count_syncs(m: Method, prompts: list[list[int]], new: int, stop: set[int]) -> None:
    """Syncs per decode step over every prompt and where they come from, in untimed generations (the
    counter slows every operator); sampled checks gather as on a GPU (`sampled_verify.gathers`)."""
    gather, sampled_verify.GATHER_ON_CPU = sampled_verify.GATHER_ON_CPU, True
    try:
        _count_syncs(m, prompts, new, stop)
    finally:
        sampled_verify.GATHER_ON_CPU = gather


def _count_syncs(m: Method, prompts: list[list[int]], new: int, stop: set[int]) -> None:
    syncs = HostSyncs(m.dec.engine.device, trace=True)
    assert syncs.sites is not None
    decode_sites: Counter[str] = Counter()
    total = steps = launches = 0
    for prompt in prompts:
        syncs.sites.clear()
        start = lambda: (syncs.mark(), syncs.sites.clear())  # noqa: E731
        counts = Counts(on_prefill_done=start, keep_steps=False, on_decode_done=syncs.stop)
        with syncs, forwards_apart(syncs, m.dec):
            m.dec.generate(prompt, new, stop, counts)
        total, steps = total + syncs.since_mark, steps + counts.forwards
        launches += syncs.launches_since_mark
        decode_sites.update(syncs.sites)
    m.syncs = total / steps
    m.launches = launches / steps
    if m.dec.engine.graphs is not None:
        m.graph_launches = count_graph_launches(m, prompts, new, stop)
    m.sites = [(site, n / steps) for site, n in decode_sites.most_common()]


def count_graph_launches(m: Method, prompts: list[list[int]], new: int, stop: set[int]) -> float:
    """Kernel launches per decode step with CUDA graphs on (each graph replay one, its staging and the
    decoder's own operators the others), in untimed generations on the fixed-shape forwards."""
    probe = HostSyncs(m.dec.engine.device)
    launches = steps = 0
    for prompt in prompts:
        counts = Counts(on_prefill_done=probe.mark, keep_steps=False, on_decode_done=probe.stop)
        with probe, graph_bodies_apart(probe):
            m.dec.generate(prompt, new, stop, counts)
        launches, steps = launches + probe.launches_since_mark, steps + counts.forwards
    return launches / steps


def time_repeat(methods: list[Method], prompts: list[list[int]], new: int, stop: set[int]) -> None:
    host = {m.name: 0.0 for m in methods}
    critical = {m.name: 0.0 for m in methods}
    fwd_s = {m.name: 0.0 for m in methods}
    n_fwd = {m.name: 0 for m in methods}
    for prompt in prompts:
        for m in methods:
            with DecodeClocks(m.dec) as clocks:
                timed = timed_generate(m.dec, prompt, new, stop, on_prefill_done=clocks.mark)
            clock, drafts = clocks.forwards, clocks.drafts
            host[m.name] += clocks.host_s(timed)
            critical[m.name] += clocks.critical_s(timed)
            fwd_s[m.name] += clock.seconds_since_mark
            n_fwd[m.name] += clock.forwards_since_mark
            m.static.append(clock.static_frac_since_mark)
            m.draft_static.append(drafts.static_frac_since_mark)
            m.forwards += timed.counts.forwards
            m.committed += timed.counts.committed
            m.outputs.append(timed.output)
            m.exact += timed.output == methods[0].outputs[-1]  # vanilla runs first
    for m in methods:
        m.host_ms.append(1e3 * host[m.name] / n_fwd[m.name])
        m.critical_ms.append(1e3 * critical[m.name] / n_fwd[m.name])
        m.forward_ms.append(1e3 * fwd_s[m.name] / n_fwd[m.name])


def print_table(methods: list[Method], repeats: int, sampled: bool = False) -> None:
    base = methods[0]
    graphs = base.dec.engine.graphs is not None
    print(
        "| decoder | kv | tau | static_frac | draft static | syncs/step | launches/step "
        f"{'| graph launches/step ' if graphs else ''}| host ms/forward "
        "| x vanilla | critical ms/forward | x vanilla | forward ms | exact |"
    )
    print("|---|---|" + "---:|" * (11 + graphs))
    for m in methods:
        ratio = statistics.median(h / b for h, b in zip(m.host_ms, base.host_ms, strict=True))
        crit = statistics.median(c / b for c, b in zip(m.critical_ms, base.critical_ms, strict=True))
        drafts = [x for x in m.draft_static if x == x]  # NaN: no draft model forward
        draft = f"{statistics.mean(drafts):.3f}" if drafts else "-"
        kv = m.kv + (f" ({m.backend})" if m.backend else "")
        print(
            f"| {m.decoder} | {kv} | {m.committed / m.forwards:.2f} | {statistics.mean(m.static):.3f} | "
            f"{draft} | {m.syncs:.2f} | {m.launches:.0f} | "
            + (f"{m.graph_launches:.1f} | " if graphs else "")
            + f"{statistics.median(m.host_ms):.2f} | "
            f"{ratio:.2f} | {statistics.median(m.critical_ms):.2f} | {crit:.2f} | "
            f"{statistics.median(m.forward_ms):.1f} | {'-' if sampled else f'{m.exact}/{len(m.outputs)}'} |"
        )
    print(f"\nmedians over {repeats} repeats; x vanilla: median of the per-repeat ratios")


def print_sites(methods: list[Method], top: int) -> None:
    print("\nwhere the syncs come from (per decode step, the most frequent):\n")
    for m in methods:
        sites = "; ".join(f"{n:.2f} {site}" for site, n in m.sites[:top]) or "none"
        print(f"- {m.name}: {sites}")


def sampler_of(args: argparse.Namespace) -> Sampler | None:
    """`--temperature > 0`: a sampler of each method's own (seed 0); else greedy (None)."""
    return Sampler(args.temperature, args.top_p) if args.temperature > 0 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    pair_options(ap)
    ap.add_argument(
        "--count-new", type=int, default=32, help="new tokens of the sync-counting runs (run.count_syncs)"
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    forward_options(ap)
    ap.add_argument("--sites", type=int, default=3, help="sync sites listed per method (0: none)")
    ap.add_argument("--long", action="store_true", help="the long-context experiments (LONG_COMBOS)")
    ap.add_argument("--context", type=int, default=2048, help="--long: prompt tokens (PG-19 windows)")
    ap.add_argument("--temperature", type=float, default=0.0, help="> 0: every method samples (seed 0)")
    ap.add_argument("--top-p", type=float, default=1.0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lm = load_model("packaged", "smollm2-135m", dtype=args.dtype, device=args.device)
    eng = Engine(lm.model, linear=resolve_linear("auto", lm), cuda_graphs=args.cuda_graphs)
    take_fixed_shape(eng, args)
    stop = stop_ids_for(lm.tokenizer, lm.model)
    task = (
        PG19(limit=args.questions, context_length=args.context)
        if args.long
        else MTBench(limit=args.questions)
    )
    samples = task.load()
    prompts = [task.prompt_ids(s, 0, [], lm.tokenizer) for s in samples]
    combos = chosen_combos(LONG_COMBOS if args.long else COMBOS, args.only, args.scale)
    sampled = args.temperature > 0
    methods = [
        Method(
            d, k, make_decoder(d, k, extra, lm, eng, args.scale, sampler_of(args)), backend=backend_of(extra)
        )
        for d, k, extra in combos
    ]
    source = samples[0].meta.get("source", "?") if samples else "?"
    prompt_set = f"PG-19 windows ({source}) x" if args.long else "MT-Bench turn 1 x"
    print(
        f"# bench_host_overhead: SmolLM2-135M {args.dtype} on {args.device} "
        f"({', '.join(filter(None, (eng.linear, forward_mode(args))))}), "
        f"scale={args.scale}, {prompt_set} "
        f"{len(prompts)} (lengths {[len(p) for p in prompts]}), {args.new} new tokens, "
        f"threads={args.threads}, torch {torch.__version__}"
        + (f", sampling (temperature {args.temperature}, top-p {args.top_p})" if sampled else "")
        + "\n"
    )
    warm_up([m.dec for m in methods], prompts, args.new, stop)
    for _ in range(args.repeats):
        time_repeat(methods, prompts, args.new, stop)
    for m in methods:
        count_syncs(m, prompts, min(args.count_new, args.new), stop)
    print_table(methods, args.repeats, sampled)
    print("overrides: " + "; ".join(f"{d}+{k}: {' '.join(e)}" for d, k, e in combos if e))
    if args.sites:
        print_sites(methods, args.sites)


if __name__ == "__main__":
    from benchmarks.output import recorded

    # the record's name from the options that choose the experiments (main parses them all)
    naming = argparse.ArgumentParser(add_help=False)
    naming.add_argument("--long", action="store_true")
    naming.add_argument("--fixed-shape", action="store_true")
    naming.add_argument("--scale", default="cpu")
    known = naming.parse_known_args()[0]
    name = (
        "bench_host_overhead"
        + ("_long" if known.long else "")
        + ("_fixed_shape" if known.fixed_shape else "")
    )
    name += "_paper" if known.scale == "paper" else ""
    with recorded(name, module="benchmarks.bench_host_overhead"):
        main()
