"""What a KV policy's selection really did during one generation.

A policy can be configured and still restrict nothing (a budget at or above the context keeps every
entry): its run is then the full cache under another name. The restricted-row views
(`kv_policies.view.RestrictedView`, `core.compressed_region.RegionView`) report, per layer of every
forward, how many cached entries a restricted row could see out of how many there were; this turns
those notes into two per-generation numbers:

- `restricted_frac`: decode forwards in which the selection hid at least one cached entry from some
  layer's restricted rows, over all decode forwards;
- `visible_frac`: the visible fraction of the cache for the restricted rows, averaged over layers and
  then over decode forwards (1.0 for a forward the policy did not restrict).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Activity:
    restricted_frac: float
    visible_frac: float


class SelectionActivity:
    """Accumulates one generation's per-layer notes; a note for a layer at or below the previous one
    starts a new forward (every forward visits its layers in increasing order)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        # (first layer, visible, cache_len, entries every layer sees on top), deferred
        self._pending: list[tuple[int, torch.Tensor, int, int]] = []
        self.noted_forwards = 0
        self.restricted_forwards = 0
        self.visible_sum = 0.0
        self._last_layer = -1
        self._layers = 0
        self._visible = 0.0
        self._restricted = False

    def note(self, layer: int, visible: int, cache_len: int) -> None:
        """Layer `layer`'s restricted rows could see `visible` of `cache_len` cached entries (per KV
        head, averaged over heads)."""
        if layer <= self._last_layer:
            self._close()
        self._last_layer = layer
        self._layers += 1
        self._visible += visible / cache_len if cache_len else 1.0
        self._restricted |= visible < cache_len

    def note_layers(self, n_layers: int, visible: int, cache_len: int) -> None:
        """`note` for layers `0..n_layers-1` alike: one forward whose every layer sees `visible`."""
        self._close()
        self._last_layer, self._layers = n_layers - 1, n_layers
        self._visible = n_layers * (visible / cache_len if cache_len else 1.0)
        self._restricted = visible < cache_len

    def note_forward(self, visible: torch.Tensor, cache_len: int, plus: int = 0) -> None:
        """A whole forward at once: `visible [n_layers]` (a device tensor, read only by `summary`, so a
        step does not wait for it) entries of `cache_len` per KV head in each layer, `plus` more in every
        layer, as `note` takes them."""
        self._pending.append((0, visible if visible.dim() == 1 else visible.reshape(-1), cache_len, plus))

    def note_layer(self, layer: int, visible: torch.Tensor, cache_len: int) -> None:
        """`note` with `visible` a 0-d device tensor, read only by `summary`."""
        self._pending.append((layer, visible.reshape(1), cache_len, 0))

    def _read_pending(self) -> None:
        """The deferred notes in the order they came (one read of the device for all of them)."""
        pending, self._pending = self._pending, []
        if not pending:
            return
        values = torch.cat([v for _, v, _, _ in pending]).tolist()
        at = 0
        for first, visible, cache_len, plus in pending:
            for i in range(visible.numel()):
                self.note(first + i, int(values[at + i]) + plus, cache_len)
            at += visible.numel()
        self._close()

    def _close(self) -> None:
        if self._layers:
            self.noted_forwards += 1
            self.restricted_forwards += int(self._restricted)
            self.visible_sum += self._visible / self._layers
        self._last_layer, self._layers, self._visible, self._restricted = -1, 0, 0.0, False

    def summary(self, forwards: int) -> Activity:
        """Over `forwards` decode forwards (those without a note saw the whole cache)."""
        self._close()
        self._read_pending()
        self._close()
        if forwards <= 0:
            return Activity(0.0, 1.0)
        unnoted = max(forwards - self.noted_forwards, 0)
        return Activity(
            min(self.restricted_forwards / forwards, 1.0),
            (self.visible_sum + unnoted) / max(forwards, self.noted_forwards),
        )
