"""SFI's sparse state ("Slow-Fast Inference" §3.1-3.3): per layer and KV head, a fast step
sees the `sinks` first entries, the `recent` last ones and `k` long-range entries the Selector chose at
the last slow step.

- Slow steps (chosen by `decoder=sfi`: the first decode step, after a boundary token, after `t_max`
  fast steps) attend densely; the decoder calls `begin_slow()` first, and every layer's query rows
  then reach `observe` (`kv_policies.sfi_slow`), which keeps their exact attention logits over the candidates
  J = [sinks, L - recent) (`SFISlowView` hands over the attention's own logits) and the candidates'
  key norms; `end_slow()` runs the Selector (`kv_policies.sfi_selector.sfi_select`; GQA: the group's
  query heads are its rows) once over all layers to choose `k` of them per layer and KV head.
- The prefill ends with a Selector pass over the last `window` (16) prompt queries.
- Fast steps are ordinary restricted rows (`visible` = sinks, recent window, selected set); with
  `backend=sliced` the selection is packed into the compressed region (SFI's "Reorg"; all layers in
  one placement at the end of a slow step) and the attention really reads only it.

The Selector's hyper-parameters come from a preset (`preset=paper`: the paper's λ_clip 0.02, α_soft
0.5, α_cross 0.35 and the repository's values for what the paper leaves out; `preset=repo`: the
reference repository's defaults), with `lambda_clip`, `alpha_soft`, `alpha_cross` overridable; the
run records all of them. `budget` = sinks + recent + k; `budget_frac` sets it per generation as a
fraction of the context (k = the rest).
"""

from __future__ import annotations

import dataclasses
from dataclasses import astuple, dataclass
from typing import TYPE_CHECKING, Any

import torch

from core.options import options
from core.policy_views import decode_view, region_for
from core.types import HarnessError, PolicyEngine
from kv_policies.base import KVPolicy
from kv_policies.checks import check_backend, check_budget_frac
from kv_policies.sfi_selector import PAPER, REPO
from kv_policies.sfi_slow import SFIFastView, SFISlowView, SlowSteps

if TYPE_CHECKING:
    from core.attention import View

PRESETS = {"paper": PAPER, "repo": REPO}


def _nonneg_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise HarnessError(f"kv=sfi: {name} must be a non-negative integer, got {value!r}")
    return value


@dataclass
class SFIConfig:
    k: int = 2048  # selected per KV head (the paper's efficiency setting; 3836 for its quality tables)
    sinks: int = 4
    recent: int = 256
    window: int = 16  # prompt queries of the prefill's Selector pass
    preset: str = (
        "paper"  # paper (lambda_clip 0.02, alpha_soft 0.5, alpha_cross 0.35) | repo (0.25, 1.0, 0.85)
    )
    lambda_clip: float | None = None  # None = the preset's
    alpha_soft: float | None = None
    alpha_cross: float | None = None
    backend: str = "dense"  # dense (SDPA + mask, the reference) | sliced (compressed region: skips work)
    budget_frac: float | None = None  # sinks + recent + k as a fraction of the context instead


