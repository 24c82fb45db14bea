"""Where does the LongSpec draft lose to prompt lookup? A probe on LongSpec Table 1's prompts.

    python -m research.probes.probe_longspec_copy [--context 4096] [--prompts 3] [--new 256]
        [--draft auto <draft folder> ...] [--tag TAG] [--continuations FILE:PROMPT ...] [--count 6]
        [--random-loops N]

Per prompt (the pg19 task's offline stand-in cut to `--context` tokens, as
`experiment=longspec_table1_cpu`), the target's greedy continuation (`--new` tokens, decoded
losslessly by prompt lookup) is fed back teacher-forced, and at every continuation position t
(predicting token t+1) this compares the target's argmax with:

- `ngram`: prompt lookup's guess (`decoders.pld.match_candidate`, its default 2-gram match over the
  prompt and the continuation so far): the token after the earliest earlier occurrence of the
  trailing n-gram; no guess without a match;
- each draft's top-1 and top-4 at lag j = 1..5 (`LongSpecDraft.forward_train`: the query sees the
  target's entries up to t - j, as at depth j of a drafted tree; lag 1 is a tree's first level).

Positions are split into `copy` (prompt lookup's guess is the target's token: what an n-gram pool
catches) and `other`. A draft that copies would agree with the target on `copy` positions at
least as often as the lookup does. Per prompt, each draft's top-1 at lag 1 on its copy positions is
printed beside the lookup's share: where the target repeats itself, this is what a draft leaves to
an n-gram decoder.

Ablations (`ABLATIONS`, top-1 at lag 1, against the same full-context target tokens) ask what the
draft takes from the target's cache:

- `last N entries`: the cross-attention sees only the target's `RECENT` most recent entries (those
  at t-lag-N+1..t-lag). A draft that retrieves (finds an earlier occurrence of its token and reads
  what followed it) loses the copies whose source lies further back.
- `zeroed V`: the target's values set to zero, so the cross-attention adds nothing.
- `short context`: only the last `SHORT_CONTEXT` prompt tokens (and the continuation) are fed, from
  position 0: the target's cache holds no more than that.

`--continuations` adds the same top-1 at lag 1 on the first `--count` sequences of training
continuations files (`checkpoints/longspec/continuations/*.json`: PROMPT text tokens, then the
target's greedy tokens): on a file a draft was trained on against a held-out one, it tells copying
learnt as a skill from continuations learnt by heart. `--random-loops N` adds the same on N
sequences of units of random tokens, each repeated (`training.longspec.loops.random_loop_sequences`,
seeded apart from any training run): the target copies them from their second time on, and the
language says nothing about them, so a draft agrees with the target there only by copying.

The shares are hardware-independent; they depend only on the model, the prompts and the draft
weights.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import torch

from core.engine import Engine
from decoders.longspec.decoder import LOOKUP_NGRAM, SHIPPED, shipped_draft
from decoders.longspec.draft import LongSpecDraft
from decoders.pld import match_candidate
from research.probes.longspec_prompts import add_prompt_arguments, continued_prompts
from training.longspec.data import source_text
from training.longspec.loops import RANDOM_UNIT, random_loop_sequences
from training.longspec.steps import target_view

LAGS = (1, 2, 3, 4, 5)
RECENT = 8
ABLATIONS = (f"last {RECENT} entries", "zeroed V", "short context")
SHORT_CONTEXT = 128
RANDOM_LOOPS_SEED = 1_000_003  # no training run's seed: units no draft was trained on
RANDOM_LOOPS_LEN = 1024


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m research.probes.probe_longspec_copy", description=__doc__)
    add_prompt_arguments(ap)
    ap.add_argument("--draft", nargs="+", default=["auto"], help="auto (the shipped draft) or draft folders")
    ap.add_argument("--tag", default="", help="written apart, as probe_longspec_copy-TAG")
    ap.add_argument(
        "--continuations",
        nargs="*",
        default=[],
        metavar="FILE:PROMPT",
        help="also the first --count sequences of a training continuations file (a JSON list of token "
        "lists, e.g. checkpoints/longspec/continuations/essays_3.json:128), from its PROMPT-th token on",
    )
    ap.add_argument("--count", type=int, default=6, help="sequences read from each --continuations file")
    ap.add_argument(
        "--random-loops",
        type=int,
        default=0,
        metavar="N",
        help="also N sequences of random tokens in repeated units: copying alone predicts them",
    )
    return ap


def output_name(argv: list[str]) -> str:
    tag = build_parser().parse_known_args(argv)[0].tag
    return "probe_longspec_copy" + (f"-{tag}" if tag else "")


def ngram_guesses(seq: list[int], first: int) -> list[int | None]:
    """Prompt lookup's guess of token t+1 for t = first-1 .. len(seq)-2 (None: no match)."""
    out: list[int | None] = []
    for t in range(first - 1, len(seq) - 1):
        _, draft = match_candidate(seq[: t + 1], LOOKUP_NGRAM, 1)
        out.append(draft[0] if draft else None)
    return out


