"""FAFO, "Fumble Around and Find Out" (section 4 of "FAFO: Lossy KV Cache Compression for Lossless
Inference Acceleration via Draftless Fumble Decoding").

Lossless n-gram candidate-pool decoding in ONE target forward per step over the block
`[x_last | m candidates (Find Out) | n fumble streams (Fumble Around)]` (layout in
`decoders.fafo.layout`):

- **Fumble Around** (§4.2, Eq. 1): n streams of k tokens, column-wise (App. E). A stream token sees
  only the compressed region of the cache, chosen by the run's KV policy (`self.kv`: streaming,
  quest, snapkv, h2o; with kv=full it sees the whole cache), plus x_last and its own stream's earlier
  tokens. The argmax at each stream's last row is its next token (greedy, also when sampling: ours);
  every step each stream appends it and drops its oldest token.
- **Prefix caching** (§4.2, Alg. 2, App. F): each stream keeps its last k discarded tokens; its new
  k-gram goes into the CPU pool under every suffix (1..k) of that buffer, at most n guesses per key,
  least recently used evicted (`decoders.ngram_pool.NGramPool`).
- **Find Out** (§4.3, Alg. 3-4): up to m candidates retrieved by the longest suffix of the decoded
  sequence first, backing off to shorter suffixes; verified against the FULL cache in the same
  forward. Greedy: the longest accepted candidate plus the bonus token; sampling: multi-candidate
  verification of one-hot drafts (both `decoders.verify`), lossless in distribution.
- **One KV cache**: `engine.commit` keeps only x_last's and the accepted candidate tokens' KV (computed
  against the full cache, so exact); fumble rows' KV is never kept (recomputed every step).

Harness choices for what the paper leaves open, all options of `FAFOConfig` (recorded with every run):
streams start as k tokens drawn from the prompt by a seeded generator (Lookahead-style); stream
positions are re-based every step on x_last (`stream_positions=rebase`, rows at p+1..p+k) or slide
by one per step (`slide`); m defaults to n; retrieval order within a key is most recent first.
`tree=true` (ours, off in the paper setting) lays the candidates out as a prefix trie: candidates
sharing a prefix share its rows, so fewer rows are computed for the same verification (lossless).
`block=auto` (ours; the paper's fixed sizes stay the default): the number of streams and how
often they run come from the cost curve (`decoders.block_size.generator_plan`: the streams may add
`generator_share` of a 1-row step's cost on average: all n every step on a GPU-like curve, fewer and
not every step on a CPU), and each step verifies the number of retrieved candidates with the most
expected committed tokens per second (acceptance per candidate rank and position, this generation).
`FAFO2Forward` is the Table 1 ablation: a compressed forward over [x_last | streams] updates the
pool, then a second, full-cache forward verifies [x_last | candidates].
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from core.checks import choice, flag, integer, number
from core.options import options, recorded_without
from core.positions import RelativePositions
from core.types import Counts, HarnessError
from decoders.base import BaseDecoder, extend_output
from decoders.block_size import (
    AcceptanceStats,
    CostFn,
    PrefixGain,
    best_prefix,
    check_block_mode,
    generator_plan,
)
from decoders.fafo.layout import FafoLayout, LayoutCache, build_layout
from decoders.fafo.streams import FumbleStreams
from decoders.fafo.views import ViewFactory
from decoders.ngram_pool import Gram, NGramPool
from decoders.sampled_verify import CandidateCheck
from decoders.verify import (
    Verdict,
    greedy_verify,
    greedy_verify_flat,
    prefix_match,
    step_with_argmax,
)

RANKS = 7  # block=auto: candidates ranked past this share one acceptance estimate
FLEX_Q_TILE = 16  # core.sparse_attention.RegionBlockMask's query tile for mixed blocks


@dataclass
class FAFOConfig:
    """The paper's best settings (Tables 11-12): k 6, n 40, m = n."""

    k: int = 6  # guess length = stream window = candidate length = longest pool key
    n: int = 40  # fumble streams; also the pool's guesses per key (App. F)
    m: int | None = None  # candidates verified per step (None = n, the paper's setting)
    stream_positions: str = "rebase"  # ours: rebase: stream rows at p+1..p+k every step; slide: base += 1
    fumble_sees_last: bool = True  # ours: fumble rows attend to x_last (Fig. 4)
    pool_from_prompt: bool = False  # ablation (ours): also seed the pool with prompt/output n-grams
    pool_capacity: int | None = None  # guesses kept per pool key (None = n, App. F)
    # None = the kv policy's backend (kv.backend): dense (SDPA + boolean mask, the reference) | flex
    # (compressed head region + static FlexAttention BlockMask, paper §4.4) | sliced (region slice + SDPA)
    # | flash (CUDA only)
    backend: str | None = None
    pad_candidates: bool | None = None  # None = pad to m candidates only for flex (static block shape)
    tree: bool = False  # ours: candidates as a prefix trie (shared prefixes share rows); lossless
    seed: int = 0  # stream initialisation (k random prompt tokens per stream)
    # fixed: the sizes above every step | auto (ours): the fumble streams sized and run as often as the
    # cost curve allows, each step verifying the candidates with the most expected tokens per second
    block: str = recorded_without("fixed")
    generator_share: float = 0.1  # block=auto: average cost the fumble streams may add (of a 1-row step)


