"""`SlotMap`: where a policy's logical positions sit among the cache's physical slots.

A policy reasons in LOGICAL positions (0 .. cache_len-1, the token's index in the sequence, also its
RoPE position). The physical layout may be permuted: by a decoder that commits out of sequence
(`KVCache.slot_pos`), or by a compressed region (`core.compressed_region`, FAFO §4.4 / App. H) that
packs a selection at the head of the KV tensors. Keys are post-RoPE, so a permutation of cached entries
never changes attention. Only freshly committed entries (slots >= the last length a policy saw) are
guaranteed to sit at slot == position; anything older is found through `physical`.

Every policy has one (`KVPolicy.slots`, rebound by `attach` and `reset`): the mapping is written once
here for every policy, not in each policy's rule.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from core.compressed_region import CompressedRegion
    from core.types import PolicyEngine


class SlotMap:
    """The slot <-> position map of one policy in one engine's cache (`engine`: None before a policy
    is attached, slots are then positions). `region`: the `CompressedRegion` currently laying out the
    policy's selection, if any (it registers itself through `follow`)."""

    def __init__(self, engine: PolicyEngine | None = None) -> None:
        self.engine = engine
        self.region: CompressedRegion | None = None

    def follow(self, region: CompressedRegion) -> None:
        """From now on the policy's entries are where `region` put them."""
        self.region = region

    def in_order(self) -> bool:
        """Whether committed slot s holds position s (`KVCache.in_order`, no compressed region): slots
        are then read as positions, without a map."""
        return self.region is None and (self.engine is None or self.engine.cache.in_order)

    def logical_of_slots(
        self, layer: int, hkv: int, cache_len: int, device: torch.device | str = "cpu"
    ) -> torch.Tensor:
        """long `[n_kv_heads, cache_len]`: the logical position held by each physical slot."""
        if self.region is not None:
            return self.region.positions(layer, cache_len)
        if self.engine is not None and self.engine.cache.capacity >= cache_len:
            return self.engine.cache.slot_pos[:cache_len].expand(hkv, cache_len)
        return torch.arange(cache_len, device=device).expand(hkv, cache_len)

    def to_slots(self, layer: int, sel: torch.Tensor) -> torch.Tensor:
        """A selection `[n_kv_heads, cache_len]` over logical positions, as a mask over physical slots."""
        if self.in_order():
            return sel
        hkv, cache_len = sel.shape
        return sel.gather(1, self.logical_of_slots(layer, hkv, cache_len, sel.device))

    def physical(self, layer: int, positions: torch.Tensor, hkv: int) -> torch.Tensor:
        """long `[n_kv_heads, m]`: the slot holding each logical position `positions [m]` (or
        `[n_kv_heads, m]`), per KV head."""
        pos = positions if positions.dim() >= 2 else positions.expand(hkv, -1)
        if self.region is not None:
            return self.region.slots_of(layer, pos)
        if self.in_order() or self.engine is None or not pos.numel():
            return pos
        # committed slots hold a permutation of the positions before the cache's length: invert it on
        # the device (checking for the identity would make the host wait for the cache)
        cache = self.engine.cache
        sp = cache.slot_pos[: cache.length]
        inv = torch.empty(cache.length, dtype=torch.long, device=sp.device)
        inv[sp] = torch.arange(cache.length, device=sp.device)
        return inv[pos]

    def gather_keys(self, layer: int, k_cache: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Keys `[n_kv_heads, m, head_dim]` of logical `positions` from physical `k_cache`."""
        hkv = k_cache.shape[0]
        slots = self.physical(layer, positions, hkv)
        # one row copy per entry and head (a `gather` over an expanded [hkv, m, d] index is ~5x slower)
        return torch.stack([k_cache[h].index_select(0, slots[h]) for h in range(hkv)])

    def physical_stack(self, logical: torch.Tensor) -> torch.Tensor:
        """Every layer's selection `[n_layers, n_kv_heads, L]` over logical positions, mapped onto
        physical slots (as `to_slots` maps one layer's)."""
        n_layers, hkv, cache_len = logical.shape
        if self.region is not None:  # a permuted layout: each layer's own map
            maps = [self.logical_of_slots(li, hkv, cache_len) for li in range(n_layers)]
            return torch.stack([logical[li].gather(1, m) for li, m in enumerate(maps)])
        if self.in_order():
            return logical
        slots = self.engine.cache.slot_pos[:cache_len].expand(n_layers, hkv, cache_len)
        return logical.gather(2, slots)
