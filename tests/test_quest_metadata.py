"""Quest's page metadata (`kv_policies.quest`): the per-page key extremes every layer keeps, extended as
entries are committed, one layer at a time (the regular forward) or every layer in one pass (the
fixed-shape forward's staging), equal to the extremes computed from scratch."""

from __future__ import annotations

import torch

from kv_policies.quest import Quest
from tests.helpers import FakeEngine, page_minmax


def test_quest_metadata_incremental_equals_scratch_and_rolls_back():
    eng = FakeEngine(layers=1, hkv=2, d=8, capacity=300)
    pol = Quest(budget=64, page_size=16, dense_layers=0)
    pol.attach(eng)
    pol.reset(40)
    keys = torch.randn(1, 2, 300, 8)
    eng.append(keys[:, :, :40])
    for step in range(60):  # grow one entry at a time, scoring every step
        pol.select(0, torch.randn(4, 1, 8), eng.cache.k[0, :, : eng.length], eng.length)
        eng.append(keys[:, :, eng.length : eng.length + 1])
        if step == 30:
            eng.cache.crop(53)  # roll back into the middle of a page
    n = eng.length
    pol.sync(0, eng.cache.k[0, :, :n], n)
    kmin, kmax = page_minmax(eng.cache.k[0, :, :n], 16)
    pages = kmin.shape[1]
    assert torch.equal(pol._kmin[0][:, :pages], kmin) and torch.equal(pol._kmax[0][:, :pages], kmax)


def test_quest_metadata_of_every_layer_in_one_pass_equals_scratch():
    """`sync_layers` brings layers `first..` up to the cache in one pass: their extremes equal
    `page_minmax` of each layer's keys as the cache grows, rolls back into a page, is read through a
    slot map (a permuted cache), and when the layers have read different lengths (one by one); the
    layers below `first` are left as they were."""
    eng = FakeEngine(layers=3, hkv=2, d=8, capacity=300)
    pol = Quest(budget=64, page_size=16, dense_layers=1)
    pol.attach(eng)
    pol.reset(40)
    keys = torch.randn(3, 2, 300, 8)

    def check() -> None:
        n = eng.length
        for layer in (1, 2):
            kmin, kmax = page_minmax(eng.cache.k[layer, :, :n], 16)
            pages = kmin.shape[1]
            assert torch.equal(pol._kmin[layer, :, :pages], kmin)
            assert torch.equal(pol._kmax[layer, :, :pages], kmax)
        assert pol._kmin[0].isinf().all() and 0 not in pol._seen  # the dense layer is not read

    eng.append(keys[:, :, :40])
    for step in range(50):
        pol.sync_layers(1, eng.length)
        check()
        eng.append(keys[:, :, eng.length : eng.length + 1 + step % 3])
        if step == 20:
            eng.cache.crop(70)  # roll back into the middle of a page
    pol.sync(2, eng.cache.k[2, :, : eng.length], eng.length)  # layer 2 ahead of layer 1
    eng.append(keys[:, :, eng.length : eng.length + 5])
    pol.sync_layers(1, eng.length)
    check()
    eng.cache.crop(eng.length - 7)  # into the middle of a page again, then unread entries out of place
    n = eng.length
    eng.append(keys[:, :, n : n + 20])
    eng.cache.swap_slots(torch.tensor([n + 1, n + 2]), torch.tensor([n + 18, n + 3]))
    assert not pol.slots.in_order()
    pol.sync_layers(1, eng.length)
    order = pol.slots.physical(1, torch.arange(eng.length), 1)[0]  # the slot of each position
    for layer in (1, 2):  # the extremes of the keys each position holds
        kmin, kmax = page_minmax(eng.cache.k[layer].index_select(1, order), 16)
        assert torch.equal(pol._kmin[layer, :, : kmin.shape[1]], kmin)
        assert torch.equal(pol._kmax[layer, :, : kmax.shape[1]], kmax)