class FAFO(BaseDecoder):
    """FAFO with guess length k, n fumble streams and up to m verified candidates per step."""

    name = "fafo"
    sizes_blocks_by_cost = True  # block=auto is available
    lossless = True  # verification always reads the full cache, whatever the KV policy
    Config = FAFOConfig

    def __init__(self, engine, kv=None, sampler=None, **given: Any) -> None:
        o = options(self.Config, given)
        stream_positions, fumble_sees_last = o.stream_positions, o.fumble_sees_last
        pool_from_prompt = o.pool_from_prompt
        pool_capacity, backend, pad_candidates, tree = o.pool_capacity, o.backend, o.pad_candidates, o.tree
        seed, block, generator_share = o.seed, o.block, o.generator_share
        k, n = integer("decoder.k", o.k, 1), integer("decoder.n", o.n, 1)
        m = n if o.m is None else integer("decoder.m", o.m, 0)
        super().__init__(engine, kv, sampler)
        self.k, self.n, self.m = k, n, m
        self.stream_positions = choice("decoder.stream_positions", stream_positions, ("rebase", "slide"))
        self.fumble_sees_last = flag("decoder.fumble_sees_last", fumble_sees_last)
        self.pool_from_prompt = flag("decoder.pool_from_prompt", pool_from_prompt)
        # the paper keeps n guesses per key
        self.pool_capacity = (
            n if pool_capacity is None else integer("decoder.pool_capacity", pool_capacity, 1)
        )
        self.seed = integer("decoder.seed", seed)
        self.views = ViewFactory(engine, self.kv, backend)
        # static block shape (the paper's padding to m candidates): needed by the compiled flex kernel
        self.pad_candidates = self.views.backend == "flex" if pad_candidates is None else pad_candidates
        if flag("decoder.tree", tree) and self.pad_candidates:
            raise HarnessError(
                "fafo: tree=true makes the block shape vary; it cannot be combined with "
                "pad_candidates (backend=flex pads by default: set pad_candidates=false)"
            )
        self.tree = tree
        self.block = check_block_mode(block)
        if self.block == "auto" and not self.sizes_blocks_by_cost:
            raise HarnessError(f"decoder={self.name} has no block=auto (its two forwards keep fixed sizes)")
        if self.block == "auto" and self.pad_candidates:
            raise HarnessError(
                "fafo: block=auto varies the block shape; it cannot be combined with pad_candidates "
                "(backend=flex pads by default: set pad_candidates=false or use backend=sliced)"
            )
        self.generator_share = number("decoder.generator_share", generator_share, 0, low_open=True)
        align = FLEX_Q_TILE if self.views.backend == "flex" else 0
        self.layouts = LayoutCache(k, fumble_sees_last, engine.device, tree=tree, align=align)

    def compiles_attention(self) -> bool:
        return self.views.backend == "flex" and not self.kv.lossless

    def max_block(self) -> int:
        return build_layout(self.k, self.m, self.n, align=self.layouts.align).size

    # --- shared pieces ------------------------------------------------------------------------
    def _start(
        self, prompt: list[int], out: list[int], n: int | None = None
    ) -> tuple[FumbleStreams, NGramPool, list[int]]:
        rng = random.Random(self.seed)
        init = [[rng.choice(prompt) for _ in range(self.k)] for _ in range(n or self.n)]
        pool = NGramPool(capacity=self.pool_capacity, max_key_len=self.k)
        seq = list(prompt) + out  # committed tokens + the root (last element)
        if self.pool_from_prompt:
            pool.add_sequence(seq, self.k)
        return FumbleStreams(init), pool, seq

    def _candidates(self, pool: NGramPool, seq: list[int]) -> tuple[list[Gram], list[Gram]]:
        """(candidates to verify, g k-grams; block candidates, g or m: padded with dummy k-grams of the
        root token when `pad_candidates`, so every step has the same shape (ours); their rows are ignored).
        Host tuples: the layout, the verification and the counts read them as such."""
        cands = pool.lookup(seq, self.m) if self.m else []
        if not self.pad_candidates or len(cands) == self.m:
            return cands, cands
        return cands, cands + [(seq[-1],) * self.k] * (self.m - len(cands))

    def _block(
        self, lay: FafoLayout, root: int, streams: FumbleStreams | None, p: int, base: int
    ) -> tuple[torch.Tensor, torch.Tensor | RelativePositions]:
        flat = lay.tokens(root, streams.flat_columns() if streams is not None and lay.n else None)
        tokens = self.engine.stage(flat)
        if base == p or lay.stream_row >= lay.size:  # the layout's offsets after p, added in the forward
            return tokens, RelativePositions(lay.offsets, p)
        pos = lay.offsets + p
        pos[lay.stream_row :] += base - p  # the stream rows (`is_stream`) count from `base`
        return tokens, pos

    def _read_and_verify(
        self, lay: FafoLayout, logits: torch.Tensor | None, preds: torch.Tensor, cands: list[Gram]
    ) -> tuple[list[int], Verdict]:
        """The step's one read (every returned row's argmax: the streams' next tokens and, greedy, the
        verification), then the verification of the real candidates (padding rows are never read);
        logits row == block row over the verification part. Sampling reads the probabilities its walk
        needs with the argmax, and its last token's row after (`decoders.sampled_verify`)."""
        g = len(cands)
        if not self.sampler.greedy:
            assert logits is not None
            rows = lay.cand_row_ids
            assert rows is not None
            probs = self.sampler.probs
            eng = self.engine
            check = CandidateCheck(
                cands,
                lambda j, t: rows[j][t],
                lambda r: probs(logits[r]),
                self.sampler,
                eng.stage,
                eng.device,
            )
            picked, values = check.read(preds)
            return picked, check.verdict(values)
        picked = preds.tolist()
        first = lay.flat_first(g)
        if first is not None:  # the rows of candidates rejected at their first token are never sliced
            return picked, greedy_verify_flat(cands, picked, first, self.k)
        return picked, greedy_verify(cands, picked[0], lay.candidate_rows(picked, g))

    def _finish_step(
        self,
        lay: FafoLayout,
        verdict: Verdict,
        seq: list[int],
        out: list[int],
        pool: NGramPool,
        max_new_tokens: int,
        stop_ids: set[int],
    ) -> tuple[int, bool]:
        """Commit the verdict's KV rows, extend the output. Returns (tokens appended, done)."""
        eng = self.engine
        rows = verdict.commit_rows(0, lay.cand_row_ids)
        eng.commit(rows)
        self.kv.after_commit(eng, len(rows))
        before = len(seq)
        n_new, done = extend_output(out, verdict.tokens, max_new_tokens, stop_ids)
        seq.extend(verdict.tokens[:n_new])
        if self.pool_from_prompt:  # ablation (ours): generated text's n-grams too (like LADE's option)
            pool.add_sequence(seq, self.k, start=before - self.k + 1)
        return n_new, done

    def _grow_pool(self, pool: NGramPool, streams: FumbleStreams, new_tokens: Sequence[int]) -> None:
        """The streams' new k-grams, under their discard buffers' suffixes: visible to the next lookup at
        once, stored by the `flush` after the next forward's launch (the host's n x k dictionary updates
        then run while the device computes, not while it waits for the next block; the pairs' tuples are
        made then too, but for the few a lookup reads)."""
        pool.defer(streams.advance(new_tokens))

    def _next_base(self, base: int, p_new: int) -> int:
        return p_new if self.stream_positions == "rebase" else base + 1

    # --- the decode loop ----------------------------------------------------------------------
    def _decode(
        self, prompt: list[int], out: list[int], max_new_tokens: int, stop_ids: set[int], counts: Counts
    ) -> None:
        eng = self.engine
        cost = self.block_cost()
        n_streams, period = (self.n, 1) if cost is None else self._stream_plan(cost, len(prompt))
        self.plan = (n_streams, period)
        stats = AcceptanceStats()  # block=auto: acceptance per candidate rank and position
        gains = PrefixGain()  # ... and the longest accepted among the first g candidates
        streams, pool, seq = self._start(prompt, out, n_streams)
        base = len(seq) - 1
        done, step = False, 0
        while not done:
            root, p, cache_len = seq[-1], len(seq) - 1, eng.length
            n = n_streams if step % period == 0 else 0  # 0: no fumble rows this step
            step += 1
            cands, block_cands = self._candidates(pool, seq)
            if cost is not None and len(cands):
                cands = block_cands = cands[: self._auto_candidates(cands, stats, gains, n, cost, cache_len)]
            lay = self.layouts.get(block_cands, n)
            tokens, pos = self._block(lay, root, streams, p, base)
            view = self.views.fused(lay, cache_len)
            logits, preds = step_with_argmax(self.sampler, eng, tokens, pos, view, lay.logits_rows)
            pool.flush()  # the last step's stream k-grams, while the device runs this forward
            picked, verdict = self._read_and_verify(lay, logits, preds, cands)
            n_new, done = self._finish_step(lay, verdict, seq, out, pool, max_new_tokens, stop_ids)
            # x_last and the candidates read the whole cache: the union read is the full cache
            counts.step(lay.size, len(cands) * self.k, verdict.accepted, n_new, cache_len)
            if cost is not None and len(cands):
                pairs = zip(cands, lay.candidate_rows(picked, len(cands)), strict=True)
                lengths = [prefix_match(cand, picked[0], pred) for cand, pred in pairs]
                for j, n_ok in enumerate(lengths):
                    stats.update(min(j, RANKS), self.k, n_ok)
                gains.update(lengths)
            if n:
                self._grow_pool(pool, streams, picked[len(picked) - n :])  # each stream's last row
            base = self._next_base(base, len(seq) - 1)

    # --- block=auto ---------------------------------------------------------------------------
    def _stream_plan(self, cost: CostFn, ctx: int) -> tuple[int, int]:
        """(streams, run them every `period` steps) from the cost curve (`generator_plan`)."""
        return generator_plan(range(1, self.n + 1), lambda s: s * self.k, cost, ctx, self.generator_share)

    def _auto_candidates(
        self,
        cands: list[Gram],
        stats: AcceptanceStats,
        gains: PrefixGain,
        n: int,
        cost: CostFn,
        ctx: int,
    ) -> int:
        """How many of the ranked candidates to verify (most expected tokens per second of forward);
        with `tree`, a candidate costs only the rows of its prefix not shared with earlier ones."""
        rows, seen = [1 + n * self.k], set()
        for cand in cands:
            new = 0
            for t in range(self.k) if self.tree else ():
                new += tuple(cand[: t + 1]) not in seen
                seen.add(tuple(cand[: t + 1]))
            rows.append(rows[-1] + (new if self.tree else self.k))
        survivals = [stats.survival(min(j, RANKS), self.k) for j in range(len(cands))]
        return best_prefix(survivals, rows, cost, ctx, gains)


