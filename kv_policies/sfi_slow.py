"""SFI's slow steps ("Slow-Fast Inference" §3.2-3.3): the Selector's evidence and its pass.

A slow step's query rows (and, after the prefill, the last `window` prompt queries) give, per layer and
KV head, the exact logits over the candidates J = [sinks, L - recent) and the candidates' key norms;
`end_slow` runs the Selector (`kv_policies.sfi_selector.sfi_select`) once over every layer. One rule,
`gather_evidence`, serves a layer's rows (`observe`, eager forwards), every layer's at once
(`observe_layers`, the fixed-shape forward) and the slow view's own logits (`SFISlowView`).

The views of its steps: `SFISlowView` (a slow step: dense attention whose queries, and where the split
decode attention computes them anyway its logits, reach the Selector) and `SFIFastView` (a fast step on
`backend=sliced`: the packed long-range set and the recent window read as two slices).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

import torch

from core.attention import (
    ViewKind,
    decode_logits,
    decode_weighted_values,
    one_row_attention,
    one_row_two_slices,
    split_applies,
)
from kv_policies.layer_selection import ObservedCausalView
from kv_policies.sfi_selector import sfi_select

if TYPE_CHECKING:
    from core.compressed_region import CompressedRegion
    from core.types import PolicyEngine
    from kv_policies.sfi import SFI


class SlowSteps:
    """`SFI`'s slow steps (a mixin of the policy: its sinks, recent, k, window, selector and state)."""

    engine: PolicyEngine | None
    slow: bool
    sinks: int
    recent: int
    _norms: torch.Tensor | None

    def begin_slow(self) -> None:
        """The next forward is a slow (dense) step: its query rows choose the selection again."""
        self.slow = True

    def end_slow(self) -> None:
        """The slow step is over: select for every layer it showed (one batched Selector pass)."""
        self.slow = False
        self._select_pending()

    def candidates(self, length: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Logical positions J the Selector chooses from in a cache of `length` committed entries."""
        return torch.arange(self.sinks, max(length - self.recent, self.sinks), device=device)

    def observe(self, layer: int, q: torch.Tensor) -> None:
        if self.slow:
            self.gather_evidence(layer, q[None], self.engine.cache.length)

    def observe_layers(self, queries: torch.Tensor) -> None:
        """A slow step's queries of every layer at once (the fixed-shape forward keeps them stacked)."""
        if self.slow:
            self.gather_evidence(0, queries, self.engine.cache.length)

    @torch.inference_mode()
    def gather_evidence(
        self, first: int, q: torch.Tensor, length: int, logits: torch.Tensor | None = None
    ) -> None:
        """Keep the Selector's inputs for layers `first, first + 1, ...` (one per entry of their query
        rows `q [layers, H, n, d]`): the exact logits of the rows over the candidates of a cache of
        `length` entries, and the candidates' key norms. `logits`, when the caller has them
        (`SFISlowView`: the slow step's own attention logits), are the scaled logits
        `[layers, hkv, R, >= length]` of those rows over the cache slots. The one evidence rule of a
        layer's rows and of every layer's (a fixed-shape step); the selection is made for all layers at
        once by `_select_pending`."""
        eng, n_layers = self.engine, q.shape[0]
        layers = range(first, first + n_layers)
        j = self.candidates(length, eng.device)  # made there: no copy to wait for
        self._pending_j = j
        if j.numel() == 0:
            self._pending.update(dict.fromkeys(layers))
            return
        hkv = eng.cache.n_kv_heads
        if logits is None:
            # logits over the cache as it lies (slot order), then read in candidate order: cheaper than
            # gathering the candidates' keys first, and the same numbers
            keys = eng.cache.k[first : first + n_layers, :, :length].float()  # physical slots
            h, n, d = q.shape[1:]
            rows = q.float().reshape(n_layers, hkv, (h // hkv) * n, d)  # the group's query heads as rows
            logits = (keys @ rows.transpose(-1, -2)).transpose(-1, -2) * eng.scale  # [L, hkv, R, length]
        if self.slots.in_order():  # slot == position
            slots = j.expand(n_layers, hkv, -1)
        else:
            slots = torch.stack([self.slots.physical(layer, j, hkv) for layer in layers])  # [L, hkv, M]
        picked = logits.float().gather(3, slots[:, :, None, :].expand(-1, -1, logits.shape[2], -1))
        norms = self._key_norms(first, n_layers, length)[:, :, j]
        self._pending.update(zip(layers, zip(picked.unbind(0), norms.unbind(0), strict=True)))

    def _key_norms(self, first: int, n_layers: int, length: int) -> torch.Tensor:
        """`[n_layers, hkv, >= length]` the key norm of every committed logical position of layers
        `first...`; each entry's norm is computed once per generation (a committed key never changes),
        for every layer in one operator where they are computed up to the same position in place."""
        cache = self.engine.cache
        if self._norms is None or self._norms.shape[2] < length:
            shape = (cache.n_layers, cache.n_kv_heads, max(length, cache.k.shape[2]))
            grown = torch.zeros(shape, device=cache.k.device)
            if self._norms is not None:
                grown[:, :, : self._norms.shape[2]] = self._norms
            self._norms = grown
        layers = range(first, first + n_layers)
        done = [self._normed.get(layer, 0) for layer in layers]
        if min(done) >= length:
            pass  # every norm known
        elif len(set(done)) == 1 and self.slots.in_order():
            keys = cache.k[first : first + n_layers, :, done[0] : length]
            self._norms[first : first + n_layers, :, done[0] : length] = keys.float().norm(dim=-1)
        else:
            for layer, lo in zip(layers, done, strict=True):
                if lo >= length:
                    continue
                fresh = torch.arange(lo, length, device=cache.k.device)
                keys = self.slots.gather_keys(layer, cache.k[layer, :, :length], fresh)  # [hkv, m, d]
                self._norms[layer, :, lo:length] = keys.float().norm(dim=-1)
        self._normed.update({layer: max(lo, length) for layer, lo in zip(layers, done, strict=True)})
        return self._norms[first : first + n_layers]

    @torch.inference_mode()
    def _select_pending(self) -> None:
        """One Selector pass over every layer gathered since the last pass (all share the candidates)."""
        if not self._pending:
            return
        layers, j = sorted(self._pending), self._pending_j
        if j.numel() == 0:
            chosen = {layer: j.new_empty(self.engine.cache.n_kv_heads, 0) for layer in layers}
        else:
            logits = torch.stack([self._pending[layer][0] for layer in layers])
            norms = torch.stack([self._pending[layer][1] for layer in layers])
            picked = j[sfi_select(logits, norms, j, self.k, self.selector).selected]  # [layers, hkv, k]
            chosen = dict(zip(layers, picked.unbind(0)))
            self.selector_calls += 1
        for layer, sel in chosen.items():
            self._sel[layer] = sel
            self._chosen[layer] = self._chosen.get(layer, 0) + 1
        self._passes += 1
        self._pending = {}
        self._pack_all_layers(len(layers))

    def on_prefill(self, layer: int, q: torch.Tensor, k_all: torch.Tensor, cache_len: int) -> None:
        first = self.prompt_len - self.window  # the first window query's position
        lo = max(first - cache_len, 0)
        if self.window and lo < q.shape[1]:
            self._q.setdefault(layer, []).append(q[:, lo:].clone())

    def after_prefill(self, engine: PolicyEngine) -> None:
        for layer, parts in self._q.items():
            self.gather_evidence(layer, torch.cat(parts, dim=1)[None], engine.length)
        self._q = {}
        self._select_pending()


class SFISlowView(ObservedCausalView):
    """Attention view of a slow step of `decoder=sfi`: dense attention over the whole cache whose query
    rows reach the Selector (`SFI.observe`). Where the split decode attention serves the step (one row,
    float32, CPU, a long cache) it computes the logits of every cached key anyway; the Selector gets
    those instead of computing them a second time (same numbers: the same product, in slot order)."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        pol = self.policy
        if not (pol.slow and split_applies(q, k)):
            return super().attend(layer, q, k, v)
        logits = decode_logits(q, k, self.scale)  # [hkv, G, cache_len + 1]: the new token last
        pol.gather_evidence(layer, q, pol.engine.cache.length, logits[None])
        return decode_weighted_values(torch.softmax(logits, dim=-1), v, q.shape[1])


class SFIFastView:
    """Attention view of one fast step (one query row) of `decoder=sfi` with `kv=sfi backend=sliced`."""

    kind: ClassVar[ViewKind] = ViewKind.REGION_GATHERABLE  # with graphs on, read by gather (one shape)

    def __init__(self, policy: SFI, region: CompressedRegion) -> None:
        self.policy, self.region = policy, region
        self.scale = region.engine.scale
        self._read: list[int] = []

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        pol, reg = self.policy, self.region
        cache_len = k.shape[2] - 1
        if pol.keeps_all(layer, cache_len):
            self._read.append(cache_len)
            pol.activity.note(layer, cache_len, cache_len)
            return one_row_attention(q, k, v, self.scale)
        pol.pack_long_range(layer, cache_len)
        rl = reg.region_len[layer]
        start = cache_len - min(pol.recent, cache_len)
        m, low, total = reg.lengths(layer)  # read once per packing, not per step
        if m > start:
            raise RuntimeError(f"kv=sfi: the packed set ({m} slots) reaches the recent window (slot {start})")
        out = one_row_two_slices(
            q, k[:, :, :m], v[:, :, :m], rl, k[:, :, start:], v[:, :, start:], self.scale, low < m
        )
        read = total // rl.numel() + cache_len - start
        self._read.append(read)
        pol.activity.note(layer, read, cache_len)
        return out

    def kv_read(self, cache_len: int) -> int:
        """Mean over layers of cached entries read per KV head."""
        return round(sum(self._read) / len(self._read)) if self._read else cache_len
