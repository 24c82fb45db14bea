"""Fixed-shape decode forwards under KV policies (core/decode_graph.py): restricted blocks, whose
selection is chosen before the forward or inside it, and what a forward stages from a view (its
selection, its restricted rows, its block and hole). Eager here, captured as CUDA graphs on a GPU; each
gives the regular `Engine.step`'s tokens, counts and policy activity."""

from __future__ import annotations

import pytest
import torch

from core.attention import BlockView, CausalView
from core.engine import Engine
from core.policy_views import restricted_view
from kv_policies.stacking import every_layer
from tests.helpers import _static

FIXED_POLICIES = {  # at budgets below the 60-token prompt
    "streaming": {"budget": 20, "sinks": 4},  # one selection for every layer and head
    "snapkv": {"budget": 24, "window": 8},  # per layer and head, from the prefill
    "h2o": {"budget": 24, "recent": 8},  # per layer and head, from the queries it observes
    "retrieval": {"budget": 24, "chunk": 4},  # per layer and head, from the last prompt query
    "quest": {"budget": 24, "page_size": 8, "dense_layers": 0},  # per layer, from this forward's queries
    "topk": {"budget": 24},  # per layer and head, from this forward's exact attention
}


@pytest.mark.parametrize("name", sorted(FIXED_POLICIES))
def test_restricted_blocks_take_the_fixed_shape_forward(tiny_lm, name):
    """A restricted block is one staged visibility when the policy chooses before the forward
    (`SelectionView`, `LayerSelectionView`), or chooses inside the fixed-shape forward from its queries
    (Quest, `QuestSelector`; Top-K, `TopKSelector`): vanilla + the policy and FAFO with it take the
    fixed-shape forward on every decode step and give the tokens, KV reads and policy activity of the regular
    `RestrictedView`."""
    from core.types import Counts
    from decoders.fafo.decoder import FAFO
    from decoders.vanilla import Vanilla
    from kv_policies.registry import REGISTRY, build_policy

    module, cls = REGISTRY[name].split(":")
    policy_class = getattr(__import__(module, fromlist=[cls]), cls)

    class PerLayer(policy_class):  # the reference: the regular forward's `RestrictedView`
        query_free = False

        def fixed_selection(self, cache_len):
            return None

        Selector = None  # no in-forward choice

    prompt = torch.randint(0, 256, (60,), generator=torch.Generator().manual_seed(3)).tolist()
    for make in (lambda e, kv: Vanilla(e, kv), lambda e, kv: FAFO(e, kv, k=2, n=4)):
        ref_kv, ref_counts = PerLayer(**FIXED_POLICIES[name]), Counts()
        ref = make(Engine(tiny_lm.model), ref_kv).generate(prompt, 24, set(), ref_counts)
        static, counts = _static(tiny_lm), Counts()
        kv = build_policy(name, **FIXED_POLICIES[name])
        assert make(static, kv).generate(prompt, 24, set(), counts) == ref
        assert static.fixed_shape_steps == counts.forwards > 0
        assert [s.kv_attended for s in counts.steps] == [s.kv_attended for s in ref_counts.steps]
        activity = kv.activity.summary(counts.forwards)
        assert activity == ref_kv.activity.summary(ref_counts.forwards) and activity.restricted_frac > 0.5


def test_triforce_middle_level_over_retrieval_takes_the_fixed_shape_forward(tiny_lm):
    """TriForce's middle level checks the draft model's tokens in a block of every row restricted to the
    retrieval selection, which observes their queries: on the fixed-shape path (blocks padded to a power
    of two) it gives the regular path's tokens and counts, and the policy sees the real rows only."""
    from core.types import Counts
    from decoders.draft_model import DraftModel
    from decoders.triforce import TriForce
    from kv_policies.registry import build_policy

    prompt = torch.randint(0, 256, (60,), generator=torch.Generator().manual_seed(7)).tolist()
    results = []
    for eng in (Engine(tiny_lm.model), _static(tiny_lm)):
        draft = DraftModel(eng.truncated(1), "self-1", eng.w.vocab_size, budget=24, sinks=4, room=12)
        kv = build_policy("retrieval", budget=24, chunk=4)
        counts = Counts()
        dec = TriForce(eng, kv=kv, gamma1=2, gamma2=4, draft=draft, rebuild_every=1)  # from the last queries
        out = dec.generate(prompt, 24, set(), counts)
        results.append((out, counts.draft_forwards, counts.accepted_l1, kv.activity.summary(counts.forwards)))
    assert results[0] == results[1]


