"""KV policies against brute force: budgets, fixed parts, Quest's bound, SnapKV/H2O selections, the
compressed-region swap layout, bad input, and every policy end to end with vanilla on a tiny model."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.compressed_region import CompressedRegion
from core.engine import Engine
from core.types import Counts, HarnessError
from decoders.vanilla import Vanilla
from kv_policies.base import KVPolicy
from kv_policies.h2o import H2O
from kv_policies.pages import page_bounds
from kv_policies.quest import Quest
from kv_policies.registry import build_policy
from kv_policies.snapkv import SnapKV
from kv_policies.streaming import StreamingLLM
from kv_policies.view import selectable_length
from tests.helpers import FakeEngine, page_minmax


# --- bad input ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name,params,needle",
    [
        ("streaming", {"budget": 4, "sinks": 4}, "must exceed sinks"),
        ("h2o", {"budget": 100, "recent": 100}, "must exceed the recent window"),
        ("snapkv", {"budget": 32, "window": 32}, "must exceed the observation window"),
        ("quest", {"budget": 760, "page_size": 24}, "must be a positive divisor"),
        ("quest", {"budget": 16, "page_size": 16}, "must exceed one page"),
        ("quest", {"budget": 31, "page_size": 16}, "at least two pages"),
        ("streaming", {"budget": 0}, "positive integer"),
        ("streaming", {"budget": 100, "backend": "cuda-magic"}, "backend must be one of"),
        ("snapkv", {"kernel": 4}, "odd"),
        ("lru", {}, "unknown KV policy 'lru'"),
    ],
)
def test_bad_input_is_one_clear_line(name, params, needle):
    with pytest.raises(HarnessError, match=needle) as err:
        build_policy(name, **params)
    assert "\n" not in str(err.value)


# --- streaming ------------------------------------------------------------------------------------
@pytest.mark.parametrize("length", [1, 5, 99, 100, 101, 1000])
def test_streaming_keeps_sinks_and_recent_within_budget(length):
    pol = StreamingLLM(budget=100, sinks=4)
    sel = pol.select(0, torch.zeros(2, 1, 8), torch.zeros(2, length, 8), length)
    assert sel.shape == (2, length) and int(sel[0].sum()) == min(length, 100)
    assert sel[:, : min(4, length)].all() and sel[:, max(length - 96, 0) :].all()


# --- quest ----------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    length=st.integers(1, 70),
    page=st.sampled_from([1, 2, 4, 8, 16]),
    rows=st.integers(1, 3),
    scale=st.floats(0.01, 100.0),
)
def test_quest_page_bound_never_below_true_max(seed, length, page, rows, scale):
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(3, length, 8, generator=g) * scale
    q = torch.randn(3, rows, 8, generator=g) * scale
    kmin, kmax = page_minmax(k, page)
    bound = page_bounds(q, kmin, kmax)  # [3, rows, pages]
    for p in range(kmin.shape[1]):
        true = (q.double() @ k[:, p * page : (p + 1) * page].double().transpose(1, 2)).amax(-1)
        assert (bound[..., p].double() >= true - 1e-5 * scale * scale).all()


def test_quest_selects_top_pages_per_kv_head_and_the_last_page():
    eng = FakeEngine(layers=3, hkv=2, d=8)
    pol = Quest(budget=64, page_size=16, dense_layers=1)
    pol.attach(eng)
    pol.reset(150)
    eng.append(torch.randn(3, 2, 150, 8))
    q = torch.randn(4, 2, 8)  # 4 query heads (GQA 2:1), 2 restricted rows
    assert pol.visible(0, q, eng.cache.k[0, :, :150], 150).all()  # dense layer
    sel = pol.select(1, q, eng.cache.k[1, :, :150], 150)
    kmin, kmax = page_minmax(eng.cache.k[1, :, :150], 16)
    for h in range(2):  # brute force: max over the group's heads and rows, top 3 older pages + last
        b = [
            max(
                float(page_bounds(q[2 * h + g], kmin[h, p : p + 1], kmax[h, p : p + 1]).max())
                for g in range(2)
            )
            for p in range(9)
        ]
        want = sorted(sorted(range(9), key=lambda p: -b[p])[:3] + [9])
        got = sorted({i // 16 for i in sel[h].nonzero().squeeze(1).tolist()})
        assert got == want
        assert int(sel[h].sum()) <= 64


def test_the_cache_says_when_its_slots_hold_their_positions(tiny_lm):
    """`KVCache.in_order` (policies then read slots as positions): true after a reset and commits in
    sequence order, false once entries are swapped or dropped; a draft's `Engine.evict` renumbers the
    moved entries, so it stays true there."""
    eng = Engine(tiny_lm.model)
    eng.reset(64)
    eng.prefill(list(range(3, 23)))
    cache = eng.cache

    def held() -> bool:
        return torch.equal(cache.slot_pos[: cache.length], torch.arange(cache.length, device=eng.device))

    assert cache.in_order and held()
    eng.evict(4, 9)  # StreamingLLM in the draft's own cache: slot == position again
    assert cache.in_order and held() and cache.length == 15
    cache.drop(2, 4)
    assert not cache.in_order and not held()
    eng.reset(64)
    assert cache.in_order
    eng.prefill(list(range(3, 23)))
    cache.swap_slots(torch.tensor([0, 1]), torch.tensor([5, 6]))
    assert not cache.in_order and not held()


@pytest.mark.parametrize("tail_from", [None, 50, 58])
def test_streaming_window_written_as_a_hole_equals_its_selection_mask(tiny_lm, tail_from):
    """Over slots that hold their positions StreamingLLM's visibility is written as a hole in the cached
    slots (`fixed_hole`): the same mask and reads as the selection tensor's (restricted rows as a range
    or as flags); once entries moved, the selection tensor is used."""
    from kv_policies.shared_selection import SelectionView

    eng = Engine(tiny_lm.model)
    eng.reset(128)
    eng.prefill(list(range(3, 63)))
    pol = StreamingLLM(budget=16, sinks=4)
    pol.attach(eng)
    n = 7
    block_mask = torch.ones(n, n, dtype=torch.bool).tril()
    flags = torch.tensor([False, False, True, False, True, True, True])
    for restricted, rows in ((torch.tensor([False] * 3 + [True] * 4), slice(3, n)), (flags, None)):
        hole = SelectionView.build(pol, eng, block_mask, restricted, tail_from, rows)
        assert pol.fixed_hole(selectable_length(eng.length, tail_from)) is not None
        pol.fixed_hole = lambda cache_len: None  # the selection tensor's path
        plain = SelectionView.build(pol, eng, block_mask, restricted, tail_from, rows)
        del pol.fixed_hole
        assert torch.equal(hole.mask, plain.mask) and hole.read == plain.read
        assert not hole.mask[rows or slice(None)].all()  # the window restricted something
    eng.cache.swap_slots(torch.tensor([0]), torch.tensor([30]))
    assert pol.fixed_hole(eng.length) is None


def test_policies_see_logical_positions_through_a_permuted_cache():
    """Keys are post-RoPE, so slots may be permuted (cache.swap_slots); selections follow slot_pos."""
    eng = FakeEngine(layers=3, hkv=2, d=8, capacity=300)
    eng.append(torch.randn(3, 2, 200, 8))
    q = torch.randn(4, 1, 8)
    before = {}
    for name, pol in (
        ("quest", Quest(budget=64, page_size=16, dense_layers=0)),
        ("streaming", StreamingLLM(budget=50, sinks=4)),
    ):
        pol.attach(eng)
        before[name] = pol.visible(2, q, eng.cache.k[2, :, :200], 200)
    other = 100 + torch.randperm(100, generator=torch.Generator().manual_seed(1))
    eng.cache.swap_slots(torch.arange(100), other)  # slot s < 100 <-> a random slot >= 100
    for name, pol in (
        ("quest", Quest(budget=64, page_size=16, dense_layers=0)),
        ("streaming", StreamingLLM(budget=50, sinks=4)),
    ):
        pol.attach(eng)
        after = pol.visible(2, q, eng.cache.k[2, :, :200], 200)
        assert torch.equal(after, before[name][:, eng.cache.slot_pos[:200]])


# --- snapkv ---------------------------------------------------------------------------------------
def brute_snapkv(q_win, k, scale, kernel, pooling):
    """Per KV head, the pooled vote of every earlier position (loops, float64)."""
    h, w, _ = q_win.shape
    hkv, n, _ = k.shape
    g = h // hkv
    scores = []
    for j in range(hkv):
        total = [0.0] * (n - w)
        for gi in range(g):
            votes = [0.0] * (n - w)
            for i in range(w):
                row = n - w + i
                logits = [float(q_win[j * g + gi, i] @ k[j, t]) * scale for t in range(row + 1)]
                mx = max(logits)
                z = sum(math.exp(x - mx) for x in logits)
                for t in range(n - w):
                    votes[t] += math.exp(logits[t] - mx) / z
            for t in range(n - w):
                win = [votes[u] for u in range(t - kernel // 2, t + kernel // 2 + 1) if 0 <= u < n - w]
                total[t] += max(win) if pooling == "max" else sum(win) / kernel
        scores.append(total)
    return scores


def assert_top_k(chosen: set[int], scores: list[float], k: int, tol: float = 1e-6) -> None:
    """`chosen` is a top-k of `scores` (max pooling makes exact ties, any tie order is fine)."""
    assert len(chosen) == k
    kth = sorted(scores, reverse=True)[k - 1]
    for t, s in enumerate(scores):
        if s > kth + tol:
            assert t in chosen, f"position {t} (score {s}) above the k-th score {kth} was dropped"
        elif s < kth - tol:
            assert t not in chosen, f"position {t} (score {s}) below the k-th score {kth} was kept"


@pytest.mark.parametrize("pooling", ["max", "avg"])
def test_snapkv_selection_equals_brute_force_across_prefill_chunks(tiny_lm, pooling):
    eng = Engine(tiny_lm.model, prefill_chunk=64)  # window straddles two chunks
    pol = SnapKV(budget=40, window=8, kernel=5, pooling=pooling)
    pol.attach(eng)
    captured: dict[int, list[torch.Tensor]] = {}
    capture = lambda li, q, k, cl: captured.setdefault(li, []).append(q.clone())  # noqa: E731
    prompt = torch.randint(0, 256, (132,), generator=torch.Generator().manual_seed(3)).tolist()
    eng.reset(200)
    pol.reset(len(prompt))
    eng.prefill(prompt, hooks=[*pol.prefill_hooks(), capture])
    pol.after_prefill(eng)
    for layer in range(eng.cache.n_layers):
        q_all = torch.cat(captured[layer], dim=1)
        k = eng.cache.k[layer, :, :132]
        scores = brute_snapkv(q_all[:, -8:], k, eng.scale, 5, pooling)
        sel = pol.select(layer, q_all[:, -1:], k, 132)
        for h, sc in enumerate(scores):
            kept = set(sel[h].nonzero().squeeze(1).tolist())
            assert set(range(124, 132)) <= kept  # the observation window
            assert_top_k(kept - set(range(124, 132)), sc, 40 - 8)
        assert torch.equal(
            pol.select(layer, q_all[:, -1:], eng.cache.k[layer, :, :150], 150)[:, 132:].cpu(),
            torch.ones(k.shape[0], 18, dtype=torch.bool),
        )  # generated tokens stay


# --- h2o ------------------------------------------------------------------------------------------
class BruteH2O:
    def __init__(self, hkv, budget, recent, scale):
        self.score = [dict() for _ in range(hkv)]
        self.alive = [set() for _ in range(hkv)]
        self.budget, self.recent, self.scale, self.hkv = budget, recent, scale, hkv

    def add(self, q, k, first_row):  # q [H, r, d] rows at positions first_row.., k [hkv, n, d]
        g = q.shape[0] // self.hkv
        for j in range(self.hkv):
            for gi in range(g):
                for i in range(q.shape[1]):
                    cols = sorted(self.alive[j]) if first_row is None else range(first_row + i + 1)
                    logits = {t: float(q[j * g + gi, i] @ k[j, t]) * self.scale for t in cols}
                    mx = max(logits.values())
                    z = sum(math.exp(x - mx) for x in logits.values())
                    for t, x in logits.items():
                        self.score[j][t] = self.score[j].get(t, 0.0) + math.exp(x - mx) / z

    def evict(self, n):
        for j in range(self.hkv):
            if len(self.alive[j]) > self.budget:
                older = [t for t in self.alive[j] if t < n - self.recent]
                heavy = sorted(older, key=lambda t: -self.score[j][t])[: self.budget - self.recent]
                self.alive[j] = set(heavy) | {t for t in self.alive[j] if t >= n - self.recent}


@pytest.mark.parametrize("fixed_shape", [False, True], ids=["plain", "steady"])
def test_h2o_selection_equals_brute_force(fixed_shape):
    """`steady`: on an engine with fixed-shape forwards, whose eager twin runs H2O's update at fixed
    shapes once it evicts at every step (`FixedCommit`, `kv_policies/h2o_rule.py`)."""
    torch.manual_seed(0)
    eng = FakeEngine(layers=1, hkv=2, d=8, capacity=128)
    if fixed_shape:
        eng.graphs = SimpleNamespace(capture=False)
    pol = H2O(budget=24, recent=8)
    pol.attach(eng)
    assert pol.on_prefill in pol.prefill_hooks()
    ref = BruteH2O(2, 24, 8, eng.scale)
    pol.reset(30)
    k = torch.randn(1, 2, 70, 8) * 2
    for lo, hi in [(0, 20), (20, 30)]:  # two prefill chunks
        q = torch.randn(4, hi - lo, 8) * 2
        eng.append(k[:, :, lo:hi])
        pol.on_prefill(0, q, eng.cache.k[0, :, :hi], lo)
        ref.alive = [a | set(range(lo, hi)) for a in ref.alive]
        ref.add(q, k[0], lo)
    pol.after_prefill(eng)
    ref.evict(30)
    for n in range(30, 70):
        sel = pol.select(0, torch.zeros(4, 1, 8), eng.cache.k[0, :, :n], n)
        for j in range(2):
            assert set(sel[j].nonzero().squeeze(1).tolist()) == ref.alive[j], f"step {n} head {j}"
            assert len(ref.alive[j]) == 24 and set(range(n - 8, n)) <= ref.alive[j]
        q = torch.randn(4, 1, 8) * 2
        pol.observe(0, q)
        eng.append(k[:, :, n : n + 1])
        pol.after_commit(eng, 1)
        ref.alive = [a | {n} for a in ref.alive]
        ref.add(q, k[0], None)
        ref.evict(n + 1)
    assert (pol._fixed is not None) == fixed_shape


def test_h2o_mass_softmax_pads_short_rows_and_equals_the_plain_softmax():
    """Under 16 keys the CPU softmax is padded with -inf columns (PyTorch's kernel is scalar there): the
    probabilities, masked keys included, and H2O's attention mass equal the plain softmax's."""
    from core.attention import SOFTMAX_MIN_CPU, softmax_lastdim
    from kv_policies.attention_mass import attention_mass_layers

    g = torch.Generator().manual_seed(0)
    for m in (1, 5, 11, SOFTMAX_MIN_CPU - 1, SOFTMAX_MIN_CPU, 23):
        x = torch.randn(2, 3, 4, m, generator=g) * 3
        x[..., 0, : m // 2] = float("-inf")  # masked keys keep probability 0
        got = softmax_lastdim(x)
        assert got.shape == x.shape
        torch.testing.assert_close(got, x.softmax(-1), atol=1e-7, rtol=1e-6)
        q, k = torch.randn(2, 6, 5, 8, generator=g), torch.randn(2, 3, m, 8, generator=g)
        visible = torch.rand(2, 3, m, generator=g) < 0.7
        visible[..., 0] = True
        logits = (q.reshape(2, 3, 10, 8) @ k.transpose(-1, -2)) * 0.3
        want = logits.masked_fill(~visible[:, :, None, :], float("-inf")).softmax(-1).sum(2)
        torch.testing.assert_close(attention_mass_layers(q, k, 0.3, visible), want, atol=1e-6, rtol=1e-6)


def test_h2o_updates_every_layer_at_once_as_it_does_layer_by_layer(engine_and_prompt):
    """H2O scores and evicts all layers in one batch of operators when they observed the same rows; the
    layer-by-layer path gives the same selections and the same tokens."""
    eng, prompt = engine_and_prompt

    class LayerByLayer(H2O):
        def _commit(self, layers, queries, start, n_new, count, whole):
            for li in range(layers.start, layers.stop):
                q = None if queries is None else queries[li - layers.start][None]
                super()._commit(slice(li, li + 1), q, start, n_new, count, False)

    outs, alive, scores = [], [], []
    for cls in (H2O, LayerByLayer):
        pol = cls(budget=40, recent=16)
        outs.append(_run(eng, pol, prompt)[0])
        alive.append(pol._A[:, :, : eng.length].clone())
        scores.append(pol._S[:, :, : eng.length].clone())
    assert outs[0] == outs[1] and torch.equal(alive[0], alive[1]) and not alive[0].all()
    torch.testing.assert_close(scores[0], scores[1], atol=1e-5, rtol=1e-5)


# --- compressed region layout ---------------------------------------------------------------------
class RandomPolicy(KVPolicy):
    """Selects a fresh random subset per (layer, head) every call (exercises arbitrary swaps)."""

    name = "random"

    def __init__(self, budget: int, shared: bool, seed: int = 0) -> None:
        self.budget, self.shared = budget, shared
        self.g = torch.Generator().manual_seed(seed)
        self.last: dict[int, torch.Tensor] = {}

    def select(self, layer, q, k_cache, cache_len):
        hkv = k_cache.shape[0]
        if self.shared and layer > 0:  # one selection for every layer
            self.last[layer] = self.last[0]
            return self.last[0]
        m = int(torch.randint(1, self.budget + 1, (1,), generator=self.g))
        rows = 1 if self.shared else hkv
        sel = torch.zeros(rows, cache_len, dtype=torch.bool)
        for r in range(rows):
            sel[r, torch.randperm(cache_len, generator=self.g)[:m]] = True
        self.last[layer] = sel.expand(hkv, cache_len)
        return self.last[layer]


@pytest.mark.parametrize("shared", [False, True])
def test_region_holds_exactly_the_selection_after_many_steps(shared):
    eng = FakeEngine(layers=2, hkv=2, d=4, capacity=400)
    logical_k = torch.randn(2, 2, 400, 4)
    logical_v = torch.randn(2, 2, 400, 4)
    eng.append(logical_k[:, :, :150], logical_v[:, :, :150])
    pol = RandomPolicy(budget=60, shared=shared)
    pol.attach(eng)
    region = CompressedRegion(pol, eng, backend="sliced")
    assert region.size == 128
    for _ in range(80):
        n = eng.length
        for layer in range(2):
            region.place(layer, pol.select(layer, None, eng.cache.k[layer, :, :n], n))
            for h in range(2):
                want = set(pol.last[layer][h].nonzero().squeeze(1).tolist())
                assert region.selected(layer, h) == want
        # every slot still holds the K/V of the logical position the region says it holds
        pos = region.pos[:, :, :n].unsqueeze(-1).expand(-1, -1, -1, 4)
        assert torch.equal(eng.cache.k[:, :, :n], logical_k[:, :, :n].gather(2, pos))
        assert torch.equal(eng.cache.v[:, :, :n], logical_v[:, :, :n].gather(2, pos))
        eng.append(logical_k[:, :, n : n + 2], logical_v[:, :, n : n + 2])
    assert region.swaps > 0
    region.restore()
    n = eng.length
    assert torch.equal(eng.cache.k[:, :, :n], logical_k[:, :, :n])
    assert torch.equal(eng.cache.slot_pos[:n], torch.arange(n))


def test_region_refuses_a_crop_that_lost_moved_entries():
    eng = FakeEngine(layers=1, hkv=1, d=4, capacity=300)
    eng.append(torch.randn(1, 1, 200, 4))
    pol = StreamingLLM(budget=20, sinks=2)
    pol.attach(eng)
    region = CompressedRegion(pol, eng, backend="sliced")
    region.place(0, pol.select(0, None, eng.cache.k[0, :, :200], 200))  # recent 180..199 -> slots 2..19
    eng.cache.crop(150)
    with pytest.raises(RuntimeError, match="restore"):
        region.sync(150)


# --- end to end with vanilla ----------------------------------------------------------------------
POLICIES = {
    "streaming": {"budget": 40, "sinks": 4},
    "quest": {"budget": 48, "page_size": 8, "dense_layers": 1},
    "snapkv": {"budget": 40, "window": 8, "kernel": 3},
    "h2o": {"budget": 40, "recent": 16},
}


def _run(eng, pol, prompt, new=24):
    counts = Counts()
    out = Vanilla(eng, pol).generate(prompt, new, set(), counts)
    return out, counts


@pytest.fixture(scope="module")
def engine_and_prompt(tiny_lm):
    prompt = torch.randint(0, 256, (120,), generator=torch.Generator().manual_seed(5)).tolist()
    return Engine(tiny_lm.model), prompt


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_runs_with_vanilla_within_budget(engine_and_prompt, name):
    eng, prompt = engine_and_prompt
    pol = build_policy(name, **POLICIES[name])
    out, counts = _run(eng, pol, prompt)
    assert len(out) == 24 and counts.forwards == 23
    assert pol.budget == POLICIES[name]["budget"]
    layers = eng.cache.n_layers
    dense = POLICIES[name].get("dense_layers", 0)
    sparse = POLICIES[name]["budget"] + (24 if name == "snapkv" else 0)  # snapkv keeps generated tokens
    bound = math.ceil((dense * (len(prompt) + 24) + (layers - dense) * sparse) / layers)
    for step in counts.steps:  # mean over layers of cached entries read per KV head
        assert step.kv_attended <= bound
    sliced, _ = _run(eng, build_policy(name, backend="sliced", **POLICIES[name]), prompt)
    assert sliced == out  # the compressed-region layout attends to exactly the same entries


def test_full_policy_equals_plain_vanilla(engine_and_prompt):
    eng, prompt = engine_and_prompt
    plain = Vanilla(eng).generate(prompt, 24, set(), Counts())
    assert _run(eng, build_policy("full"), prompt)[0] == plain


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_budget_covering_the_context_is_exactly_full(engine_and_prompt, name):
    eng, prompt = engine_and_prompt
    plain = Vanilla(eng).generate(prompt, 24, set(), Counts())
    params = {**POLICIES[name], "budget": 1000}
    out, counts = _run(eng, build_policy(name, **params), prompt)
    assert out == plain
    assert counts.steps[-1].kv_attended == len(prompt) + 22
