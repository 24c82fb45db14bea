"""Lookahead Decoding (Fu et al. 2024, "Break the Sequential Dependency of LLM Inference Using
Lookahead Decoding", Sec. 3) on the shared step primitive.

Every decode step is ONE target forward (`engine.step`) over the block
`[last token | lookahead branch | verification branch]`:

- **Lookahead branch** (Sec. 3.1): a 2-D Jacobi window of N-1 levels and W columns. Column c of
  level l sits at position p + l + c (p = position of the last committed token, the *root*, which
  is level 0 column 0); level 0 holds columns 1..W-1, levels 1..N-2 columns 0..W-1. Token (l, c)
  sees the cache, the root, level-0 columns 1..c and the column-c tokens of levels 1..l - a
  contiguous run of positions p..p+l+c. The argmax outputs of the top level are the next Jacobi
  iterate (greedy even when sampling, like LADE's TEMP_FOR_GUESS=0).
- **n-gram pool** (Sec. 3.1): every column of a full window yields an N-gram
  (level0[c], level1[c], .., level_{N-2}[c], output[c]); it is stored under its first token with
  the other N-1 tokens as value, at most G values per key, least recently used evicted
  (`decoders.ngram_pool.NGramPool`). With `pool_from_prompt` the pool is also seeded with the
  prompt's n-grams and fed the n-grams of the generated text (LADE's POOL_FROM_PROMPT).
- **Verification branch** (Sec. 3.2): the up-to-G (N-1)-grams stored under the root, each causal
  within itself at positions p+1..p+N-1, seeing the cache and the root. Greedy: the longest
  matching candidate plus the bonus token (`decoders.verify.greedy_verify`). Sampling: the paper's
  multi-candidate verification of one-hot drafts (`decoders.sampled_verify.CandidateCheck`), lossless in
  distribution.
- **Commit**: the KV of the root and of the accepted candidate tokens is kept through
  `engine.commit`; the bonus token is the next root, its KV is computed by the next forward. The
  window then shifts one level (new level 0 = old level 1 without its column 0, the outputs become
  the top level): it advances one position per step however many tokens were accepted (LADE's
  ALWAYS_FWD_ONE).

Warm-up (LADE's first N-2 steps): level 0 starts with W+N-3 tokens drawn from the prompt by a
seeded generator; each warm-up step appends the top level's outputs as a new level and shifts every
level left by one column, so after N-2 steps the window has its steady shape. Candidates are
verified during warm-up too whenever the pool has any.

`block=auto` (ours; the fixed setting stays the default): the window's width and how often
it runs come from the cost curve (`decoders.block_size.generator_plan`: the window may add
`generator_share` of a 1-row step's cost on average; on a GPU-like curve that is the whole window every
step, on a CPU a narrow window every few steps), and each step verifies the number of pooled
candidates with the most expected committed tokens per second (acceptance per candidate rank and
position, this generation). Steps without the window still verify candidates; the window does not
advance on them. Verification is unchanged, so the output is too.

Upstream bugs fixed here (hao-ai-lab/LookaheadDecoding `lade/decoding.py`, see
the reference implementation):
1. when a whole (N-1)-gram matched, upstream's verification loop stopped before the bonus token and
   dropped it (one token lost per full match); `greedy_verify` always appends the bonus.
2. upstream recorded `hits[max_hit]` repeatedly instead of each accepted token in the list it
   harvests generated-text n-grams from, corrupting the pool whenever more than one token was
   accepted; here the pool is fed from the committed token ids themselves.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from core.attention import BlockView
from core.checks import flag, integer, number
from core.options import options, recorded_without
from core.policy_views import restricted_view
from core.positions import RelativePositions
from core.types import Counts
from decoders.base import BaseDecoder, extend_output
from decoders.block_size import AcceptanceStats, PrefixGain, best_prefix, check_block_mode, generator_plan
from decoders.ngram_pool import NGramPool
from decoders.sampled_verify import flat_check
from decoders.verify import (
    candidate_slices,
    greedy_verify_flat,
    prefix_match,
    step_with_argmax,
)
from kv_policies.full import FullKV

RANKS = 7  # block=auto: candidates ranked past this share one acceptance estimate


@dataclass
class Layout:
    """Static description of one block shape (window stage x number of guesses)."""

    block_mask: torch.Tensor  # bool [n, n] visibility inside the block
    offsets: torch.Tensor  # long [n] position of each row relative to the root
    logits_rows: torch.Tensor  # rows whose logits are computed: root, top level, guesses
    top_sel: slice  # the logits rows of the top level's outputs, column order (consecutive by construction)
    guess_row: int  # first block row of the verification branch
    guess_sel: int  # first index of the guesses in logits_rows


def build_layout(level_lens: list[int], n_guess: int, k: int, device: torch.device) -> Layout:
    """Mask, positions and logits rows for a window with the given level lengths and `n_guess`
    k-token guesses. Level 0 holds columns 1..level_lens[0], level l >= 1 columns 0..len-1."""
    # block row of column 0 of each level >= 1; level 0 column c (c >= 1) is row c, the root row 0
    level_start = [0] + [1 + level_lens[0] + sum(level_lens[1:i]) for i in range(1, len(level_lens))]
    guess_row = 1 + sum(level_lens)
    n = guess_row + n_guess * k
    mask = torch.zeros(n, n, dtype=torch.bool)
    offsets = torch.zeros(n, dtype=torch.long)
    mask[0, 0] = True
    for c in range(1, level_lens[0] + 1):
        mask[c, 0 : c + 1] = True  # root + level-0 columns 1..c (rows 1..c)
        offsets[c] = c
    for lvl in range(1, len(level_lens)):
        for c in range(level_lens[lvl]):
            r = level_start[lvl] + c
            mask[r, 0 : min(c, level_lens[0]) + 1] = True
            for up in range(1, lvl + 1):
                mask[r, level_start[up] + c] = True
            offsets[r] = lvl + c
    for j in range(n_guess):
        base = guess_row + j * k
        for t in range(k):
            mask[base + t, 0] = True
            mask[base + t, base : base + t + 1] = True
            offsets[base + t] = 1 + t
    if len(level_lens) == 1:
        top_rows = list(range(level_lens[0] + 1))  # root + level 0
    else:
        top = len(level_lens) - 1
        top_rows = [level_start[top] + c for c in range(level_lens[top])]
    sel = [0] + [r for r in top_rows if r != 0]
    top_idx = [sel.index(r) for r in top_rows]
    assert top_idx == list(range(top_idx[0], top_idx[0] + len(top_idx)))
    top_sel = slice(top_idx[0], top_idx[0] + len(top_idx))
    guess_sel = len(sel)
    sel += list(range(guess_row, n))
    return Layout(
        # made once per shape; a non-blocking copy does not synchronise the stream
        mask.to(device, non_blocking=True),
        offsets.to(device, non_blocking=True),
        torch.tensor(sel).to(device, non_blocking=True),
        top_sel,
        guess_row,
        guess_sel,
    )


class JacobiWindow:
    """The 2-D lookahead window: `levels[0]` = level-0 columns 1.., `levels[l]` = columns 0.."""

    def __init__(self, n: int, w: int, init: list[int]) -> None:
        self.n, self.w = n, w
        self.levels: list[list[int]] = [list(init)]

    @property
    def full(self) -> bool:
        return len(self.levels) == self.n - 1

    def lens(self) -> list[int]:
        return [len(lv) for lv in self.levels]

    def flat(self) -> list[int]:
        return [t for lv in self.levels for t in lv]

    def advance(self, root: int, top_out: list[int]) -> list[tuple[tuple[int], tuple[int, ...]]]:
        """Feed the top level's outputs; return the harvested ((key,), (N-1)-gram) pairs, as the pool
        stores them."""
        if not self.full:  # warm-up: grow one level, then shift every level left by one column
            self.levels.append(list(top_out))
            self.levels = [lv[1:] for lv in self.levels]
            return []
        lv = self.levels
        # column c's key is the token before it (the root for column 0); its gram runs down levels 1..
        # then the top output: one zip over the columns, no generator per column
        keys = [(root,), *((t,) for t in lv[0][: self.w - 1])]
        grams = list(zip(keys, zip(*lv[1:], top_out)))
        self.levels = [lv[1][1:], *lv[2:], list(top_out)]
        return grams


@dataclass
class LookaheadConfig:
    N: int = 5  # n-gram size (LADE's LEVEL); candidates are N-1 tokens long
    W: int = 7  # Jacobi window width (WINDOW_SIZE)
    G: int = 7  # guesses verified per step = n-grams kept per key in the pool (GUESS_SET_SIZE)
    pool_from_prompt: bool = False  # LADE's POOL_FROM_PROMPT: also feed the pool with prompt/output n-grams
    seed: int = 0  # window initialisation (W+N-3 tokens drawn from the prompt)
    # fixed: the sizes above every step | auto (ours): the Jacobi window sized and run as often as the
    # cost curve allows, each step verifying the candidates with the most expected tokens per second
    block: str = recorded_without("fixed")
    generator_share: float = 0.1  # block=auto: average cost the Jacobi window may add (share of a 1-row step)


class Lookahead(BaseDecoder):
    """Lookahead Decoding with n-gram size N, window W and at most G guesses per step."""

    name = "lookahead"
    sizes_blocks_by_cost = True
    Config = LookaheadConfig

    def __init__(self, engine, kv=None, sampler=None, **given: Any) -> None:
        o = options(self.Config, given)
        super().__init__(engine, kv, sampler)
        self.N = integer("decoder.N", o.N, 3)
        self.W, self.G = integer("decoder.W", o.W, 1), integer("decoder.G", o.G, 1)
        self.block = check_block_mode(o.block)
        self.generator_share = number("decoder.generator_share", o.generator_share, 0, low_open=True)
        self.pool_from_prompt = flag("decoder.pool_from_prompt", o.pool_from_prompt)
        self.seed = integer("decoder.seed", o.seed)
        self._layouts: dict[tuple[tuple[int, ...], int], Layout] = {}
        self.pool: NGramPool | None = None  # the last generation's pool (inspection, tests)

    @property
    def lossless(self) -> bool:  # type: ignore[override]
        return self.kv.lossless

    def _stage_lens(self, filled: int, w: int | None = None) -> list[int]:
        """Level lengths with `filled` levels above level 0 (warm-up: filled < N-2)."""
        w, n = self.W if w is None else w, self.N
        return [w + n - 3 - filled] + [w + n - 2 - filled] * filled

    def _window_plan(self, cost, ctx: int) -> tuple[int, int]:
        """block=auto: (window width, run the window every `period` steps) from the cost curve."""
        rows = lambda w: sum(self._stage_lens(self.N - 2, w))  # noqa: E731  (steady-state window rows)
        return generator_plan(range(1, self.W + 1), rows, cost, ctx, self.generator_share)

    def max_block(self) -> int:
        k = self.N - 1
        return max(1 + sum(self._stage_lens(f)) for f in range(self.N - 1)) + self.G * k

    def _layout(self, lens: list[int], n_guess: int) -> Layout:
        key = (tuple(lens), n_guess)
        lay = self._layouts.get(key)
        if lay is None:
            lay = self._layouts[key] = build_layout(lens, n_guess, self.N - 1, self.engine.device)
        return lay

    def _guess_slots(self, lens: list[int], n_guess: int) -> int:
        """How many guesses the step's layout holds: `n_guess`, or where the engine runs the block in more
        rows (`Engine.rows_run`: fixed-shape forwards pad it) the most of the G that fit in those rows,
        the extra ones padding. A step then takes one of a few layouts, and the forward's staged mask,
        positions and logits rows stay those of the step before, whatever the pool returned."""
        k, base = self.N - 1, 1 + sum(lens)
        room = (self.engine.rows_run(base + n_guess * k) - base) // k  # n_guess unless padded
        return max(n_guess, min(self.G, room))

    def _view(self, block_mask: torch.Tensor):
        eng = self.engine
        if isinstance(self.kv, FullKV):
            return BlockView(block_mask, eng.scale)
        restricted = torch.ones(block_mask.shape[0], dtype=torch.bool, device=eng.device)
        return restricted_view(self.kv, eng, block_mask, restricted, "dense", rows=slice(None))

    def _decode(
        self, prompt: list[int], out: list[int], max_new_tokens: int, stop_ids: set[int], counts: Counts
    ) -> None:
        eng, k = self.engine, self.N - 1
        cost = self.block_cost()
        width, period = (self.W, 1) if cost is None else self._window_plan(cost, len(prompt))
        self.plan = (width, period)
        stats = AcceptanceStats()  # block=auto: acceptance per candidate rank and position
        gains = PrefixGain()  # ... and the longest accepted among the first g candidates
        rng = random.Random(self.seed)
        window = JacobiWindow(self.N, width, [rng.choice(prompt) for _ in range(width + self.N - 3)])
        pool = self.pool = NGramPool(self.G)
        seq = list(prompt) + out  # committed tokens + the root (last element)
        if self.pool_from_prompt:
            pool.add_sequence(seq, k)
        done, step = False, 0
        while not done:
            root, p, cache_len = seq[-1], len(seq) - 1, eng.length
            guesses = pool.get((root,))
            lens = window.lens() if step % period == 0 else [0]  # [0]: no window rows this step
            step += 1
            if cost is not None and guesses:
                survivals = [stats.survival(min(j, RANKS), k) for j in range(len(guesses))]
                win = 1 + sum(lens)
                rows = [win + g * k for g in range(len(guesses) + 1)]
                guesses = guesses[: best_prefix(survivals, rows, cost, cache_len, gains)]
            slots = self._guess_slots(lens, len(guesses))
            lay = self._layout(lens, slots)
            drafted = [t for guess in guesses for t in guess]
            padding = [root] * (k * (slots - len(guesses)))  # rows no verification reads
            block = [root, *(window.flat() if lens != [0] else []), *drafted, *padding]
            tokens = eng.stage(block)
            view = self._view(lay.block_mask)
            logits, preds = step_with_argmax(
                self.sampler, eng, tokens, RelativePositions(lay.offsets, p), view, lay.logits_rows
            )
            pool.flush()  # the last window's n-grams, while the device runs this forward
            at = lay.guess_sel
            if self.sampler.greedy:
                picked = preds.tolist()  # the step's one read: the next Jacobi window needs it too
                verdict = greedy_verify_flat(guesses, picked, at, k)
            else:  # the argmax and the probabilities the walk needs in one read, then the last token's row
                check = flat_check(self.sampler, eng, logits, guesses, at)
                picked, values = check.read(preds)
                verdict = check.verdict(values)
            before = len(seq)
            n_new, done = extend_output(out, verdict.tokens, max_new_tokens, stop_ids)
            rows = verdict.flat_rows(0, lay.guess_row, k)[:n_new]  # root + accepted tokens kept in `out`
            eng.commit(rows)
            self.kv.after_commit(eng, len(rows))
            seq.extend(verdict.tokens[:n_new])
            real_rows = len(block) - len(padding)
            counts.step(real_rows, len(drafted), verdict.accepted, n_new, view.kv_read(cache_len))
            if cost is not None and guesses:
                pairs = zip(guesses, candidate_slices(picked, at, len(guesses), k), strict=True)
                lengths = [prefix_match(guess, picked[0], pred) for guess, pred in pairs]
                for j, n_ok in enumerate(lengths):
                    stats.update(min(j, RANKS), k, n_ok)
                gains.update(lengths)
            if lens != [0]:
                pool.defer(window.advance(root, picked[lay.top_sel]))  # seen by the next `get`, stored later
            if self.pool_from_prompt:
                pool.add_sequence(seq, k, start=before - k + 1)
