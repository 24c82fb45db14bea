"""Every layer's selection at once, for the fixed-shape forward (`kv_policies.layer_selection`).

A `query_free` policy's selections can be read before the forward into one `[n_layers, n_kv_heads, L]`
tensor over physical slots, which the fixed-shape forward (and its CUDA graph) stages. `every_layer`
asks the policy layer by layer (its `visible`); a policy whose selections change only at chosen moments
serves a stack of its own through `KVPolicy.layer_selections`, and one whose choice is a keep mask per
layer fixed after the prefill (SnapKV, retrieval, kvpress) hands the masks to its `KeepStack`
(`KVPolicy.keep_stack`), which stacks them once per generation: written once here for every policy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from kv_policies.base import KVPolicy


def every_layer(policy: KVPolicy, cache_len: int) -> torch.Tensor:
    """bool `[n_layers, n_kv_heads, cache_len]` over physical slots: every layer's `policy.visible`
    (a `query_free` policy's, so no queries), one layer at a time."""
    cache = policy.engine.cache
    out = torch.ones(cache.n_layers, cache.n_kv_heads, cache_len, dtype=torch.bool, device=cache.device)
    for layer in range(cache.n_layers):
        if not policy.keeps_all(layer, cache_len):
            out[layer] = policy.visible(layer, None, cache.k[layer, :, :cache_len], cache_len)
    return out


def selections(policy: KVPolicy, cache_len: int) -> torch.Tensor:
    """Every layer's selection: the policy's own stack, or `every_layer`."""
    stack = policy.layer_selections(cache_len)
    return every_layer(policy, cache_len) if stack is None else stack


class KeepStack:
    """Per-layer keep masks fixed after the prefill, stacked once per generation over the whole
    allocation, so that a step's selection is the stack's first `cache_len` slots (a view; under a
    compressed region's map: a gather). One per policy and generation (`KVPolicy.keep_stack`)."""

    def __init__(self, policy: KVPolicy) -> None:
        self.policy = policy  # read for its engine, its slot map and its views' memo
        self._stack: torch.Tensor | None = None
        self._layers: int | None = None  # how many masks `_stack` was made from
        self._last: tuple[int, torch.Tensor] | None = None  # the last prefix served, and its length
        self._kept_beyond: tuple[int, torch.Tensor] | None = None  # set with `_stack`

    def forget(self) -> None:
        """The keep masks changed (a rebuild): stack them again at the next call."""
        self._layers = self._last = None
        self.policy.view_memo.prefix_of = None

    def select(self, keep: dict[int, torch.Tensor], cache_len: int) -> torch.Tensor:
        """`layer_selections` from `keep[layer]` (bool `[n_kv_heads, P]` over the first P logical
        positions; later entries and layers without a mask are visible)."""
        pol = self.policy
        cache, slots, memo = pol.engine.cache, pol.slots, pol.view_memo
        stacked = self._layers == len(keep)
        last = self._last
        if stacked and last is not None and last[0] == cache_len and slots.region is None:
            return last[1]  # a draft's rounds select over the same entries, which committing never moves
        stack = self._stack
        if not stacked or stack is None or stack.shape[2] < cache_len:
            shape = (cache.n_layers, cache.n_kv_heads, max(cache_len, cache.capacity))
            stack = self._stack = stack_masks(keep, shape, cache.device)
            self._layers = len(keep)
            # what each layer keeps of its first `width` positions per KV head, less `width`: past the
            # masks every entry is kept, so of `cache_len >= width` positions it keeps this + cache_len
            width = max((m.shape[1] for m in keep.values()), default=0)
            beyond = stack[:, :, :width].sum(dim=(1, 2)) // cache.n_kv_heads - width
            self._kept_beyond = (width, beyond)
        logical = stack.narrow(2, 0, cache_len)  # one call, not tuple indexing
        physical = slots.physical_stack(logical)
        self._last = (cache_len, physical)  # committed slots keep their entries
        width, beyond = self._kept_beyond  # type: ignore[misc]
        if cache_len >= width and slots.region is None:  # slots 0..cache_len-1 hold positions 0..
            memo.kept_of = (physical, beyond, cache_len)  # `LayerSelectionView` counts no more
        if physical is logical:  # the stack's own prefix (`LayerSelectionView.prefix_of`)
            memo.prefix_of = (physical, stack, width)
        return physical


def stack_masks(
    keep: dict[int, torch.Tensor], shape: tuple[int, int, int], device: torch.device | str
) -> torch.Tensor:
    """bool `shape` (`[n_layers, n_kv_heads, length]`, longer if a mask is): `keep[layer]` over its first
    positions, True elsewhere. Masks of one width on consecutive layers (every layer past the dense ones)
    are copied in one operator."""
    n_layers, hkv, length = shape
    length = max(length, *(m.shape[1] for m in keep.values()), 0)
    stack = torch.ones(n_layers, hkv, length, dtype=torch.bool, device=device)
    layers = sorted(keep)
    widths = {keep[layer].shape[1] for layer in layers}
    if len(widths) == 1 and layers == list(range(layers[0], layers[-1] + 1)):
        stack[layers[0] : layers[-1] + 1, :, : widths.pop()] = torch.stack([keep[layer] for layer in layers])
    else:
        for layer, mask in keep.items():
            stack[layer, :, : mask.shape[1]] = mask
    return stack
