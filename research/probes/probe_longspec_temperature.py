"""LongSpec's tau under the paper tree for each beam temperature, on prompts held out from Table 1.

    python -m research.probes.probe_longspec_temperature [--temperatures 1 1.5 2 3] [--skip 3] [--prompts 3]
        [--context 4096] [--new 256]      (--skip 0: Table 1's own prompts, written apart)

The beam keeps the nodes with the highest cumulative draft log-prob; dividing the draft's logits by a
temperature T before the log-softmax (`decoder.beam_temperature`, ours) changes which parents' children
win across the beam, not any single parent's order. The prompts are the pg19 task's offline stand-in
after the first `--skip` (LongSpec Table 1 at CPU scale uses the first 3), so a temperature chosen here
is not fitted on Table 1's prompts. Greedy, fp32; tau is hardware-independent (one run suffices).
"""

from __future__ import annotations

import argparse

import torch

from core.engine import Engine
from core.models import load_model
from core.types import Counts
from decoders.longspec.decoder import LongSpec


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[1.0, 1.5, 2.0, 3.0])
    ap.add_argument("--skip", type=int, default=3, help="prompts used by LongSpec Table 1, left out")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--new", type=int, default=256)
    return ap


def output_name(argv: list[str]) -> str:
    """Held-out prompts (the default) and any other slice (e.g. `--skip 0`: Table 1's own) apart."""
    skip = build_parser().parse_known_args(argv)[0].skip
    return "probe_longspec_temperature" + ("" if skip == 3 else f"-skip{skip}")


def main() -> None:
    args = build_parser().parse_args()
    from tasks.pg19 import PG19

    lm = load_model("packaged", "smollm2-135m", dtype="float32", device="cpu")
    eng = Engine(lm.model, linear="onednn")
    task = PG19(
        context_length=args.context, max_new_tokens=args.new, source="package", limit=args.skip + args.prompts
    )
    samples = task.load()[args.skip :]
    prompts = [task.prompt_ids(s, 0, [], lm.tokenizer) for s in samples]
    print(
        f"LongSpec paper tree (depth 5, widths [4, 16, 16, 16, 16]), shipped draft, SmolLM2-135M fp32; "
        f"pg19 stand-in prompts {args.skip + 1}-{args.skip + len(prompts)} ({args.context} tokens), "
        f"{args.new} new tokens\n"
    )
    print("| beam temperature | " + " | ".join(f"tau {s.sample_id}" for s in samples) + " | tau, all |")
    print("|---:|" + "---:|" * (len(samples) + 1))
    for t in args.temperatures:
        dec = LongSpec(eng, checkpoint="auto", beam_temperature=t)
        taus, committed, forwards = [], 0, 0
        with torch.inference_mode():
            for prompt in prompts:
                counts = Counts(keep_steps=False)
                dec.generate(prompt, args.new, set(), counts)
                taus.append(counts.committed / counts.forwards)
                committed, forwards = committed + counts.committed, forwards + counts.forwards
        print(f"| {t:g} | " + " | ".join(f"{x:.2f}" for x in taus) + f" | {committed / forwards:.3f} |")


if __name__ == "__main__":
    import sys

    from benchmarks.output import recorded

    with recorded(output_name(sys.argv[1:]), module="research.probes.probe_longspec_temperature"):
        main()
