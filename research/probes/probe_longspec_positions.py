"""Do the LongSpec drafts hold up past the sequence length they were trained on? A probe of Anchor-Offset
(papers/004 §3.2, Table 2, Figure 4) on LongSpec Table 1's prompts.

    python -m research.probes.probe_longspec_positions [--context 4096] [--prompts 3] [--edges 1024 2048]
        [--draft <draft folder> ...]

Every draft here trains on 1024-token sequences. With plain position ids its queries never meet a
key more than 1023 positions away. Anchor-Offset keeps the first 4 positions and shifts the rest by a
random offset, so the distances up to the target's context are met in training; the paper credits it
with fewer steps to a given loss on long data. This probe feeds each prompt (the pg19 task's offline
stand-in, `--context` tokens of held-out text, as `experiment=longspec_table1_cpu`) through the
target and each draft teacher-forced at plain positions 0..S-1, as drafting does, and at lag 1 (a
tree's first level: query t sees the target's entries up to t - 1). Per position bucket (split at
`--edges`) it reports each draft's cross-entropy against the text's next token (the training
validation loss) and how often its top-1 is the target's argmax.

The numbers are hardware-independent: they depend only on the model, the prompts and the draft
weights.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from decoders.longspec.draft import LongSpecDraft
from research.probes.longspec_prompts import add_prompt_arguments, table1_prompts
from training.longspec.steps import target_view

REPO = Path(__file__).resolve().parents[2]
DEFAULT_DRAFTS = [  # the Anchor-Offset ablation pair of LongSpec Table 2 (relative to the repository)
    "checkpoints/longspec/ablations/smollm2-135m-anchor-offset",
    "checkpoints/longspec/ablations/smollm2-135m-no-anchor-offset",
]
LAG = 1


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m research.probes.probe_longspec_positions", description=__doc__
    )
    add_prompt_arguments(ap, continued=False)
    ap.add_argument("--edges", type=int, nargs="+", default=[1024, 2048], help="bucket boundaries")
    ap.add_argument("--draft", nargs="+", default=DEFAULT_DRAFTS, help="draft folders")
    return ap


def trained_on(folder: Path) -> str:
    """The draft's training sequence length and position ids per stage, from its training.json."""
    path = folder / "training.json"
    if not path.is_file():
        return "training unknown"
    cfg = json.loads(path.read_text())["config"]
    stages = ", ".join(f"{s['name']} {s.get('positions', 'anchor_offset')}" for s in cfg["stages"])
    return f"{cfg['seq_len']}-token sequences; {stages}"


def buckets(edges: list[int], context: int) -> list[tuple[int, int]]:
    """[lo, hi) position ranges split at `edges`, from 0 to `context`."""
    cuts = [0, *sorted(e for e in set(edges) if 0 < e < context), context]
    return list(zip(cuts[:-1], cuts[1:], strict=True))


def position_scores(
    draft: LongSpecDraft, tokens: torch.Tensor, view: tuple
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per query position t = LAG .. S-2: that position, the draft's cross-entropy against token t+1 of
    the text, and whether its top-1 is the target's argmax at t."""
    k, v, logits = view
    n = tokens.numel()
    with torch.no_grad():
        draft_logits = draft.forward_train(tokens, torch.arange(n), k, v, LAG)
    loss = torch.nn.functional.cross_entropy(draft_logits, tokens[LAG + 1 :], reduction="none")
    agree = draft_logits.argmax(-1) == logits[LAG:-1].argmax(-1)
    return torch.arange(LAG, n - 1), loss, agree


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    folders = [Path(d) if Path(d).is_absolute() or Path(d).exists() else REPO / d for d in args.draft]
    missing = [d for d, f in zip(args.draft, folders, strict=True) if not (f / "config.json").is_file()]
    if missing:
        raise SystemExit(f"error: no LongSpec draft in {', '.join(missing)}")
    if any(e <= 0 for e in args.edges):
        raise SystemExit("error: --edges must be positive positions")
    eng, _, prompts = table1_prompts(args)
    drafts = {name: LongSpecDraft.load(f, eng) for name, f in zip(args.draft, folders, strict=True)}
    print(
        f"# probe_longspec_positions: smollm2-135m fp32, {args.prompts} PG-19 stand-in prompts of "
        f"{args.context} tokens, teacher-forced at plain positions, lag {LAG}\n"
    )
    for name, folder in zip(drafts, folders, strict=True):
        print(f"- {name}: {trained_on(folder)}")
    scores: dict[str, list[tuple[torch.Tensor, ...]]] = {name: [] for name in drafts}
    for sample_id, prompt in prompts:
        tokens = torch.tensor(prompt)
        views: dict[int, tuple] = {}
        for name, draft in drafts.items():
            layer = draft.target_layer
            if layer not in views:
                views[layer] = target_view(eng, tokens, torch.arange(tokens.numel()), layer, True)
            scores[name].append(position_scores(draft, tokens, views[layer]))
        print(f"- {sample_id}: {tokens.numel()} tokens")
    spans = buckets(args.edges, args.context)
    head = " | ".join(f"loss {lo}-{hi - 1}" for lo, hi in spans)
    agree_head = " | ".join(f"top-1 {lo}-{hi - 1}" for lo, hi in spans)
    print("\nPer position bucket: cross-entropy against the text, top-1 = the target's argmax:\n")
    print(f"| draft | {head} | {agree_head} |")
    print("|---|" + "---:|" * (2 * len(spans)))
    for name, parts in scores.items():
        pos, loss, agree = (torch.cat(x) for x in zip(*parts, strict=True))
        inside = [(pos >= lo) & (pos < hi) for lo, hi in spans]
        losses = [f"{float(loss[m].mean()):.2f}" if m.any() else "-" for m in inside]
        agrees = [f"{float(agree[m].float().mean()):.2f}" if m.any() else "-" for m in inside]
        print(f"| {name} | " + " | ".join(losses + agrees) + " |")


if __name__ == "__main__":
    from benchmarks.output import recorded

    with recorded("probe_longspec_positions", module="research.probes.probe_longspec_positions"):
        main()
