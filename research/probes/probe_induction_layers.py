"""Which of the target's layers holds its copying? A probe for choosing LongSpec's `target_layer`.

    python -m research.probes.probe_induction_layers [--context 4096] [--prompts 3] [--new 256]

The LongSpec draft's cross-attention reads one target layer's cached K/V (the reference reads the
last layer). On LongSpec Table 1's prompts (the pg19 task's offline stand-in cut to `--context`
tokens, as `probe_longspec_copy`) the target's greedy continuations repeat themselves, so what a draft
most needs from that cache is the copy: at a position t whose token follows a 2-gram seen before,
the token that came after that 2-gram then.

Per prompt, the target's greedy continuation (`--new` tokens, decoded losslessly by prompt lookup) is
fed back in one forward. At every continuation position t where prompt lookup's 2-gram guess is the
target's next token (`copy` positions), the target's own attention is read in every layer and head:

- `copied`: the attention mass on the copy's sources, every earlier position j+1 whose 2-gram
  (x_j-1, x_j) equals (x_t-1, x_t) and whose token x_j+1 is the one the target predicts at t. An
  induction head puts its mass there: its keys carry the previous token, its values the token to copy.
- `predecessor`: the mass on the positions j just before those sources (previous-token heads' target).

Each layer reports its best head and the mean over its heads; a layer whose best head puts at least
`INDUCTION_SHARE` of its mass on the sources is named as holding an induction head. Shares are
hardware-independent: they depend only on the model and the prompts.
"""

from __future__ import annotations

import argparse

import torch

from core.attention import CausalView
from core.engine import Engine
from decoders.longspec.decoder import LOOKUP_NGRAM
from research.probes.longspec_prompts import add_prompt_arguments, continued_prompts

INDUCTION_SHARE = 0.5


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m research.probes.probe_induction_layers", description=__doc__)
    add_prompt_arguments(ap)
    return ap


def copy_sources(seq: list[int], first: int, n: int = LOOKUP_NGRAM) -> tuple[list[int], torch.Tensor]:
    """(rows, sources): the continuation positions t >= first-1 where the earliest earlier match of the
    trailing `n`-gram (prompt lookup's guess) is followed by seq[t+1], and a bool `[len(rows), len(seq)]`
    marking, per row, every earlier position that follows that n-gram and holds seq[t+1]."""
    tok = torch.tensor(seq)
    grams = tok.unfold(0, n, 1)  # grams[i] = seq[i : i+n]
    rows, marks = [], []
    for t in range(max(first - 1, n - 1), len(seq) - 1):
        ends = (grams[: t - n + 1] == tok[t - n + 1 : t + 1]).all(dim=1).nonzero().flatten() + n
        if ends.numel() == 0 or seq[int(ends[0])] != seq[t + 1]:
            continue
        mark = torch.zeros(len(seq), dtype=torch.bool)
        mark[ends[tok[ends] == seq[t + 1]]] = True
        rows.append(t)
        marks.append(mark)
    return rows, torch.stack(marks) if marks else torch.zeros(0, len(seq), dtype=torch.bool)


class AttentionOnSources:
    """An `Engine.step` hook summing, per layer and head, the attention mass that `rows`' queries put on
    `sources` and on the positions just before them (one causal forward from position 0)."""

    def __init__(self, engine: Engine, rows: list[int], sources: torch.Tensor) -> None:
        self.rows, self.sources, self.scale = torch.tensor(rows), sources, engine.scale
        self.before_sources = torch.zeros_like(sources)
        self.before_sources[:, :-1] = sources[:, 1:]
        w = engine.w
        self.copied = torch.zeros(w.n_layers, w.n_heads)
        self.predecessor = torch.zeros(w.n_layers, w.n_heads)

    def __call__(self, layer: int, q: torch.Tensor, k_all: torch.Tensor, cache_len: int) -> None:
        groups = q.shape[0] // k_all.shape[0]
        k = k_all.float().repeat_interleave(groups, dim=0)  # [H, N, d]
        scores = (q[:, self.rows].float() @ k.transpose(1, 2)) * self.scale  # [H, R, N]
        future = torch.arange(k.shape[1])[None, :] > self.rows[:, None]
        p = scores.masked_fill(future, float("-inf")).softmax(-1)
        self.copied[layer] += (p * self.sources).sum(dim=(1, 2))
        self.predecessor[layer] += (p * self.before_sources).sum(dim=(1, 2))


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    eng, _, continued = continued_prompts(args)
    print(
        f"# probe_induction_layers: smollm2-135m fp32, {args.prompts} PG-19 stand-in prompts of "
        f"{args.context} tokens x {args.new} greedy tokens (one forward)\n"
    )
    copied = torch.zeros(eng.w.n_layers, eng.w.n_heads)
    predecessor = torch.zeros_like(copied)
    n_rows = 0
    for sample_id, seq, first in continued:
        rows, sources = copy_sources(seq, first)
        print(f"- {sample_id}: {len(rows)} copy positions of {len(seq) - first}")
        if not rows:
            continue
        hook = AttentionOnSources(eng, rows, sources)
        eng.reset(len(seq))
        eng.step(torch.tensor(seq), torch.arange(len(seq)), CausalView(eng.scale), [len(seq) - 1], (hook,))
        copied += hook.copied
        predecessor += hook.predecessor
        n_rows += len(rows)
    if n_rows == 0:
        raise SystemExit("error: no copy positions in these continuations; try more --prompts or --new")
    copied, predecessor = copied / n_rows, predecessor / n_rows
    print(f"\nAttention mass from {n_rows} copy positions, per target layer:\n")
    print("| layer | copied: best head (KV head) | copied: mean of heads | predecessor: best head |")
    print("|---:|---:|---:|---:|")
    groups = eng.w.n_heads // eng.w.n_kv_heads
    for layer in range(eng.w.n_layers):
        best = int(copied[layer].argmax())
        print(
            f"| {layer} | {float(copied[layer, best]):.2f} (head {best}, KV {best // groups}) | "
            f"{float(copied[layer].mean()):.2f} | {float(predecessor[layer].max()):.2f} |"
        )
    best = copied.max(dim=1).values
    induction = [layer for layer in range(eng.w.n_layers) if best[layer] >= INDUCTION_SHARE]
    print(
        f"\nlayers with an induction head (one head puts >= {INDUCTION_SHARE} of its mass on the copy's "
        f"sources): {induction or 'none'}; the last layer, the reference's choice, is {eng.w.n_layers - 1}"
    )


if __name__ == "__main__":
    from benchmarks.output import recorded

    with recorded("probe_induction_layers", module="research.probes.probe_induction_layers"):
        main()
