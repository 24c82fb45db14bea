"""Any NVIDIA kvpress press (the library SFI's Table 4 baselines come from) as a KV policy.

A press compresses the prompt's KV once, at the end of the prefill, keeping per KV head the entries it
scores highest (`compression_ratio` = the fraction removed); generated tokens are always kept. Here the
press's own code decides which prompt entries stay, and the policy hides the others from every decode
row: the same selection, as a visibility mask over the one KV cache (`backend=sliced` packs it and
skips the rest).

How a press is asked, per layer, after the prefill (kvpress hooks the attention module's forward):
- `module`: the HF attention module (its projections and config; `core.hf_compat.attention_module`);
- `keys` / `values`: the layer's cached post-RoPE keys and values `[1, n_kv_heads, prompt, head_dim]`;
- `hidden_states`: the attention input of the LAST `context_rows` prompt tokens only (default 128: more
  than any listed press's observation window), with `kwargs["position_embeddings"]` (cos, sin) for those
  rows; `attentions` is None (presses then compute the attention they need themselves);
- a press whose `compress` is kvpress's `ScorerPress.compress` is asked for `score()` and the top
  `n_kept` entries per head are kept, as kvpress does; a press with its own `compress` (PyramidKV's
  per-layer budgets, ChunkKV's chunks) runs it with values replaced by their positions, and the
  positions that come back are the kept ones (so such a press must not score with values: ChunkKV
  wrapping LagKV is refused).
ThinK prunes key channels, not entries, so it is not a selection and is refused.
A press with an observation window (SnapKV, PyramidKV, ChunkKV around them: `window_size` queries)
cannot score a prompt no longer than that window: such a prompt is kept whole, and the run reports the
policy as having restricted nothing.

`press` names a class exported by kvpress (`SnapKVPress`, `StreamingLLMPress`, `TOVAPress`,
`ChunkKVPress`, `LagKVPress`, `KnormPress`, `PyramidKVPress`, ...); `press_kwargs` are its constructor
arguments (ChunkKV: `{"press": "SnapKVPress", "chunk_length": 20}` wraps another press by name).
"""

from __future__ import annotations

import math
from dataclasses import astuple, dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from core.hf_compat import attention_module, rope_cos_sin
from core.options import options
from core.types import HarnessError
from kv_policies.base import KVPolicy
from kv_policies.checks import check_backend

if TYPE_CHECKING:
    from core.engine import Engine

REFUSED = {"ThinKPress": "ThinK prunes key channels, not cached entries: it is not a selection of the cache"}
VALUE_SCORERS = {"LagKVPress"}
INSTALL = "pip install --no-deps kvpress==0.5.5 'cachetools<6' 'fire<0.7' six termcolor peft"


def _kvpress() -> Any:
    try:
        import kvpress
    except ImportError as exc:
        raise HarnessError(f"kv=kvpress needs the kvpress package ({exc.name} missing): {INSTALL}") from None
    return kvpress


def make_press(name: str, compression_ratio: float, kwargs: dict | None) -> Any:
    """The kvpress press `name` with `compression_ratio` (when the press has one) and `kwargs`."""
    if name in REFUSED:
        raise HarnessError(f"kv=kvpress press={name}: {REFUSED[name]}")
    kvpress = _kvpress()
    cls = getattr(kvpress, name, None)
    if cls is None or not isinstance(cls, type):
        presses = sorted(n for n in dir(kvpress) if n.endswith("Press") and n not in REFUSED)
        raise HarnessError(f"kv=kvpress: no press {name!r} in kvpress; presses: {', '.join(presses)}")
    kw = dict(kwargs or {})
    if isinstance(kw.get("press"), str):  # a wrapper press (ChunkKV) names the press it wraps
        if kw["press"] in VALUE_SCORERS:
            raise HarnessError(f"kv=kvpress press={name}: cannot wrap {kw['press']} (it scores with values)")
        kw["press"] = make_press(kw["press"], compression_ratio, kw.pop("inner_kwargs", None))
    elif "compression_ratio" in getattr(cls, "__dataclass_fields__", {}):
        kw.setdefault("compression_ratio", compression_ratio)
    try:
        return cls(**kw)
    except (TypeError, ValueError, AssertionError) as exc:
        raise HarnessError(f"kv=kvpress press={name}: {exc}") from None


def observation_window(press: Any) -> int:
    """Prompt rows a press reads as queries (its `window_size`, or that of the press it wraps); 0 if none."""
    window = 0
    while press is not None:
        window = max(window, int(getattr(press, "window_size", 0) or 0))
        press = getattr(press, "press", None)
    return window


@dataclass
class KVPressConfig:
    press: str = "SnapKVPress"  # the kvpress press class
    compression_ratio: float = 0.5  # fraction of the prompt's entries removed
    # the press's own constructor arguments (e.g. {window_size: 64})
    press_kwargs: dict[str, Any] = field(default_factory=dict)
    context_rows: int = 128  # prompt rows whose attention input the press may read (its query window)
    backend: str = "dense"