@pytest.mark.parametrize("name", ["quest", "topk"])
def test_a_later_policy_on_the_same_engine_is_served_from_its_own_state(tiny_lm, name):
    """A fixed-shape forward that chooses inside itself is kept per engine and selector settings, so a
    second policy object with the same settings (a new run on the engine, another method beside it)
    takes the forward the first one made: it stages from that step's policy, and its tokens are those
    of the regular path, not of the first policy's page extremes."""
    from core.types import Counts
    from decoders.fafo.decoder import FAFO
    from decoders.vanilla import Vanilla
    from kv_policies.registry import build_policy

    settings = FIXED_POLICIES[name]
    gen = torch.Generator().manual_seed(3)
    first, later = (torch.randint(0, 256, (n,), generator=gen).tolist() for n in (60, 50))
    for make in (lambda e, kv: Vanilla(e, kv), lambda e, kv: FAFO(e, kv, k=2, n=4)):
        shared = _static(tiny_lm)
        make(shared, build_policy(name, **settings)).generate(first, 24, set(), Counts())
        got = make(shared, build_policy(name, **settings)).generate(later, 24, set(), Counts())
        want = make(Engine(tiny_lm.model), build_policy(name, **settings)).generate(
            later, 24, set(), Counts()
        )
        assert got == want
        assert len(shared.graphs.by_rows_in_forward) >= 1


def test_self_speculation_over_top_k_takes_the_fixed_shape_forward(tiny_lm):
    """Self-speculation's draft steps see Top-K's choice among the entries before their fresh tail, and
    the tail: on the fixed-shape path (the choice made inside the forward, the first layer dense) every
    decode forward takes it, with the regular path's tokens, acceptance, KV reads and policy activity."""
    from core.types import Counts
    from decoders.selfspec import SelfSpeculative
    from kv_policies.registry import build_policy

    prompt = torch.randint(0, 256, (60,), generator=torch.Generator().manual_seed(11)).tolist()
    results = []
    for eng in (Engine(tiny_lm.model), _static(tiny_lm)):
        kv, counts = build_policy("topk", budget=24, dense_layers=1), Counts()
        out = SelfSpeculative(eng, kv=kv, gamma=4).generate(prompt, 24, set(), counts)
        reads = [s.kv_attended for s in counts.steps]
        results.append(
            (out, counts.draft_forwards, counts.accepted, reads, kv.activity.summary(counts.forwards))
        )
        forwards = counts.forwards + counts.draft_forwards  # verifications and draft steps
    assert results[0] == results[1] and results[0][4].restricted_frac > 0.5
    assert eng.fixed_shape_steps == forwards and eng.graphs.by_rows_in_forward


@pytest.mark.parametrize(("name", "settings"), [("streaming", {"sinks": 4}), ("retrieval", {"chunk": 4})])
def test_self_speculation_drafts_stage_their_selection_once_per_draft(tiny_lm, name, settings):
    """A draft's one-row steps share one selection. On the fixed-shape path StreamingLLM's is a hole,
    which the forward builds into its own visibility (no mask copied a row); retrieval's is a prefix of
    its stack, copied when a rebuild makes a new stack or a length falls inside the masks, not a row.
    Both give the regular path's tokens, acceptance, KV reads and policy activity."""
    from core.types import Counts
    from decoders.selfspec import SelfSpeculative
    from kv_policies.registry import build_policy

    prompt = torch.randint(0, 256, (60,), generator=torch.Generator().manual_seed(13)).tolist()
    results, copies = [], []
    for eng in (Engine(tiny_lm.model), _static(tiny_lm)):
        kv, counts = build_policy(name, budget=20, **settings), Counts()
        dec = SelfSpeculative(eng, kv=kv, gamma=4, rebuild_every=3 if name == "retrieval" else 0)
        with _CopyCount() as copied:
            out = dec.generate(prompt, 24, set(), counts)
        copies.append(copied.at("_stage_selection") + copied.at("_stage_visibility"))
        reads = [s.kv_attended for s in counts.steps]
        results.append(
            (out, counts.draft_forwards, counts.accepted, reads, kv.activity.summary(counts.forwards))
        )
    assert results[0] == results[1] and results[0][4].restricted_frac > 0.5
    assert eng.fixed_shape_steps == counts.forwards + counts.draft_forwards
    assert not eng.graphs.by_rows_masked  # no draft row staged a mask
    if name == "retrieval":  # the first stack, and one after each rebuild that changed it
        assert 1 <= copies[1] <= 1 + counts.kv_rebuilds < counts.draft_forwards
    else:
        assert copies[1] == 0 and eng.graphs.by_rows_holed


class _CopyCount(torch.overrides.TorchFunctionMode):
    """`Tensor.copy_` calls by the function that made them."""

    def __init__(self) -> None:
        super().__init__()
        self.sites: dict[str, int] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.copy_:
            import sys

            name = sys._getframe(1).f_code.co_name
            self.sites[name] = self.sites.get(name, 0) + 1
        return func(*args, **(kwargs or {}))

    def at(self, name: str) -> int:
        return self.sites.get(name, 0)


