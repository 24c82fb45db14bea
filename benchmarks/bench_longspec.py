"""LongSpec against vanilla on long-context continuation with SmolLM2-135M and its shipped draft (one
run, one table): wall-clock speedup, tau, and what the draft costs per token beside the target.

    flock results/bench/.lock python -m benchmarks.bench_longspec \\
        [--context 4096] [--prompts 2] [--new 128] [--repeats 2] [--vocab 8192 16384]
        [--methods TEXT ...]   # vanilla + the methods whose name contains a TEXT: bench_longspec-selected

Methods, all lossless (`exact` = outputs identical to vanilla's, fp32; `decoder.checkpoint=auto`):
- vanilla, the baseline;
- LongSpec with the paper's tree (depth 5, widths [4,16,16,16,16]) and the two labelled CPU presets,
  the small tree [2,2,2,2] and the chain [1,1,1,1];
- the CPU presets again with `draft_vocab=N` for each `--vocab N`: the draft proposes only from the N
  tokens most frequent in its training data (our CPU option, not the paper's), so its LM-head GEMM
  shrinks by vocab/N;
- `block=auto` (ours, not the paper's: `decoders.longspec.auto`): the chain, the small tree (both
  with `draft_vocab` 8192) and the paper's tree, each cut every step to the nodes worth verifying on
  this machine's cost curve (the runner's cached curve, or measured now before anything is timed);
- `lookup=10` (ours, not the paper's): the auto chain with prompt lookup's guess as a second branch of
  its tree (`decoder=longspec_lookup_auto`), beside prompt lookup alone (`decoder=pld`, fixed and
  block=auto), the draftless method whose guesses it adds;
- MagicDec (decoder=selfspec kv=streaming, gamma 4, 6.25% of the context, the `sliced` backend that
  skips the unselected entries: LongSpec Table 1's baseline). Its draft steps are the target's own
  forwards over the compressed cache: they count under `target`.

Columns: `speedup` = vanilla decode time / the method's over the same prompts (this machine); `tau` =
tokens committed per target forward; `draft ms` = mean seconds of one draft forward (a tree level),
`target ms` = mean seconds of one target forward of the method (a verification), both timed around
the forwards by this benchmark; `draft/tok` and `target/tok` = the draft's and the target's forward
time per generated token, in units of vanilla's one-row step (so vanilla's target/tok is 1.00 and a
method is faster than vanilla when their sum, plus the bookkeeping between forwards, is below 1);
`rows` = mean query rows of the method's verification forwards.

Protocol: prompts are the pg19 task's offline stand-in (Paul Graham essays held out from the draft's
training text) cut to `--context` tokens; one untimed warm-up per method; per prompt every method runs
in turn; decode time starts when the prefill is done. `--repeats R` measures the prompt set R times;
the last column gives each method's speedup per repeat as median [min-max].
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from benchmarks.bench_selfspec import spread
from benchmarks.timing import timed_generate
from core.cost_curve import CostFn, cached_or_measured, curve_key
from core.engine import Engine
from core.models import load_model
from core.types import Counts
from decoders.base import BaseDecoder
from decoders.longspec.decoder import LongSpec
from decoders.pld import PromptLookup
from decoders.selfspec import SelfSpeculative
from decoders.vanilla import Vanilla
from kv_policies.registry import build_policy
from runners.forwards import MethodPatch
from runners.provenance import device_name
from tasks.pg19 import PG19

Maker = Callable[[Engine], BaseDecoder]
TREES = {"paper tree": (5, [4, 16, 16, 16, 16]), "small tree": (4, [2, 2, 2, 2]), "chain": (4, [1, 1, 1, 1])}


def methods(vocab_sizes: list[int], cost: CostFn) -> dict[str, Maker]:
    def longspec(depth: int, widths: list[int], vocab: int | None = None) -> Maker:
        return lambda e: LongSpec(e, depth=depth, widths=widths, checkpoint="auto", draft_vocab=vocab)

    draft_seconds: dict[tuple, dict[int, float]] = {}  # measured once per shape, before timing

    def auto(depth: int, widths: list[int], vocab: int | None, lookup: int = 0) -> Maker:
        def make(e: Engine) -> BaseDecoder:
            dec = LongSpec(
                e,
                depth=depth,
                widths=widths,
                checkpoint="auto",
                draft_vocab=vocab,
                block="auto",
                lookup=lookup,
            )
            shape = (tuple(widths), vocab)
            if shape in draft_seconds:
                BaseDecoder.use_cost(dec, cost)
                dec.draft_seconds = draft_seconds[shape]
            else:
                dec.use_cost(cost)
                draft_seconds[shape] = dec.draft_seconds
            return dec

        return make

    out: dict[str, Maker] = {"vanilla": lambda e: Vanilla(e)}
    for name, (depth, widths) in TREES.items():
        out[f"LongSpec {name}"] = longspec(depth, widths)
    for vocab in vocab_sizes:
        for name in ("small tree", "chain"):
            out[f"LongSpec {name}, draft_vocab {vocab}"] = longspec(*TREES[name], vocab)
    out["LongSpec chain, block=auto"] = auto(*TREES["chain"], 8192)
    out["LongSpec small tree, block=auto"] = auto(*TREES["small tree"], 8192)
    out["LongSpec paper tree, block=auto"] = auto(*TREES["paper tree"], None)
    out["LongSpec chain, block=auto, lookup 10"] = auto(*TREES["chain"], 8192, lookup=10)
    out["prompt lookup"] = lambda e: PromptLookup(e)

    def pld_auto(e: Engine) -> BaseDecoder:
        dec = PromptLookup(e, block="auto")
        dec.use_cost(cost)
        return dec

    out["prompt lookup, block=auto"] = pld_auto
    out["MagicDec (selfspec+streaming)"] = lambda e: SelfSpeculative(
        e, kv=build_policy("streaming", budget_frac=0.0625, sinks=4, backend="sliced"), gamma=4
    )
    return out


class ForwardClock:
    """Seconds spent in the target's forwards and in a LongSpec draft's block steps (each beam level's
    `top_logprobs`, its reading of the step included, as the runner's `DraftClock` counts it), by
    wrapping them on their instances until `close()`."""

    def __init__(self, eng: Engine, dec: BaseDecoder) -> None:
        self.target_s = self.draft_s = 0.0
        self.target_n = self.draft_n = 0
        self.counting = False  # only decode forwards count (set once the prefill is done)
        self._patches = [MethodPatch([(eng, "step")], lambda fn: self._wrap(fn, "target"))]
        if isinstance(dec, LongSpec):
            self._patches.append(
                MethodPatch([(dec.draft, "top_logprobs")], lambda fn: self._wrap(fn, "draft"))
            )

    def _wrap(self, fn: Callable, which: str) -> Callable:
        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            out = fn(*args, **kwargs)
            if self.counting:
                secs = time.perf_counter() - t0
                if which == "target":
                    self.target_s, self.target_n = self.target_s + secs, self.target_n + 1
                else:
                    self.draft_s, self.draft_n = self.draft_s + secs, self.draft_n + 1
            return out

        return timed

    def start_counting(self) -> None:
        self.counting = True

    def close(self) -> None:
        for patch in self._patches:
            patch.undo()  # back to the classes' methods


@dataclass
class Tally:
    decode_s: float = 0.0
    tokens: int = 0
    forwards: int = 0
    committed: int = 0
    target_s: float = 0.0
    target_n: int = 0
    draft_s: float = 0.0
    draft_n: int = 0
    rows: int = 0
    exact: int = 0
    runs: int = 0


def measure(
    eng: Engine, dec: BaseDecoder, prompt: list[int], new: int
) -> tuple[list[int], Counts, float, ForwardClock]:
    clock = ForwardClock(eng, dec)
    timed = timed_generate(dec, prompt, new, on_prefill_done=clock.start_counting, on_finish=clock.close)
    return timed.output, timed.counts, timed.decode_s, clock


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2, help="measure the prompt set this many times")
    ap.add_argument("--vocab", type=int, nargs="*", default=[8192, 16384], help="draft_vocab sizes to add")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument(
        "--methods", nargs="+", default=None, metavar="TEXT",
        help="only the methods whose name contains one of these (vanilla always runs); written apart",
    )  # fmt: skip
    return ap


def selected(makers: dict[str, Maker], wanted: list[str] | None) -> dict[str, Maker]:
    """vanilla and the methods whose name contains one of `wanted` (all of them when None)."""
    if wanted is None:
        return makers
    out = {n: m for n, m in makers.items() if n == "vanilla" or any(w in n for w in wanted)}
    if len(out) == 1:
        raise SystemExit(
            f"error: --methods {' '.join(wanted)} matches no method (known: {', '.join(makers)})"
        )
    return out


def output_name(argv: list[str]) -> str:
    """A run over some methods only is written apart from the full table."""
    return "bench_longspec" + ("-selected" if build_parser().parse_known_args(argv)[0].methods else "")


def main() -> None:
    args = build_parser().parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    lm = load_model("packaged", "smollm2-135m", dtype="float32", device="cpu")
    eng = Engine(lm.model, linear="onednn")
    threads = torch.get_num_threads()  # the runner's key: the same cached curve
    key = curve_key(
        device_name(lm.device), "smollm2-135m", "float32", eng.linear, threads, graphs=eng.graphs is not None
    )
    cost, measured = cached_or_measured(eng, key, 1 + 4 + 4 * 16)
    every = methods(args.vocab, cost)
    makers = selected(every, args.methods)
    probe = every["LongSpec chain"](eng)
    print(
        f"SmolLM2-135M fp32 (oneDNN GEMMs), {torch.get_num_threads()} threads; {args.prompts} PG-19 "
        f"stand-in prompts of {args.context} tokens x {args.new} new tokens, {args.repeats} repeats; "
        f"draft: {probe.draft.label}; cost curve for block=auto: {'measured now' if measured else 'cached'}\n"
    )
    task = PG19(context_length=args.context, max_new_tokens=args.new, source="package", limit=args.prompts)
    prompts = [task.prompt_ids(s, 0, [], lm.tokenizer) for s in task.load()]
    for make in makers.values():  # warm-up
        make(eng).generate(prompts[0][-512:], 8, set(), Counts())
    tallies = {name: Tally() for name in makers}
    per_repeat = {name: [0.0] * args.repeats for name in makers}
    for repeat, prompt in ((r, p) for r in range(args.repeats) for p in prompts):
        ref = None
        for name, make in makers.items():
            out, counts, secs, clock = measure(eng, make(eng), prompt, args.new)
            ref = out if ref is None else ref
            t = tallies[name]
            t.decode_s += secs
            per_repeat[name][repeat] += secs
            t.tokens += len(out) - 1
            t.forwards, t.committed = t.forwards + counts.forwards, t.committed + counts.committed
            t.target_s, t.target_n = t.target_s + clock.target_s, t.target_n + clock.target_n
            t.draft_s, t.draft_n = t.draft_s + clock.draft_s, t.draft_n + clock.draft_n
            t.rows += sum(s.block_tokens for s in counts.steps if not s.draft)
            t.exact += out == ref
            t.runs += 1
    base = tallies["vanilla"]
    step = base.target_s / base.target_n  # vanilla's one-row step
    print(f"vanilla one-row step: {step * 1e3:.1f} ms at ~{args.context} cached tokens")
    print(
        f"{'method':40s} {'speedup':>7s} {'tau':>5s} {'draft ms':>8s} {'target ms':>9s} {'draft/tok':>9s} "
        f"{'target/tok':>10s} {'rows':>5s} {'tok/s':>6s} exact  speedup per repeat: median [min-max]"
    )
    for name, t in tallies.items():
        draft_ms = f"{t.draft_s / t.draft_n * 1e3:8.2f}" if t.draft_n else f"{'-':>8s}"
        print(
            f"{name:40s} {base.decode_s / t.decode_s:7.2f} {t.committed / max(t.forwards, 1):5.2f} "
            f"{draft_ms} {t.target_s / max(t.target_n, 1) * 1e3:9.2f} "
            f"{t.draft_s / t.tokens / step:9.2f} {t.target_s / t.tokens / step:10.2f} "
            f"{t.rows / max(t.forwards, 1):5.1f} {t.tokens / t.decode_s:6.1f} {t.exact}/{t.runs}  "
            f"{spread(per_repeat['vanilla'], per_repeat[name])}"
        )


if __name__ == "__main__":
    import sys

    from benchmarks.output import recorded

    with recorded(output_name(sys.argv[1:]), module="benchmarks.bench_longspec"):
        main()