class SFI(SlowSteps, KVPolicy):
    name = "sfi"
    # `layer_selections`' stack of the Selector's choice, what it keeps below each position, and the
    # (capacity, pass) it was made for
    _long_stack: torch.Tensor | None = None
    _long_below: torch.Tensor | None = None
    _long_key: tuple | None = None
    keeps_alike = True  # `keeps_all`: one answer for every layer
    query_free = True  # a fast step's set was chosen at the last slow step (slow steps have their own view)

    Config = SFIConfig

    def __init__(self, **given: Any) -> None:
        o = options(self.Config, given)
        k, sinks, recent, window, preset, lambda_clip, alpha_soft, alpha_cross, backend, budget_frac = (
            astuple(o)
        )  # the options, in their declared order
        if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
            raise HarnessError(
                f"kv=sfi: k (entries selected per KV head) must be a positive integer, got {k!r}"
            )
        self.sinks, self.recent = _nonneg_int("sinks", sinks), _nonneg_int("recent", recent)
        self.window = _nonneg_int("window", window)
        if preset not in PRESETS:
            raise HarnessError(f"kv=sfi: preset must be one of {', '.join(PRESETS)}, got {preset!r}")
        overrides = {"lambda_clip": lambda_clip, "alpha_soft": alpha_soft, "alpha_cross": alpha_cross}
        try:
            self.selector = dataclasses.replace(
                PRESETS[preset], **{n: float(v) for n, v in overrides.items() if v is not None}
            )
        except (TypeError, ValueError):
            raise HarnessError(
                f"kv=sfi: lambda_clip / alpha_soft / alpha_cross must be numbers, got {overrides}"
            ) from None
        except HarnessError as exc:
            raise HarnessError(f"kv=sfi: {exc}") from None
        self.preset = preset
        self.set_budget(self.sinks + self.recent + k)
        self.budget_frac = check_budget_frac(self.name, budget_frac)
        self.backend = check_backend(self.name, backend)
        self.slow = False
        self._sel: dict[int, torch.Tensor] = {}
        self._q: dict[int, list[torch.Tensor]] = {}
        self._chosen: dict[int, int] = {}  # layer -> how many times its set was chosen
        self._passes = 0  # `_select_pending` passes that chose some layer's set (any change of `_sel`)
        self._packed: dict[int, int] = {}  # layer -> that count when its long-range set was packed
        self._pending: dict[int, tuple[torch.Tensor, torch.Tensor] | None] = {}  # layer -> Selector inputs
        self._pending_j = torch.empty(0, dtype=torch.long)
        self._norms: torch.Tensor | None = None  # [layers, hkv, capacity] key norms by logical position
        self._normed: dict[int, int] = {}  # layer -> positions whose norm is in _norms
        self.prompt_len = 0
        self.selector_calls = 0  # Selector passes (one per slow step and one after the prefill)

    # --- budget ----------------------------------------------------------------------------------
    def set_budget(self, budget: int) -> None:
        self.budget, self.k = budget, budget - self.sinks - self.recent

    def min_budget(self) -> int:
        return self.sinks + self.recent + 1

    def reset(self, prompt_len: int, context_len: int | None = None) -> None:
        self.prompt_len, self.slow, self.selector_calls = prompt_len, False, 0
        self._sel, self._q, self._chosen, self._packed, self._passes = {}, {}, {}, {}, 0
        self._pending, self._norms, self._normed = {}, None, {}
        self._long_key = None  # `layer_selections`' stack belongs to one generation
        super().reset(prompt_len, context_len)

    def _pack_all_layers(self, chosen_layers: int) -> None:
        """On the sliced backend, once the region exists and every layer has chosen: pack every layer's
        sinks + chosen entries in one placement (otherwise each layer packs on its next fast step)."""
        eng = self.engine
        if self.slots.region is None or chosen_layers != eng.cache.n_layers or self.keeps_all(0, eng.length):
            return
        sel = torch.stack([self._long_range(layer, eng.cache.n_kv_heads, eng.length, eng.device)
                           for layer in range(chosen_layers)])  # fmt: skip
        self.slots.region.place_layers(sel)
        self._packed = dict(self._chosen)
        self.slots.region.read_lengths()  # every layer's, in one read: the fast steps read nothing back

    # --- fast steps ----------------------------------------------------------------------------------
    def keeps_all(self, layer: int, cache_len: int) -> bool:
        return cache_len <= self.budget

    def slow_view(self, engine: PolicyEngine) -> SFISlowView:
        """The view of a slow step: dense attention whose query rows (and, where the split decode
        attention computes them anyway, its logits) reach the Selector (`kv_policies.view`)."""
        return SFISlowView(engine.scale, self)

    def fast_view(self, engine: PolicyEngine) -> View:
        """The view of a fast step (one query row): with `backend=sliced` the packed long-range set
        plus the recent window read in place (`kv_policies.view`), otherwise `decode_view` (on an
        engine with fixed-shape forwards, sliced too: that forward reads the same set by gather)."""
        graphed = engine.fixed_shape  # then decode_view's reads by gather
        if self.backend == "sliced" and not graphed and not self.keeps_all(0, engine.length):
            return SFIFastView(self, region_for(self, engine, "sliced"))
        return decode_view(self, engine, 1)

    @torch.inference_mode()
    def pack_long_range(self, layer: int, cache_len: int) -> None:
        """Pack layer `layer`'s sinks + chosen entries into the region's first slots, once per choice."""
        if self._packed.get(layer, -1) == self._chosen.get(layer, 0):
            return
        sel = self._long_range(layer, self.engine.cache.n_kv_heads, cache_len, self.engine.device)
        self.slots.region.place(layer, sel)
        self._packed[layer] = self._chosen.get(layer, 0)

    def layer_selections(self, cache_len: int) -> torch.Tensor:
        """Every layer's sinks and chosen entries, stacked once per choice (a slow step), with the
        recent window added each step: a few operators per fast step instead of a few per layer.
        The same selection as `select`: a chosen entry lies below the cache length it was chosen at,
        and the cache only grows within a generation."""
        cache = self.engine.cache
        if self.keeps_all(0, cache_len):
            return super().layer_selections(cache_len)
        key = (cache.capacity, self._passes)
        if self._long_key != key:
            stack = torch.zeros(
                cache.n_layers, cache.n_kv_heads, cache.capacity, dtype=torch.bool, device=cache.device
            )
            stack[:, :, : self.sinks] = True
            sels = [self._sel.get(layer) for layer in range(cache.n_layers)]
            if all(s is not None and s.numel() and s.shape == sels[0].shape for s in sels):
                # every layer chose as many (one Selector pass): one scatter, not one per layer
                stack.scatter_(2, torch.stack(sels).to(cache.device), True)  # type: ignore[arg-type]
            else:
                for layer, chosen in self._sel.items():
                    if chosen.numel():
                        stack[layer].scatter_(1, chosen.to(cache.device), True)
            # what each layer keeps per KV head below every position (`LayerSelectionView`'s count): a
            # fast step's count is then a view of it plus the window, no reduction a step
            below = stack.sum(1).cumsum(-1) // cache.n_kv_heads
            self._long_stack, self._long_below, self._long_key = stack, below, key
        window = max(cache_len - self.recent, 0)
        logical = self._long_stack[:, :, :cache_len].clone()
        logical[:, :, window:] = True
        chosen = self.slots.physical_stack(logical)
        below = self._long_below
        if window:  # (stack, per layer, plus), as `LayerSelectionView.build` reads it
            self.view_memo.kept_of = (chosen, below[:, window - 1], cache_len - window)
        return chosen

    @torch.inference_mode()
    def select(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, cache_len: int) -> torch.Tensor:
        sel = self._long_range(layer, k_cache.shape[0], cache_len, k_cache.device)
        sel[:, max(cache_len - self.recent, 0) :] = True
        return sel

    def _long_range(self, layer: int, hkv: int, cache_len: int, device: torch.device) -> torch.Tensor:
        """bool `[hkv, cache_len]`: the sinks and the entries chosen at the last slow step."""
        sel = torch.zeros(hkv, cache_len, dtype=torch.bool, device=device)
        sel[:, : self.sinks] = True
        chosen = self._sel.get(layer)
        if chosen is not None and chosen.numel():
            sel.scatter_(1, chosen.clamp(max=cache_len - 1).to(sel.device), True)
        return sel
