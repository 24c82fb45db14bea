"""StreamingLLM / LM-Infinite: `sinks` initial "attention sink" tokens plus the most recent tokens.

Xiao et al. 2024 (StreamingLLM) keep `start_size` first entries and `recent_size` last entries
(reference: `StartRecentKVCache`); FAFO-Stream (FAFO §4.3) uses this as its
compression C with an "Init+Local" budget (best 760 in Table 13; ours: 4 sinks + the rest local).

Here `budget` = sinks + recent cached entries per KV head, the same set for every layer and head
(`shared = True`, so a compressed region moves it with one `cache.swap_slots` per step, App. H).
Deviation, stated: the reference re-rotates cached keys with their index inside the window
("pos shift"); our keys keep their true RoPE positions (they are stored post-RoPE, and FAFO's lossless
verification needs the true positions anyway), as in FAFO's use of the policy.
"""

from __future__ import annotations

from dataclasses import astuple, dataclass
from typing import Any

import torch

from core.options import options
from core.types import HarnessError
from kv_policies.base import KVPolicy
from kv_policies.checks import check_backend, check_budget, check_budget_frac, check_dense_layers


@dataclass
class StreamingLLMConfig:
    budget: int = 760  # cached entries per KV head (FAFO Table 13's best Init+Local budget)
    sinks: int = 4  # first entries always kept
    # dense (SDPA + mask, the reference) | flex (compressed region + compiled FlexAttention) | sliced
    # (compressed region, SDPA on the region slice) | flash (CUDA + flash-attn only)
    backend: str = "dense"
    budget_frac: float | None = None  # a fraction of each generation's context instead (None: budget)
    dense_layers: int = 0  # the first layers see the whole cache (TriForce Table 1: 2)


class StreamingLLM(KVPolicy):
    name = "streaming"
    _fixed: tuple | None = None  # `fixed_selection`'s last (key, answer): a draft's rounds ask alike
    query_free = True  # positions alone
    shared = True

    Config = StreamingLLMConfig

    def __init__(self, **given: Any) -> None:
        o = options(self.Config, given)
        budget, sinks, backend, budget_frac, dense_layers = astuple(o)
        if not isinstance(sinks, int) or sinks < 0:
            raise HarnessError(f"kv=streaming: sinks must be a non-negative integer, got {sinks!r}")
        self.sinks = sinks
        self.set_budget(check_budget(self.name, budget, sinks, "sinks"))
        self.budget_frac = check_budget_frac(self.name, budget_frac)
        self.backend = check_backend(self.name, backend)
        self.dense_layers = check_dense_layers(self.name, dense_layers)

    def min_budget(self) -> int:
        return self.sinks + 1

    def set_budget(self, budget: int) -> None:
        self.budget, self.recent = budget, budget - self.sinks

    def select(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, cache_len: int) -> torch.Tensor:
        return self.selection(cache_len, k_cache.device).expand(k_cache.shape[0], cache_len)

    def fixed_selection(self, cache_len: int) -> tuple[torch.Tensor, int] | None:
        """The window over physical slots from the cache's slot positions (a device tensor, read on the
        device); None with dense layers or a compressed region (they take `visible`)."""
        eng, region = self.engine, self.slots.region
        if self.dense_layers or region is not None or eng is None or eng.cache.capacity < cache_len:
            return None
        pos = eng.cache.slot_pos
        key = (cache_len, self.sinks, self.recent, pos.data_ptr())
        last = self._fixed
        if last is None or last[0] != key:  # a draft's rounds select over the same entries: made once
            window = (pos[:cache_len] < self.sinks) | (pos[:cache_len] >= cache_len - self.recent)
            last = self._fixed = (key, (window, min(cache_len, self.budget)))
        return last[1]

    def fixed_hole(self, cache_len: int) -> tuple[int, int, int] | None:
        """Over slots that hold their positions the window leaves out `[sinks, cache_len - recent)`."""
        eng = self.engine
        if self.dense_layers or eng is None or not self.slots.in_order() or eng.cache.capacity < cache_len:
            return None
        return self.sinks, max(cache_len - self.recent, self.sinks), min(cache_len, self.budget)

    def selection(self, cache_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """bool `[cache_len]`: positions < sinks or >= cache_len - recent."""
        sel = torch.zeros(cache_len, dtype=torch.bool, device=device)
        sel[: self.sinks] = True
        sel[max(cache_len - self.recent, 0) :] = True
        return sel