def test_sfi_slow_and_fast_steps_take_the_fixed_shape_forward(tiny_lm):
    """SFI's slow steps (dense, the Selector watching every layer's queries) and fast steps (the set
    chosen at the last slow step) both take the fixed-shape forward, with the regular path's tokens,
    slow steps and KV reads: the forward keeps the queries and the Selector gets them after it."""
    from core.types import Counts
    from decoders.sfi import SlowFast
    from kv_policies.sfi import SFI

    prompt = torch.randint(0, 256, (60,), generator=torch.Generator().manual_seed(5)).tolist()
    every = set(range(0, 256, 7))  # boundary tokens: slow steps now and then
    results, staged = [], []
    for eng in (Engine(tiny_lm.model), _static(tiny_lm)):
        counts = Counts()
        pol = SFI(k=8, sinks=2, recent=6, window=3)
        stacked = pol.layer_selections

        def checked(cache_len, pol=pol, stacked=stacked):  # the stack is every layer's `visible`
            got = stacked(cache_len)
            if got is not None:  # None: the view asks layer by layer itself
                staged.append(torch.equal(got, every_layer(pol, cache_len)))
            return got

        pol.layer_selections = checked
        dec = SlowFast(eng, kv=pol, t_max=4, trigger_token_ids=every)
        out = dec.generate(prompt, 24, set(), counts)
        results.append((out, counts.slow_steps, [s.kv_attended for s in counts.steps]))
    assert results[0] == results[1] and 0 < results[0][1] < 23
    assert staged and all(staged)
    assert eng.fixed_shape_steps == 23 and eng.graphs.by_rows_observed and eng.graphs.by_rows_selected


def test_a_streaming_hole_is_written_into_the_staged_visibility_without_a_mask(tiny_lm):
    """A block restricted to StreamingLLM's window over slots that hold their positions is a `HoleView`:
    the fixed-shape forward stages the whole cache and writes the hole into its own visibility, which
    equals the view's mask, without building that mask, and gives the regular step's logits (restricted
    rows as a range and as flags)."""
    from kv_policies.shared_selection import HoleView
    from kv_policies.streaming import StreamingLLM

    prompt = list(range(3, 43))
    n = 5
    block = torch.ones(n, n, dtype=torch.bool).tril()
    flags = torch.tensor([False, True, False, True, True])
    for restricted, rows in ((torch.tensor([False, False, True, True, True]), slice(2, n)), (flags, None)):
        logits = []
        for eng in (Engine(tiny_lm.model), _static(tiny_lm)):
            eng.reset(64)
            eng.prefill(prompt)
            pol = StreamingLLM(budget=12, sinks=4)
            pol.attach(eng)
            dev = eng.device
            view = restricted_view(pol, eng, block.to(dev), restricted.to(dev), "dense", rows=rows)
            assert isinstance(view, HoleView) and view.cache_hole == (4, 32)
            tokens, pos = torch.arange(5, 5 + n, device=dev), torch.arange(40, 40 + n, device=dev)
            logits.append(eng.step(tokens, pos, view))
        staged = eng.graphs.by_rows_holed[8].visible
        assert view._mask is None and eng.fixed_shape_steps == 1  # staged without the view's mask
        assert torch.equal(staged[:n, : 40 + n], view.mask) and not staged[:n, 40 + n :].any()
        assert not view.mask[2:].all() and view.mask[:2, :40].all() == (rows is not None)
        torch.testing.assert_close(logits[1], logits[0], atol=1e-5, rtol=1e-5)


def test_the_visibility_built_in_the_forward_follows_a_mask_written_in_place_and_a_moving_hole(tiny_lm):
    """The fixed-shape forward builds its visibility from what was staged last: the same block mask
    object comes back step after step unstaged, one written in place since is staged again (its
    version), and each step's hole, block or causal triangle is the one that step's logits see."""
    from kv_policies.shared_selection import HoleView

    prompt = list(range(3, 43))
    n = 5
    block = torch.ones(n, n, dtype=torch.bool).tril()
    restricted = torch.tensor([False, True, False, True, True])
    steps = []  # (view maker, rows kept) in order; the same block object throughout
    steps.append(lambda e: BlockView(block, e.scale))
    steps.append(lambda e: BlockView(block, e.scale))  # unchanged: not staged again
    steps.append(lambda e: HoleView(block, restricted, None, (4, 20), e.length, e, 0))
    steps.append(lambda e: HoleView(block, restricted, slice(1, n), (9, 30), e.length, e, 0))
    steps.append(lambda e: BlockView(block, e.scale))  # the hole gone again
    steps.append(lambda e: CausalView(e.scale))
    out = []
    for eng in (Engine(tiny_lm.model), _static(tiny_lm)):
        block[:] = torch.ones(n, n, dtype=torch.bool).tril()
        eng.reset(64)
        eng.prefill(prompt)
        logits = []
        for i, make in enumerate(steps):
            if i == 1:
                block[4, 2] = False  # written in place between two steps
            p = eng.length
            tokens, pos = torch.arange(5, 5 + n), torch.arange(p, p + n)
            logits.append(eng.step(tokens, pos, make(eng)))
            eng.commit([0])
        out.append(torch.stack(logits))
    assert eng.fixed_shape_steps == len(steps)
    torch.testing.assert_close(out[1], out[0], atol=1e-5, rtol=1e-5)