def draft_agreement(
    draft: LongSpecDraft,
    tok: torch.Tensor,
    view: tuple,
    first: int,
    lag: int,
    cross_window: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """bool `[S - first]` per continuation position t = first-1 .. S-2: the draft's top-1 and top-4
    at `lag` hold the target's argmax at t (`cross_window`: as `LongSpecDraft.forward_train`'s)."""
    k, v, logits = view
    with torch.no_grad():
        draft_logits = draft.forward_train(tok, torch.arange(tok.numel()), k, v, lag, cross_window)
    rows = slice(first - 1 - lag, None)  # forward_train's row i is position lag + i
    want = logits[first - 1 : -1].argmax(-1)
    top4 = draft_logits[rows].topk(4, dim=-1).indices
    return top4[:, 0] == want, (top4 == want[:, None]).any(-1)


def ablation_agreement(
    draft: LongSpecDraft, eng: Engine, tok: torch.Tensor, view: tuple, first: int, kind: str
) -> torch.Tensor:
    """bool `[S - first]`: the draft's top-1 at lag 1 holds the full-context target's argmax, with the
    target's cache ablated as `kind` (one of `ABLATIONS`) says (module docstring)."""
    k, v, logits = view
    if kind == f"last {RECENT} entries":
        return draft_agreement(draft, tok, view, first, 1, cross_window=RECENT)[0]
    if kind == "zeroed V":
        return draft_agreement(draft, tok, (k, torch.zeros_like(v), logits), first, 1)[0]
    if kind != "short context":
        raise ValueError(f"unknown ablation {kind!r}")
    cut = max(0, first - SHORT_CONTEXT)
    short = tok[cut:]
    k, v, _ = target_view(eng, short, torch.arange(short.numel()), draft.target_layer, False)
    return draft_agreement(draft, short, (k, v, logits[cut:]), first - cut, 1)[0]


def load_drafts(names: list[str], eng: Engine) -> dict[str, LongSpecDraft]:
    drafts = {}
    for name in names:
        folder = shipped_draft(eng) if name == "auto" else Path(name)
        label = folder.resolve().relative_to(SHIPPED.parent.parent).as_posix() if name == "auto" else name
        drafts[label] = LongSpecDraft.load(folder, eng)
    return drafts


def share(mask: torch.Tensor, where: torch.Tensor) -> str:
    n = int(where.sum())
    return f"{float(mask[where].float().mean()):.2f}" if n else "-"


def target_views(eng: Engine, drafts: dict[str, LongSpecDraft], seq: list[int]) -> dict[int, tuple]:
    """The target's view of `seq` (`target_view`: K, V, logits) at each layer the drafts read."""
    tok, positions, views = torch.tensor(seq), torch.arange(len(seq)), {}
    for draft in drafts.values():
        if draft.target_layer not in views:
            views[draft.target_layer] = target_view(eng, tok, positions, draft.target_layer, True)
    return views


def copy_positions(seq: list[int], first: int, view: tuple) -> torch.Tensor:
    """bool per continuation position t = first-1 .. len(seq)-2: prompt lookup's guess is the target's
    argmax (any layer's view: the logits are the same)."""
    want = view[2][first - 1 : -1].argmax(-1).tolist()
    return torch.tensor([g == w for g, w in zip(ngram_guesses(seq, first), want, strict=True)])


def continuation_files(specs: list[str], count: int) -> list[tuple[str, list[list[int]], int]]:
    """(spec, its first `count` sequences, prompt length) per `FILE:PROMPT`; bad ones stop here."""
    out = []
    for spec in specs:
        path, _, prompt = spec.rpartition(":")
        if not prompt.isdigit() or not Path(path).is_file() or count < 1:
            raise SystemExit(f"error: --continuations takes FILE:PROMPT of an existing file, got {spec!r}")
        out.append((spec, json.loads(Path(path).read_text())[:count], int(prompt)))
    return out


def random_loop_set(tokenizer: Any, count: int) -> tuple[str, list[list[int]], int]:
    """`count` random-loop sequences of `RANDOM_LOOPS_LEN` tokens drawn from the drafts' training text
    (`print_continuations`' (label, sequences, first position) item), read from the longest unit on."""
    ids = tokenizer.encode(
        source_text("random_loops", 8 * RANDOM_LOOPS_LEN * count), add_special_tokens=False
    )
    seqs = random_loop_sequences(list(ids), RANDOM_LOOPS_LEN, RANDOM_LOOPS_SEED)[:count]
    return f"random loops (seed {RANDOM_LOOPS_SEED})", seqs, RANDOM_UNIT[1]


def print_continuations(eng: Engine, drafts: dict[str, LongSpecDraft], files: list) -> None:
    """Per continuations file and draft: top-1 at lag 1 on the copy and other positions, pooled."""
    print(
        "\nOn training continuations (the target's own greedy tokens after PROMPT text tokens) and "
        "random loops (read from their first position past the longest unit):\n"
    )
    print("| continuations | sequences | copy share | draft | top-1 copy | top-1 other |")
    print("|---|---:|---:|---|---:|---:|")
    for spec, seqs, first in files:
        copies, agree = [], {name: [] for name in drafts}
        for seq in seqs:
            tok, views = torch.tensor(seq), target_views(eng, drafts, seq)
            copies.append(copy_positions(seq, first, next(iter(views.values()))))
            for name, draft in drafts.items():
                agree[name].append(draft_agreement(draft, tok, views[draft.target_layer], first, 1)[0])
        copy = torch.cat(copies)
        rate = float(copy.float().mean())
        for name in drafts:
            t1 = torch.cat(agree[name])
            print(f"| {spec} | {len(seqs)} | {rate:.2f} | {name} | {share(t1, copy)} | {share(t1, ~copy)} |")


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.random_loops < 0:
        raise SystemExit(f"error: --random-loops takes a count of 0 or more, got {args.random_loops}")
    files = continuation_files(args.continuations, args.count)
    eng, tokenizer, continued = continued_prompts(args)
    if args.random_loops:
        files.append(random_loop_set(tokenizer, args.random_loops))
    drafts = load_drafts(args.draft, eng)
    print(
        f"# probe_longspec_copy: smollm2-135m fp32, {args.prompts} PG-19 stand-in prompts of "
        f"{args.context} tokens x {args.new} greedy tokens (teacher-forced)\n"
    )
    copies: list[torch.Tensor] = []  # per prompt: prompt lookup's guess is the target's token
    agree: dict[tuple[str, int, int], list[torch.Tensor]] = {}
    for sample_id, seq, first in continued:
        tok = torch.tensor(seq)
        views = target_views(eng, drafts, seq)
        copy = copy_positions(seq, first, next(iter(views.values())))
        for name, draft in drafts.items():
            view = views[draft.target_layer]
            for lag in LAGS:
                top1, top4 = draft_agreement(draft, tok, view, first, lag)
                agree.setdefault((name, lag, 1), []).append(top1)
                agree.setdefault((name, lag, 4), []).append(top4)
            for kind in ABLATIONS:
                ablated = ablation_agreement(draft, eng, tok, view, first, kind)
                agree.setdefault((name, kind, 1), []).append(ablated)
        copies.append(copy)
        rate = float(copy.float().mean())
        per_draft = "; ".join(f"{name} {share(agree[(name, 1, 1)][-1], copy)}" for name in drafts)
        print(
            f"- {sample_id}: prompt lookup guesses the target's token at {rate:.2f} of {copy.numel()}; "
            f"each draft's top-1 at lag 1 on those copy positions: {per_draft}"
        )
    copy = torch.cat(copies)
    other = ~copy
    print(
        f"\npositions: {copy.numel()}; `copy` (prompt lookup right): {int(copy.sum())} "
        f"({float(copy.float().mean()):.2f}); `other`: {int(other.sum())}\n"
    )
    print("Agreement with the target's argmax (share of positions):\n")
    print("| draft | lag | top-1 all | top-1 copy | top-1 other | top-4 all | top-4 copy | top-4 other |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    every = torch.ones_like(copy)
    for name in drafts:
        for lag in LAGS:
            t1, t4 = torch.cat(agree[(name, lag, 1)]), torch.cat(agree[(name, lag, 4)])
            cells = [share(t1, every), share(t1, copy), share(t1, other), share(t4, every),
                     share(t4, copy), share(t4, other)]  # fmt: skip
            print(f"| {name} | {lag} | " + " | ".join(cells) + " |")
    lookup_right = float(copy.float().mean())
    print(f"| prompt lookup ({LOOKUP_NGRAM}-gram) | - | {lookup_right:.2f} | 1.00 | 0.00 | | | |")
    print(
        f"\nAblations of the target's cache, top-1 at lag 1 against the same target tokens (`short "
        f"context`: the last {SHORT_CONTEXT} prompt tokens only):\n"
    )
    print("| draft | target cache | top-1 all | top-1 copy | top-1 other |")
    print("|---|---|---:|---:|---:|")
    for name in drafts:
        rows = {"as is": torch.cat(agree[(name, 1, 1)])}
        rows.update({kind: torch.cat(agree[(name, kind, 1)]) for kind in ABLATIONS})
        for kind, t1 in rows.items():
            print(f"| {name} | {kind} | {share(t1, every)} | {share(t1, copy)} | {share(t1, other)} |")
    if files:
        print_continuations(eng, drafts, files)


if __name__ == "__main__":
    import sys

    from benchmarks.output import recorded

    with recorded(output_name(sys.argv[1:]), module="research.probes.probe_longspec_copy"):
        main()
