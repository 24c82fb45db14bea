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

    def _close(self) -> None:
        if self._layers:
            self.noted_forwards += 1
            self.restricted_forwards += int(self._restricted)
            self.visible_sum += self._visible / self._layers
        self._last_layer, self._layers, self._visible, self._restricted = -1, 0, 0.0, False

    def summary(self, forwards: int) -> Activity:
        """Over `forwards` decode forwards (those without a note saw the whole cache)."""
        self._close()
        if forwards <= 0:
            return Activity(0.0, 1.0)
        unnoted = max(forwards - self.noted_forwards, 0)
        return Activity(
            min(self.restricted_forwards / forwards, 1.0),
            (self.visible_sum + unnoted) / max(forwards, self.noted_forwards),
        )
