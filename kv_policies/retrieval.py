"""TriForce's retrieval cache (Sun et al. 2024, §4.1): chunks of the context chosen
by how much the last query attends to each chunk's mean key.

Build (after prefill, and again on `rebuild`): the prompt's keys `[0, P)` are split into chunks of
`chunk` consecutive positions; chunk c scores `q . mean(k_c)` per KV head, where q is the query of
the last prompt token (or, on a rebuild, of the last row the policy observed). GQA (the reference
has none; `gqa_score`): `logit` (default) scores a KV head's chunk by the mean over its query heads
of their dot products with the mean key (the group's mean query against the mean key); `prob` by the
mean over its query heads of each head's softmax over the chunks, i.e. the share of the group's
attention a chunk would get, so one head that singles a chunk out keeps it even when the other heads
of its group look elsewhere. With one query head per KV head both are the paper's ranking. The first
chunk is always kept (attention sink), so is the last, partial chunk when P is not a multiple of
`chunk`; the top-scoring other chunks fill the budget (`budget // chunk` chunks in all). Entries
committed after the prompt (the generated tokens) are always visible, on a rebuild too: TriForce
writes them over the least important slots of a fixed cache; here they are kept on top of the
budget, a stated simplification (a generation of G tokens sees at most budget + G entries).

Rebuilds (the decoder's stride, `decoder.rebuild_every`, or its acceptance rule) are cheap: the
prompt's keys never change, so each chunk's mean key is computed once, at the first build, and kept
(per layer, `[n_kv_heads, chunks, head_dim]`); a rebuild scores the new query against them. `rebuild`
returns what it read in cached-entry units (a key is half an entry), averaged over layers, for the
decoder's KV-read count.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Any

import torch

from core.options import options
from core.types import HarnessError, PolicyEngine
from kv_policies.base import KVPolicy
from kv_policies.checks import check_backend, check_budget, check_budget_frac, check_dense_layers

GQA_SCORES = ("logit", "prob")


def chunk_means(k: torch.Tensor, chunk: int) -> torch.Tensor:
    """Mean keys `[n_kv_heads, L // chunk, d]` (fp32) of the full chunks of `k [n_kv_heads, L, d]`."""
    hkv, length, d = k.shape
    n = length // chunk
    return k[:, : n * chunk].float().reshape(hkv, n, chunk, d).mean(2)


def mean_key_scores(q: torch.Tensor, kbar: torch.Tensor, gqa: str = "logit") -> torch.Tensor:
    """Scores `[n_kv_heads, chunks]` of mean keys `kbar` against the query `q [n_heads, d]`: per query
    head q . mean key, then over each KV head's query heads the mean of those logits (`gqa="logit"`)
    or of their softmaxes over the chunks (`gqa="prob"`)."""
    hkv, _, d = kbar.shape
    qg = q.float().reshape(hkv, q.shape[0] // hkv, d)
    logits = qg @ kbar.transpose(1, 2)  # [hkv, group, n]
    if gqa == "prob":
        return logits.softmax(-1).mean(1)
    return logits.mean(1)


def chunk_scores(q: torch.Tensor, k: torch.Tensor, chunk: int, gqa: str = "logit") -> torch.Tensor:
    """Scores `[n_kv_heads, L // chunk]` of the full chunks of keys `k [n_kv_heads, L, d]` against the
    query `q [n_heads, d]` (`mean_key_scores` of their `chunk_means`)."""
    return mean_key_scores(q, chunk_means(k, chunk), gqa)


@dataclass
class RetrievalConfig:
    budget: int = 4096  # cached entries per KV head chosen from the prompt (TriForce's on-chip setting)
    chunk: int = 8  # keys per chunk
    backend: str = "dense"
    budget_frac: float | None = None  # a fraction of each generation's context instead (None: budget)
    dense_layers: int = 0  # the first layers see the whole cache (TriForce Table 1: 2)
    gqa_score: str = "logit"  # GQA: a KV head ranks chunks by its query heads' mean logit | prob


class Retrieval(KVPolicy):
    name = "retrieval"
    query_free = True  # chosen from the prefill and earlier steps, never from the forward it restricts

    Config = RetrievalConfig

    def __init__(self, **given: Any) -> None:
        o = options(self.Config, given)
        budget, chunk, backend, budget_frac, dense_layers, gqa_score = astuple(
            o
        )  # the options, in their declared order
        if gqa_score not in GQA_SCORES:
            raise HarnessError(
                f"kv=retrieval: gqa_score must be one of {', '.join(GQA_SCORES)}, got {gqa_score!r}"
            )
        self.gqa_score = gqa_score
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk <= 0:
            raise HarnessError(f"kv=retrieval: chunk must be a positive integer, got {chunk!r}")
        self.chunk = chunk
        self.set_budget(check_budget(self.name, budget, chunk, "the chunk size"))
        self.budget_frac = check_budget_frac(self.name, budget_frac)
        self.backend = check_backend(self.name, backend)
        self.dense_layers = check_dense_layers(self.name, dense_layers)
        self.prompt_len = 0
        self.built_len = 0
        self._q: dict[int, torch.Tensor] = {}
        self._keep: dict[int, torch.Tensor] = {}
        self._builds = 0  # keep masks chosen so far in this generation (the region's placement key)
        self._means: dict[int, torch.Tensor] = {}  # per layer: mean keys of the prompt's full chunks

    def min_budget(self) -> int:
        return 2 * self.chunk

    def set_budget(self, budget: int) -> None:
        self.budget, self.n_chunks = budget, budget // self.chunk

    def can_restrict(self, prompt_len: int, context: int) -> bool:
        return prompt_len > self.budget

    def reset(self, prompt_len: int, context_len: int | None = None) -> None:
        self.prompt_len, self.built_len = prompt_len, 0
        self._q, self._keep, self._means = {}, {}, {}
        self._builds = 0
        super().reset(prompt_len, context_len)

    def keeps_all(self, layer: int, cache_len: int) -> bool:
        return layer < self.dense_layers or self.built_len <= self.budget or layer not in self._keep

    def max_selected(self, capacity: int) -> int:
        return min(capacity, self.budget + max(capacity - self.prompt_len, 0))

    def layer_selections(self, cache_len: int) -> torch.Tensor | None:
        """The keep masks change only at a rebuild: stacked once, not re-staged layer by layer."""
        if not self._keep:
            return super().layer_selections(cache_len)
        return self.keep_stack.select(self._keep, cache_len)

    # --- queries ---------------------------------------------------------------------------------
    def on_prefill(self, layer: int, q: torch.Tensor, k_all: torch.Tensor, cache_len: int) -> None:
        last = self.prompt_len - 1 - cache_len  # row of the last prompt token in this chunk, if any
        if 0 <= last < q.shape[1]:
            self._q[layer] = q[:, last].clone()

    def observe(self, layer: int, q: torch.Tensor) -> None:
        self._q[layer] = q[:, -1]

    # --- building --------------------------------------------------------------------------------
    @torch.inference_mode()
    def after_prefill(self, engine: PolicyEngine) -> None:
        if self.prompt_len > self.budget:
            self.rebuild(engine)

    @torch.inference_mode()
    def rebuild(self, engine: PolicyEngine) -> float:
        length = self.prompt_len
        if length <= self.budget or engine.length < length or len(self._q) != engine.cache.n_layers:
            return 0.0
        keys_read = 0
        for layer, q in self._q.items():
            if layer < self.dense_layers:
                continue
            kbar = self._means.get(layer)
            if kbar is None:
                pos = torch.arange(length, device=engine.device)
                k_all = engine.cache.k[layer, :, : engine.length]
                kbar = chunk_means(self.slots.gather_keys(layer, k_all, pos), self.chunk)
                self._means[layer] = kbar
                keys_read += length
            keys_read += kbar.shape[1]
            self._keep[layer] = self.choose_from_means(q, kbar, length)
        self.built_len = length
        self._builds += 1
        self.keep_stack.forget()
        return keys_read / 2 / engine.cache.n_layers

    def choose(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """bool `[n_kv_heads, L]`: chunk 0, the partial last chunk, and the top-scoring other chunks."""
        return self.choose_from_means(q, chunk_means(k, self.chunk), k.shape[1])

    def choose_from_means(self, q: torch.Tensor, kbar: torch.Tensor, length: int) -> torch.Tensor:
        """`choose` from the mean keys `kbar [n_kv_heads, length // chunk, d]` of the full chunks."""
        hkv, n, _ = kbar.shape
        c = self.chunk
        partial = length - n * c
        keep_chunks = torch.zeros(hkv, n, dtype=torch.bool, device=kbar.device)
        keep_chunks[:, 0] = True
        room = self.n_chunks - 1 - (1 if partial else 0)
        if room > 0 and n > 1:
            scores = mean_key_scores(q, kbar, self.gqa_score)[:, 1:]
            keep_chunks.scatter_(1, 1 + scores.topk(min(room, n - 1), dim=1).indices, True)
        keep = torch.ones(hkv, length, dtype=torch.bool, device=kbar.device)
        keep[:, : n * c] = keep_chunks.repeat_interleave(c, dim=1)
        return keep

    def selection_key(self, layer: int, sel_len: int) -> Any:
        """The keep masks change only at a build; entries past the prompt are always selected."""
        return (self._builds, sel_len)

    @torch.inference_mode()
    def select(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, cache_len: int) -> torch.Tensor:
        sel = torch.ones(k_cache.shape[0], cache_len, dtype=torch.bool, device=k_cache.device)
        keep = self._keep.get(layer)
        if keep is not None:
            n = min(cache_len, keep.shape[1])
            sel[:, :n] = keep[:, :n]
        return sel