def test_staged_selections_and_restricted_rows_are_those_of_the_step_staged_last(tiny_lm):
    """A selection forward stages a view's selection and restricted rows; it skips what is unchanged
    (the same restricted mask and row count; slots past the selection still True), so after any
    sequence of views its buffers hold exactly what staging the last view alone would."""
    from types import SimpleNamespace

    from core.decode_graph import StaticForward

    eng = Engine(tiny_lm.model)
    eng.reset(40)
    layers, hkv, rows, capacity = eng.cache.n_layers, eng.cache.n_kv_heads, 4, eng.cache.capacity
    gen = torch.Generator().manual_seed(0)
    masks = [torch.tensor([True, False, True, True]), torch.tensor([False, True])]

    def view(sel_len: int, mask: torch.Tensor) -> SimpleNamespace:
        chosen = torch.rand(layers, hkv, sel_len, generator=gen) < 0.5
        return SimpleNamespace(chosen=chosen, restricted=mask, prefix_of=None)

    def staged(fwd: StaticForward, v: SimpleNamespace) -> tuple[torch.Tensor, torch.Tensor]:
        fwd._stage_selection(v, v.restricted.numel(), 20, capacity)
        return fwd.selection.clone(), fwd.restricted.clone()

    fwd = StaticForward(eng, rows, capture=False, layered=True)
    shared = masks[0]
    for v in [view(18, shared), view(9, shared), view(12, masks[1]), view(5, shared), view(15, shared)]:
        fresh = StaticForward(eng, rows, capture=False, layered=True)
        assert all(torch.equal(a, b) for a, b in zip(staged(fwd, v), staged(fresh, v), strict=True))
        assert fwd.selection[:, :, v.chosen.shape[2] :].all()


def test_a_stack_prefix_is_copied_again_only_when_a_length_falls_inside_its_masks(tiny_lm):
    """A selection that is a prefix of a policy's stack (`prefix_of`: True from `width` on) is copied
    when first staged; another prefix of that stack is not while both lengths are past `width` (what
    lies between them is True in the stack and in the buffer), and is when either is inside the masks,
    for another stack, or after a selection of no stack. The buffer always equals a fresh staging."""
    from types import SimpleNamespace

    from core.decode_graph import StaticForward

    eng = Engine(tiny_lm.model)
    eng.reset(40)
    layers, hkv, capacity, width = eng.cache.n_layers, eng.cache.n_kv_heads, eng.cache.capacity, 8
    gen = torch.Generator().manual_seed(1)
    restricted = torch.ones(4, dtype=torch.bool)

    def stack() -> torch.Tensor:
        s = torch.ones(layers, hkv, capacity, dtype=torch.bool)
        s[:, :, :width] = torch.rand(layers, hkv, width, generator=gen) < 0.5
        return s

    a, b = stack(), stack()

    def view(source: torch.Tensor | None, sel_len: int) -> SimpleNamespace:
        if source is None:
            chosen = torch.rand(layers, hkv, sel_len, generator=gen) < 0.5
            return SimpleNamespace(chosen=chosen, restricted=restricted, prefix_of=None)
        return SimpleNamespace(
            chosen=source[:, :, :sel_len], restricted=restricted, prefix_of=(source, width)
        )

    fwd = StaticForward(eng, 4, capture=False, layered=True)
    fwd._stage_restricted(view(a, 9), 4)  # the restricted rows, staged once for every view below
    steps = [(a, 12, 1), (a, 15, 0), (a, 10, 0), (a, 6, 1), (a, 14, 1), (a, 9, 0), (b, 14, 1), (None, 9, 1),
             (a, 16, 1), (a, 13, 0)]  # fmt: skip
    for source, sel_len, copied in steps:
        v = view(source, sel_len)
        with _CopyCount() as copies:
            fwd._stage_selection(v, 4, 20, capacity)
        fresh = StaticForward(eng, 4, capture=False, layered=True)
        fresh._stage_selection(v, 4, 20, capacity)
        assert copies.at("_stage_selection") == copied, (sel_len, copied)
        assert torch.equal(fwd.selection, fresh.selection)