class FAFO2Forward(FAFO):
    """FAFO-2forward (Table 1): a compressed forward over [x_last | streams] grows the pool, then a
    full-cache forward verifies [x_last | candidates]. Two sequential forwards per step; the step is
    counted once (tau per decoding step, as the paper's Table 1 reports it), with both forwards'
    tokens and KV reads summed."""

    name = "fafo_2forward"
    sizes_blocks_by_cost = False

    def max_block(self) -> int:
        a = self.layouts.align
        return max(
            build_layout(self.k, self.m, 0, align=a).size, build_layout(self.k, 0, self.n, align=a).size
        )

    def _decode(
        self, prompt: list[int], out: list[int], max_new_tokens: int, stop_ids: set[int], counts: Counts
    ) -> None:
        eng = self.engine
        streams, pool, seq = self._start(prompt, out)
        base = len(seq) - 1
        done = False
        while not done:
            root, p, cache_len = seq[-1], len(seq) - 1, eng.length
            # forward A: fumble on the compressed view only (x_last included), nothing kept
            lay_a = self.layouts.get([], self.n)
            tokens, pos = self._block(lay_a, root, streams, p, base)
            view_a = self.views.compressed(lay_a, cache_len)
            _, fumbled = eng.step(
                tokens, pos, view_a, logits_rows=lay_a.logits_rows[1:], argmax=True, with_logits=False
            )
            eng.commit([])
            # a forward of the target over the policy's selection that commits nothing: a draft forward
            # (counted apart, as self-speculation's are; tau counts the verification forwards)
            counts.draft_step(view_a.kv_read(cache_len), block_tokens=lay_a.size)
            self._grow_pool(pool, streams, fumbled.tolist())
            # forward B: verification against the full cache
            cands, block_cands = self._candidates(pool, seq)
            lay_b = self.layouts.get(block_cands, 0)
            tokens, pos = self._block(lay_b, root, None, p, base)
            view_b = self.views.fused(lay_b, cache_len)
            logits, preds = step_with_argmax(self.sampler, eng, tokens, pos, view_b, lay_b.logits_rows)
            pool.flush()  # forward A's stream k-grams, while the device runs forward B
            verdict = self._read_and_verify(lay_b, logits, preds, cands)[1]
            n_new, done = self._finish_step(lay_b, verdict, seq, out, pool, max_new_tokens, stop_ids)
            counts.step(lay_b.size, len(cands) * self.k, verdict.accepted, n_new, cache_len)
            base = self._next_base(base, len(seq) - 1)
