"""SnapKV: one-shot prompt compression chosen at prefill from an observation window (Li et al. 2024).

Reference (`SnapKVCluster.update_kv`): when the prompt is longer than the capacity,
the last `window` prompt queries attend (softmax, causal inside the window) to every prompt key; the
attention each earlier key receives is summed over the window, smoothed with a 1-D pool
(`kernel`, stride 1, same length; max or avg), and the top `budget - window` earlier positions are
kept together with the window itself. Decode-time entries are never compressed: every
generated token stays visible ("recency during decoding" in FAFO-SnapKV).

GQA without expanding the cache (the reference implementation repeats KV heads first): the pooled
scores of a KV head's query heads are summed and one selection is made per KV head.
The window's queries are captured by `on_prefill` (an `engine.prefill_hooks` entry; the window may
straddle two prefill chunks) and scored in `after_prefill` against the finished prompt cache.
Defaults: window 32, kernel 7, max pooling (the LongBench configs; a harness choice).
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Any

import torch
import torch.nn.functional as F

from core.options import options
from core.types import HarnessError, PolicyEngine
from kv_policies.base import KVPolicy
from kv_policies.checks import check_backend, check_budget, check_budget_frac


def snapkv_scores(
    q_win: torch.Tensor, k: torch.Tensor, scale: float, kernel: int, pooling: str
) -> torch.Tensor:
    """Pooled votes `[n_kv_heads, L - W]` of the W window queries `[H, W, d]` (the last W positions)
    for the earlier keys of `k [n_kv_heads, L, d]`."""
    h, w, d = q_win.shape
    hkv, length, _ = k.shape
    g = h // hkv
    logits = q_win.float().reshape(hkv, g * w, d) @ k.float().transpose(1, 2)
    logits = logits.view(hkv, g, w, length) * scale
    rows = torch.arange(length - w, length, device=k.device).view(w, 1)
    logits = logits.masked_fill(torch.arange(length, device=k.device).view(1, -1) > rows, float("-inf"))
    votes = logits.softmax(-1)[..., : length - w].sum(2)  # [hkv, g, L - W]
    pool = F.max_pool1d if pooling == "max" else F.avg_pool1d
    pooled = pool(votes.reshape(hkv * g, 1, -1), kernel, stride=1, padding=kernel // 2)
    return pooled.view(hkv, g, -1).sum(1)


@dataclass
class SnapKVConfig:
    budget: int = 760  # cached entries per KV head (the papers' setting; ~10% of their ~8k contexts)
    window: int = 32  # last prompt queries that vote (the LongBench configs)
    kernel: int = 7  # pooling kernel over the votes (odd)
    pooling: str = "max"  # max | avg
    backend: str = "dense"
    budget_frac: float | None = None  # a fraction of each generation's context instead (None: budget)


class SnapKV(KVPolicy):
    name = "snapkv"
    keeps_alike = True  # `keeps_all`: one answer for every layer
    query_free = True  # chosen from the prefill and earlier steps, never from the forward it restricts

    Config = SnapKVConfig

    def __init__(self, **given: Any) -> None:
        o = options(self.Config, given)
        budget, window, kernel, pooling, backend, budget_frac = astuple(
            o
        )  # the options, in their declared order
        if not isinstance(window, int) or window < 1:
            raise HarnessError(f"kv=snapkv: window must be a positive integer, got {window!r}")
        if not isinstance(kernel, int) or kernel < 1 or kernel % 2 == 0:
            raise HarnessError(f"kv=snapkv: kernel must be a positive odd integer, got {kernel!r}")
        if pooling not in ("max", "avg"):
            raise HarnessError(f"kv=snapkv: pooling must be 'max' or 'avg', got {pooling!r}")
        self.budget = check_budget(self.name, budget, window, "the observation window")
        self.window, self.kernel, self.pooling = window, kernel, pooling
        self.budget_frac = check_budget_frac(self.name, budget_frac)
        self.backend = check_backend(self.name, backend)
        self.prompt_len = 0
        self._q: dict[int, list[torch.Tensor]] = {}
        self._keep: dict[int, torch.Tensor] = {}

    def min_budget(self) -> int:
        return self.window + 1

    def can_restrict(self, prompt_len: int, context: int) -> bool:
        return prompt_len > self.budget  # only the prompt is compressed; generated tokens stay visible

    def reset(self, prompt_len: int, context_len: int | None = None) -> None:
        self.prompt_len = prompt_len
        super().reset(prompt_len, context_len)
        self._q, self._keep = {}, {}

    def _compresses(self) -> bool:
        return self.prompt_len > self.budget

    def keeps_all(self, layer: int, cache_len: int) -> bool:
        return not self._compresses() or cache_len <= self.budget

    def max_selected(self, capacity: int) -> int:
        if not self._compresses():
            return capacity
        return min(capacity, self.budget + max(capacity - self.prompt_len, 0))

    @torch.inference_mode()
    def on_prefill(self, layer: int, q: torch.Tensor, k_all: torch.Tensor, cache_len: int) -> None:
        if not self._compresses():
            return
        first = self.prompt_len - self.window  # absolute index of the first window query
        lo = max(first - cache_len, 0)
        if lo < q.shape[1]:
            self._q.setdefault(layer, []).append(q[:, lo:].clone())

    @torch.inference_mode()
    def after_prefill(self, engine: PolicyEngine) -> None:
        if not self._compresses():
            return
        length = engine.length
        if length != self.prompt_len or len(self._q) != engine.cache.n_layers:
            raise RuntimeError("snapkv: after_prefill without the prefill of the prompt given to reset()")
        for layer, parts in self._q.items():
            q_win = torch.cat(parts, dim=1)
            k = engine.cache.k[layer, :, :length]
            self._keep[layer] = self.choose(q_win, k, engine.scale)
        self._q = {}

    def choose(self, q_win: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
        """bool `[n_kv_heads, L]`: top `budget - window` earlier positions per KV head + the window."""
        hkv, length, _ = k.shape
        w = q_win.shape[1]
        scores = snapkv_scores(q_win, k, scale, self.kernel, self.pooling)
        keep = torch.zeros(hkv, length, dtype=torch.bool, device=k.device)
        keep[:, length - w :] = True
        keep.scatter_(1, scores.topk(self.budget - w, dim=1).indices, True)
        return keep

    def layer_selections(self, cache_len: int) -> torch.Tensor | None:
        if not self._keep or self.keeps_all(0, cache_len):  # layer-independent
            return super().layer_selections(cache_len)
        return self.keep_stack.select(self._keep, cache_len)

    @torch.inference_mode()
    def select(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, cache_len: int) -> torch.Tensor:
        hkv = k_cache.shape[0]
        sel = torch.ones(hkv, cache_len, dtype=torch.bool, device=k_cache.device)
        keep = self._keep.get(layer)
        if keep is not None and not self.keeps_all(layer, cache_len):
            n = min(cache_len, keep.shape[1])
            sel[:, :n] = keep[:, :n]
        return sel