class KVPress(KVPolicy):
    name = "kvpress"
    query_free = True  # chosen from the prefill and earlier steps, never from the forward it restricts

    Config = KVPressConfig

    def __init__(self, **given: Any) -> None:
        o = options(self.Config, given)
        press, compression_ratio, press_kwargs, context_rows, backend = astuple(
            o
        )  # the options, in their declared order
        if isinstance(compression_ratio, bool) or not isinstance(compression_ratio, (int, float)):
            raise HarnessError(
                f"kv=kvpress: compression_ratio must be a number in [0, 1), got {compression_ratio!r}"
            )
        if not 0 <= compression_ratio < 1:
            raise HarnessError(f"kv=kvpress: compression_ratio must be in [0, 1), got {compression_ratio!r}")
        if isinstance(context_rows, bool) or not isinstance(context_rows, int) or context_rows < 2:
            raise HarnessError(f"kv=kvpress: context_rows must be an integer >= 2, got {context_rows!r}")
        self.press_name, self.compression_ratio = press, float(compression_ratio)
        self.press_kwargs = dict(press_kwargs or {})
        self.press = make_press(press, self.compression_ratio, self.press_kwargs)
        self.window = observation_window(self.press)
        if context_rows <= self.window:
            raise HarnessError(
                f"kv=kvpress: context_rows ({context_rows}) must exceed the press's observation window "
                f"({self.window} rows)"
            )
        self.context_rows = context_rows
        self.backend = check_backend(self.name, backend)
        self.budget = None
        self.prompt_len = 0
        self._x: dict[int, list[torch.Tensor]] = {}
        self._keep: dict[int, torch.Tensor] = {}

    def can_restrict(self, prompt_len: int, context: int) -> bool:
        return self.compression_ratio > 0 and prompt_len > self.window

    def inactive_reason(self, context: int) -> str:
        return (
            f"press {self.press_name} cannot score a prompt of {self.prompt_len} tokens "
            f"(its observation window is {self.window})"
            if self.compression_ratio > 0
            else "compression_ratio 0 removes nothing"
        )

    def reset(self, prompt_len: int, context_len: int | None = None) -> None:
        self.prompt_len, self._x, self._keep = prompt_len, {}, {}
        super().reset(prompt_len, context_len)

    # --- prefill ---------------------------------------------------------------------------------
    def prefill_hooks(self) -> list:
        def hook(layer: int, q: torch.Tensor, k_all: torch.Tensor, cache_len: int, x: torch.Tensor) -> None:
            lo = max(self.prompt_len - self.context_rows - cache_len, 0)
            if lo < x.shape[0]:
                self._x.setdefault(layer, []).append(x[lo:].detach().clone())

        hook.wants_input = True  # type: ignore[attr-defined]
        return [hook]

    @torch.inference_mode()
    def after_prefill(self, engine: Engine) -> None:  # a real engine: the press runs the model's modules
        n = engine.length
        if self.compression_ratio == 0 or n < 2 or n <= self.window:
            return  # nothing to compress, or a prompt the press cannot score: kept whole
        rows = min(self.context_rows, n)
        pos = torch.arange(n - rows, n, device=engine.device)
        cos, sin = rope_cos_sin(engine.model, pos, engine.dtype)
        kwargs = {"position_embeddings": (cos.unsqueeze(0), sin.unsqueeze(0))}
        for layer, parts in self._x.items():
            hidden = torch.cat(parts)[-rows:].unsqueeze(0)
            keys = engine.cache.k[layer, :, :n].unsqueeze(0)
            values = engine.cache.v[layer, :, :n].unsqueeze(0)
            module = attention_module(engine.model, layer)
            kept = self._kept(module, hidden, keys, values, kwargs)  # [hkv, n_kept]
            keep = torch.zeros(keys.shape[1], n, dtype=torch.bool, device=engine.device)
            self._keep[layer] = keep.scatter_(1, kept, True)
        self._x = {}

    def _kept(
        self, module: Any, hidden: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, kwargs: dict
    ):
        """Positions `[n_kv_heads, n_kept]` the press keeps in this layer."""
        from kvpress.presses.scorer_press import ScorerPress

        press = self.press
        if isinstance(press, ScorerPress) and type(press).compress is ScorerPress.compress:
            scores = press.score(module, hidden, keys, values, None, kwargs)
            n_kept = max(1, math.floor(keys.shape[2] * (1 - press.compression_ratio)))
            return scores[0].topk(min(n_kept, keys.shape[2]), dim=-1).indices
        # a press with its own compress (PyramidKV, ChunkKV): its values become their positions, and the
        # positions it keeps come back (such presses score with queries and keys, never values)
        n = keys.shape[2]
        tag = torch.arange(n, device=values.device, dtype=torch.float32).view(1, 1, n, 1).expand_as(values)
        _, out = press.compress(module, hidden, keys, tag.contiguous(), None, kwargs)
        return out[0, :, :, 0].round().long()

    # --- selection -------------------------------------------------------------------------------
    def keeps_all(self, layer: int, cache_len: int) -> bool:
        return layer not in self._keep

    def layer_selections(self, cache_len: int) -> torch.Tensor:
        return self.keep_stack.select(self._keep, cache_len)

    def select(self, layer: int, q: torch.Tensor, k_cache: torch.Tensor, cache_len: int) -> torch.Tensor:
        sel = torch.ones(k_cache.shape[0], cache_len, dtype=torch.bool, device=k_cache.device)
        keep = self._keep[layer]
        m = min(cache_len, keep.shape[1])
        sel[:, :m] = keep[:, :m]
        return sel
