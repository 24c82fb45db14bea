"""Self-speculation (MagicDec, TriForce's retrieval drafting) and TriForce against vanilla on long
contexts, with SmolLM2-135M (one run, one table per context length).

    flock results/bench/.lock python -m benchmarks.bench_selfspec \\
        [--contexts 4096 7168] [--prompts 2] [--new 64] [--budget-frac 0.05] [--draft-layers 4] [--repeats 2]

Methods, all lossless (`exact` = outputs identical to vanilla's, fp32):
- vanilla (kv=full), the baseline;
- MagicDec: decoder=selfspec (gamma 6) drafting through kv=streaming;
- retrieval w/o hierarchy: decoder=selfspec (gamma 6) drafting through kv=retrieval (chunk 8);
- the same with the retrieval cache rebuilt after every verification from the latest draft query
  (decoder.rebuild_every=1; ours, the paper builds it once);
- TriForce: decoder=triforce (gamma1 2, gamma2 6) with kv=retrieval and the offline layer-truncated
  self-draft (the target's first --draft-layers layers; NOT the paper's JackFram/llama-68m).
The draft caches use the compressed-region `sliced` backend (attention really skips the unselected
entries), budget = --budget-frac of each context.

Columns: `speedup` = vanilla decode time / method decode time over the same prompts (wall clock, this
machine); `tau` = tokens per full-cache verification; `acc` = accepted / drafted at the full-cache
level (TriForce's "acceptance rate"), `acc_l1` = the draft model's tokens accepted by the middle level;
`kv MB/tok` = target KV bytes read per generated token. Two predictions from the counts alone:
`pred_kv` = vanilla's KV bytes per token / the method's (a forward that costs its KV reads: the paper's
7B-at-120k regime), `pred_bw` = the same with every forward also reading this model's weights once
(a bandwidth-bound device running THIS model: weights + KV bytes per token). Where `speedup` falls short
of both, a forward's cost here is neither (2-core CPU: compute-bound multi-row blocks).

Protocol: prompts are the pg19 task's offline stand-in (Paul Graham essays) cut to exactly each
context length; one untimed warm-up per method; per prompt every method runs in turn; decode time
starts when the prefill (and TriForce's draft prefill) is done. `--repeats R` (default 2) measures the
prompt set R times: the table pools them, the last column gives each method's speedup per repeat as
median [min-max], so this shared machine's noise can be told from a difference.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from benchmarks.timing import timed_generate
from core.engine import Engine
from core.models import load_model
from core.types import Counts
from decoders.base import BaseDecoder
from decoders.draft_model import DraftModel
from decoders.selfspec import SelfSpeculative
from decoders.triforce import TriForce
from decoders.vanilla import Vanilla
from kv_policies.registry import build_policy
from tasks.pg19 import PG19

Maker = Callable[[Engine, float], BaseDecoder]


def methods(draft_layers: int) -> dict[str, Maker]:
    def selfspec(policy: str, rebuild_every: int = 0) -> Maker:
        return lambda e, f: SelfSpeculative(
            e, kv=build_policy(policy, budget_frac=f, backend="sliced"), gamma=6, rebuild_every=rebuild_every
        )

    def triforce(e: Engine, f: float) -> BaseDecoder:
        label = f"self-{draft_layers}"
        draft = DraftModel(e.truncated(draft_layers), label, e.w.vocab_size, budget=256, sinks=16, room=64)
        kv = build_policy("retrieval", budget_frac=f, backend="sliced")
        return TriForce(e, kv=kv, gamma1=2, gamma2=6, draft=draft)

    return {
        "vanilla": lambda e, f: Vanilla(e),
        "MagicDec (selfspec+streaming)": selfspec("streaming"),
        "retrieval w/o hierarchy (selfspec)": selfspec("retrieval"),
        "retrieval rebuilt every verification": selfspec("retrieval", rebuild_every=1),
        f"TriForce (self-draft {draft_layers} layers)": triforce,
    }


@dataclass
class Tally:
    decode_s: float = 0.0
    tokens: int = 0
    forwards: int = 0
    committed: int = 0
    drafted: int = 0
    accepted: int = 0
    drafted_l1: int = 0
    accepted_l1: int = 0
    kv_entries: int = 0
    bw_bytes: float = 0.0
    exact: int = 0
    runs: int = 0


def weight_bytes(eng: Engine) -> int:
    """Bytes of the weights one forward reads (every layer's matrices and the LM head)."""
    w = eng.w
    mats = [t for layer in w.layers for t in (layer.wqkv, layer.wo, layer.wgu, layer.wdown)]
    return sum(t.numel() * t.element_size() for t in [*mats, w.lm_head.weight])


def measure(dec: BaseDecoder, prompt: list[int], new: int) -> tuple[list[int], Counts, float]:
    timed = timed_generate(dec, prompt, new)
    return timed.output, timed.counts, timed.decode_s


def spread(base: list[float], method: list[float]) -> str:
    """Median [min-max] over the repeats of vanilla's decode time / the method's."""
    ratios = sorted(b / m for b, m in zip(base, method))
    return f"{statistics.median(ratios):.2f} [{ratios[0]:.2f}-{ratios[-1]:.2f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", type=int, nargs="+", default=[4096, 7168])
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--budget-frac", type=float, default=0.05)
    ap.add_argument("--draft-layers", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=2, help="measure the prompt set this many times")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    lm = load_model("packaged", "smollm2-135m", dtype="float32", device="cpu")
    eng = Engine(lm.model, linear="onednn")
    per_entry = eng.cache.bytes_per_entry()
    w_target = weight_bytes(eng)
    w_draft = weight_bytes(eng.truncated(args.draft_layers))
    makers = methods(args.draft_layers)
    print(
        f"SmolLM2-135M fp32 (oneDNN GEMMs), {torch.get_num_threads()} threads; "
        f"budget {args.budget_frac:.1%} of each context; {args.prompts} prompts x {args.new} new tokens "
        "per context; weights read per forward: "
        f"{w_target / 2**20:.0f} MB (self-draft {w_draft / 2**20:.0f} MB)\n"
    )
    for ctx in args.contexts:
        task = PG19(context_length=ctx, max_new_tokens=args.new, source="package", limit=args.prompts)
        prompts = [task.prompt_ids(s, 0, [], lm.tokenizer) for s in task.load()]
        for make in makers.values():  # warm-up
            make(eng, args.budget_frac).generate(prompts[0][-512:], 8, set(), Counts())
        tallies = {name: Tally() for name in makers}
        per_repeat = {name: [0.0] * args.repeats for name in makers}  # decode seconds per repeat
        for repeat, prompt in ((r, p) for r in range(args.repeats) for p in prompts):
            ref = None
            for name, make in makers.items():
                out, counts, secs = measure(make(eng, args.budget_frac), prompt, args.new)
                ref = out if ref is None else ref
                t = tallies[name]
                t.decode_s += secs
                per_repeat[name][repeat] += secs
                t.tokens += len(out) - 1
                t.forwards += counts.forwards
                t.committed += counts.committed
                t.drafted, t.accepted = t.drafted + counts.drafted, t.accepted + counts.accepted
                t.drafted_l1, t.accepted_l1 = (
                    t.drafted_l1 + counts.drafted_l1,
                    t.accepted_l1 + counts.accepted_l1,
                )
                t.kv_entries += counts.kv_attended
                target_forwards = counts.forwards + counts.draft_forwards
                t.bw_bytes += target_forwards * w_target + counts.draft_model_forwards * w_draft
                t.bw_bytes += counts.kv_attended * per_entry
                t.exact += out == ref
                t.runs += 1
        base = tallies["vanilla"]
        print(f"context {ctx} tokens (prompt), budget {int(args.budget_frac * (ctx + args.new))} entries")
        print(
            f"{'method':40s} {'speedup':>7s} {'tau':>5s} {'acc':>5s} {'acc_l1':>6s} {'kv MB/tok':>9s} "
            f"{'pred_kv':>7s} {'pred_bw':>7s} {'tok/s':>6s} exact  speedup per repeat: median [min-max]"
        )
        for name, t in tallies.items():
            kv_tok = t.kv_entries * per_entry / 2**20 / max(t.tokens, 1)
            base_kv = base.kv_entries * per_entry / 2**20 / max(base.tokens, 1)
            pred_bw = (base.bw_bytes / base.tokens) / (t.bw_bytes / t.tokens)
            acc = t.accepted / t.drafted if t.drafted else float("nan")
            acc1 = t.accepted_l1 / t.drafted_l1 if t.drafted_l1 else float("nan")
            print(
                f"{name:40s} {base.decode_s / t.decode_s:7.2f} {t.committed / max(t.forwards, 1):5.2f} "
                f"{acc:5.2f} {acc1:6.2f} {kv_tok:9.1f} {base_kv / kv_tok:7.2f} {pred_bw:7.2f} "
                f"{t.tokens / t.decode_s:6.1f} {t.exact}/{t.runs}  "
                f"{spread(per_repeat['vanilla'], per_repeat[name])}"
            )
        print()


if __name__ == "__main__":
    from benchmarks.output import recorded

    with recorded("bench_selfspec"):
        main()
