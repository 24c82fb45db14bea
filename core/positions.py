"""Block positions a fixed-shape forward adds to the cache length inside its graph, and the staging keys
its buffers are compared by.

Most decode blocks sit right after the cache: a chain's rows at `length, length + 1, ...` (vanilla's
step, a verification, a draft's step), an n-gram decoder's layout at `length + offsets[row]`. Copying
such positions into the forward's buffer costs each step a launch or two (the positions, the pad
rows'), and computing `offsets + length` one more. So a fixed-shape forward keeps them relative to the
cache length (`StagedPositions`) and adds the length inside its graph: a step whose relative positions
are those of the step before stages nothing for them. Two kinds of block are told apart
(`after_cache`):
- a slice of the engine's `arange` (`Engine.positions`) that starts at the cache length: a chain;
- `RelativePositions(offsets, start)`, which a decoder hands to `Engine.step` in place of a tensor, with
  `start` the cache length (FAFO's and Lookahead's layouts: the same `offsets` object step after step).
Anything else is taken as absolute positions and copied.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from core.engine import Engine


@dataclass(frozen=True)
class RelativePositions:
    """Positions `start + offsets[i]` (`offsets`: long, on the engine's device). `Engine.step` takes one
    in place of its positions tensor; a forward that needs the values takes `tensor()`."""

    offsets: torch.Tensor
    start: int

    def numel(self) -> int:
        return self.offsets.numel()

    def tensor(self) -> torch.Tensor:
        return self.offsets + self.start


def absolute(positions: torch.Tensor | RelativePositions) -> torch.Tensor:
    """The positions as a tensor (a `RelativePositions` added up)."""
    return positions.tensor() if isinstance(positions, RelativePositions) else positions


def after_cache(
    positions: torch.Tensor | RelativePositions, engine: Engine, length: int
) -> tuple[tuple, torch.Tensor | None] | None:
    """How `positions` sit after a cache of `length` entries, when they do: `((n,), None)` for a chain
    (the block's rows at `length + row`), `((n, offsets, version), offsets)` for a `RelativePositions`
    starting at `length`; None for absolute positions (a chain starting elsewhere among them). The key
    tells a forward whether what it staged still holds."""
    if isinstance(positions, RelativePositions):
        if positions.start != length:
            return None
        offsets = positions.offsets
        return (offsets.numel(), offsets, version_of(offsets)), offsets
    if isinstance(positions, torch.Tensor) and engine.chain_start(positions) == length:
        return (positions.numel(),), None
    return None


class StagedPositions:
    """A fixed-shape forward's `rows` positions: `values + length * from_length` inside the forward
    (`of`), with `values` relative to the cache length for a block after the cache (staged only when they
    change) and absolute otherwise (copied every step). Pad rows repeat the last row's position."""

    def __init__(self, row: torch.Tensor) -> None:
        """`row`: the forward's row indices, `arange(rows)` on its device (a chain's relative positions)."""
        self.rows, self.row = row.numel(), row
        self.values = torch.zeros_like(row)
        self.from_length = torch.zeros(1, dtype=torch.long, device=row.device)  # 1: `values` are relative
        self.relative = False  # what `from_length` holds
        self.staged: tuple | None = None  # the key of the relative values staged (None: absolute ones)

    def stage(self, positions: torch.Tensor | RelativePositions, n: int, engine: Engine, length: int) -> None:
        found = after_cache(positions, engine, length)
        if found is None:
            self.values[:n].copy_(flat_on(absolute(positions), self.values.device))
            self._pad(n)
            self._set_relative(False)
            self.staged = None
            return
        key, offsets = found
        self._set_relative(True)
        if self.staged is not None and same_key(self.staged, key):
            return
        self.values[:n].copy_(self.row[:n] if offsets is None else flat_on(offsets, self.values.device))
        self._pad(n)
        self.staged = key

    def of(self, length: torch.Tensor) -> torch.Tensor:
        """The positions, from the device's cache length (inside the forward, so inside its graph)."""
        return torch.addcmul(self.values, length, self.from_length)

    def _pad(self, n: int) -> None:
        if n < self.rows:
            self.values[n:].copy_(self.values[n - 1 : n].expand(self.rows - n))

    def _set_relative(self, relative: bool) -> None:
        if relative != self.relative:
            self.from_length.fill_(int(relative))
            self.relative = relative


def flat_on(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`t` as a 1-D tensor on `device`, with no operator when it already is one."""
    if t.device != device:
        t = t.to(device)
    return t if t.dim() == 1 else t.reshape(-1)


def version_of(t: torch.Tensor) -> int | None:
    """How often `t` (or a view sharing its data) was written in place; None for an inference tensor,
    which keeps no count: one written in place under `torch.inference_mode` is staged again only as a
    new tensor (a decoder's per-step masks are new tensors or slices)."""
    return None if t.is_inference() else t._version


def same_key(a: tuple, b: tuple) -> bool:
    """Equal staging keys, tensors compared by identity (a tensor's `==` would compare its data)."""
    return len(a) == len(b) and all(x is y if isinstance(x, torch.Tensor) else x == y for x, y in zip(a, b))
