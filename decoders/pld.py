"""Prompt-lookup decoding (Saxena 2023; HF transformers' `PromptLookupCandidateGenerator`).

The simplest draftless baseline: the draft is copied from the context. Each step takes the
longest trailing n-gram of the sequence so far (prompt + generated, n = `max_matching_ngram_size`
down to 1), finds its first (leftmost) earlier occurrence that is followed by at least one token,
and proposes up to `num_tokens` tokens that followed it (cut before the first stop token and to the
remaining length budget). One target forward verifies the chain
`[last token | draft]` (causal, positions p..p+k) through our own engine; greedy verification keeps
the matching prefix plus the bonus token, sampling uses the one-hot-draft rule of
`decoders.sampled_verify.CandidateCheck` (lossless in distribution). The root's and the accepted draft
tokens' KV is committed; the bonus token is fed next step. With no match the step is a vanilla step.

`block=auto` (ours): the draft is cut to the length that maximises expected committed
tokens per second of forward, from the environment's cost curve and the acceptance rate per draft
position observed so far in this generation, keyed by the matched n-gram's length
(`decoders.block_size`). `num_tokens` stays the longest draft.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from core.checks import integer
from core.options import options, recorded_without
from core.policy_views import decode_view
from core.types import Counts
from decoders.base import BaseDecoder, extend_output
from decoders.block_size import AcceptanceStats, CostFn, best_option, check_block_mode
from decoders.sampled_verify import verify_flat
from decoders.verify import step_for


def find_candidate(seq: Sequence[int], max_ngram: int, num_tokens: int) -> list[int]:
    """Up to `num_tokens` tokens following the leftmost earlier match of the longest trailing n-gram."""
    return match_candidate(seq, max_ngram, num_tokens)[1]


def match_candidate(seq: Sequence[int], max_ngram: int, num_tokens: int) -> tuple[int, list[int]]:
    """(n, draft): the length of the matched trailing n-gram (0 = no match) and `find_candidate`'s draft."""
    length = len(seq)
    t = torch.as_tensor(seq, dtype=torch.long)
    for n in range(min(max_ngram, length - 1), 0, -1):
        windows = t[: length - 1].unfold(0, n, 1)  # every n-gram that ends before the last token
        hits = (windows == t[length - n :]).all(dim=1).nonzero().flatten()
        for start in (hits + n).tolist():
            if start < length:
                return n, [int(x) for x in seq[start : min(start + num_tokens, length)]]
    return 0, []


class NGramIndex:
    """A growing sequence and the leftmost start of each of its n-grams (n <= `max_ngram`), so a step's
    lookup is `match_candidate`'s answer in O(max_ngram) dictionary reads instead of a scan of the whole
    sequence (the index grows by O(max_ngram) entries per appended token)."""

    def __init__(self, max_ngram: int, seq: Sequence[int] = ()) -> None:
        self.max_ngram = max_ngram
        self.seq: list[int] = []
        self.first: dict[tuple[int, ...], int] = {}
        self.extend(seq)

    def extend(self, tokens: Sequence[int]) -> None:
        seq, first = self.seq, self.first
        for tok in tokens:
            seq.append(int(tok))
            end = len(seq)
            for n in range(1, min(self.max_ngram, end) + 1):
                first.setdefault(tuple(seq[end - n :]), end - n)

    def match(self, num_tokens: int) -> tuple[int, list[int]]:
        """`match_candidate(self.seq, max_ngram, num_tokens)`: the leftmost occurrence of a trailing
        n-gram is an earlier one exactly when it ends before the last token."""
        seq, length = self.seq, len(self.seq)
        for n in range(min(self.max_ngram, length - 1), 0, -1):
            start = self.first.get(tuple(seq[length - n :]))
            if start is not None and start + n < length:
                return n, seq[start + n : min(start + n + num_tokens, length)]
        return 0, []


@dataclass
class PromptLookupConfig:
    max_matching_ngram_size: int = 2  # longest trailing n-gram matched (HF default 2)
    num_tokens: int = 10  # draft length (HF prompt_lookup_num_tokens; generator default 10)
    # fixed: always the longest draft found | auto (ours, not HF's): each draft cut to the length with
    # the most expected tokens per second of forward, from the cost curve and the acceptance seen so far
    block: str = recorded_without("fixed")


class PromptLookup(BaseDecoder):
    """Prompt-lookup decoding: drafts copied from the context, verified in one forward."""

    name = "pld"
    sizes_blocks_by_cost = True
    Config = PromptLookupConfig

    def __init__(self, engine, kv=None, sampler=None, **given: Any) -> None:
        o = options(self.Config, given)
        super().__init__(engine, kv, sampler)
        self.max_ngram = integer("decoder.max_matching_ngram_size", o.max_matching_ngram_size, 1)
        self.num_tokens = integer("decoder.num_tokens", o.num_tokens, 1)
        self.block = check_block_mode(o.block)
        self.stats = AcceptanceStats()  # block=auto: acceptance by (matched n, draft position)

    @property
    def lossless(self) -> bool:  # type: ignore[override]
        return self.kv.lossless

    def max_block(self) -> int:
        return 1 + self.num_tokens

    def _decode(
        self, prompt: list[int], out: list[int], max_new_tokens: int, stop_ids: set[int], counts: Counts
    ) -> None:
        eng = self.engine
        cost = self.block_cost()
        self.stats = AcceptanceStats()
        index = NGramIndex(self.max_ngram, list(prompt) + out)
        seq = index.seq
        done = False
        while not done:
            p, cache_len = len(seq) - 1, eng.length
            budget = max(max_new_tokens - len(out) - 1, 0)  # the bonus token always comes on top
            n_match, draft = index.match(min(self.num_tokens, budget)) if budget else (0, [])
            for i, tok in enumerate(draft):
                if tok in stop_ids:
                    draft = draft[:i]
                    break
            if cost is not None and draft:
                draft = draft[: self._auto_length(n_match, len(draft), cost, cache_len)]
            k = len(draft)
            tokens, positions = eng.chain([seq[-1], *draft], p)
            view = decode_view(self.kv, eng, k + 1)
            logits, preds = step_for(self.sampler, eng, tokens, positions, view)
            verdict = verify_flat(self.sampler, eng, logits, [draft] if k else [], 1, preds)
            n_new, done = extend_output(out, verdict.tokens, max_new_tokens, stop_ids)
            rows = verdict.flat_rows(0, 1, k)[:n_new]  # root + accepted tokens kept in `out`
            eng.commit(rows)
            self.kv.after_commit(eng, len(rows))
            index.extend(verdict.tokens[:n_new])
            counts.step(k + 1, k, verdict.accepted, n_new, view.kv_read(cache_len))
            if k:
                self.stats.update(n_match, k, verdict.accepted)

    def _auto_length(self, n_match: int, available: int, cost: CostFn, ctx: int) -> int:
        """Draft length with the most expected committed tokens (bonus included) per second."""
        survival = self.stats.survival(n_match, available)
        options = [(1, 1.0)] + [(1 + k, 1.0 + sum(survival[:k])) for k in range(1, available + 1)]
        return best_option(options, cost, ctx)
