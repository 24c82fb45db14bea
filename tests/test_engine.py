"""The shared primitive: a block with a tree mask + commit == decoding the kept tokens one by one."""

from __future__ import annotations

import pytest
import torch

from core.attention import BlockView, CausalView, MaskView
from core.engine import Engine
from core.tree_attention import HybridTreeView
from kv_policies.base import KVPolicy


def _sequential(engine: Engine, prompt: list[int], tokens: list[int]):
    engine.reset(64)
    engine.prefill(prompt)
    rows = []
    for t in tokens:
        pos = torch.tensor([engine.length])
        rows.append(engine.step(torch.tensor([t]), pos, CausalView(engine.scale))[0])
        engine.commit([0])
    return torch.stack(rows)


def test_prefill_matches_hf_forward(tiny_lm):
    eng = Engine(tiny_lm.model)
    ids = torch.randint(0, 256, (37,), generator=torch.Generator().manual_seed(0))
    eng.reset(64)
    ours = eng.prefill(ids.tolist())
    ref = tiny_lm.model(ids[None].to(eng.device)).logits[0, -1]
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_tree_block_then_commit_equals_sequential(tiny_lm):
    eng = Engine(tiny_lm.model)
    prompt = torch.randint(0, 256, (23,), generator=torch.Generator().manual_seed(1)).tolist()
    t0, a1, a2, b1, b2, b3 = 11, 40, 41, 50, 51, 52
    # block rows: 0=t0, 1=a1, 2=a2, 3=b1, 4=b2, 5=b3 ; branches a and b both continue t0
    parents = [-1, 0, 1, 0, 3, 4]
    depth = [0, 1, 2, 1, 2, 3]
    n, L = 6, len(prompt)
    mask = torch.zeros(n, L + n, dtype=torch.bool)
    mask[:, :L] = True
    for i in range(n):
        j = i
        while j >= 0:
            mask[i, L + j] = True
            j = parents[j]
    eng.reset(64)
    eng.prefill(prompt)
    pos = torch.tensor([L + d for d in depth])
    logits = eng.step(torch.tensor([t0, a1, a2, b1, b2, b3]), pos, MaskView(mask, eng.scale))
    eng.commit([0, 3, 4])
    k_block, v_block = eng.cache.k[:, :, : L + 3].clone(), eng.cache.v[:, :, : L + 3].clone()
    pos_block = eng.cache.slot_pos[: L + 3].clone()
    nxt = eng.step(torch.tensor([b3]), torch.tensor([L + 3]), CausalView(eng.scale))[0]

    ref_rows = _sequential(eng, prompt, [t0, b1, b2, b3])
    torch.testing.assert_close(logits[[0, 3, 4, 5]], ref_rows, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(nxt, ref_rows[3], atol=1e-5, rtol=1e-5)
    # the sequential path staged b3 last; compare the committed prefix only
    torch.testing.assert_close(k_block, eng.cache.k[:, :, : L + 3], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(v_block, eng.cache.v[:, :, : L + 3], atol=1e-6, rtol=1e-6)
    assert torch.equal(pos_block, eng.cache.slot_pos[: L + 3])
    # the other branch's logits equal decoding it sequentially too
    ref_a = _sequential(eng, prompt, [t0, a1, a2])
    torch.testing.assert_close(logits[[0, 1, 2]], ref_a, atol=1e-5, rtol=1e-5)


def test_chunked_prefill_equals_one_shot(tiny_lm):
    ids = torch.randint(0, 256, (50,), generator=torch.Generator().manual_seed(2)).tolist()
    one = Engine(tiny_lm.model, prefill_chunk=1024)
    one.reset(64)
    a = one.prefill(ids)
    chunked = Engine(tiny_lm.model, prefill_chunk=16)
    chunked.reset(64)
    b = chunked.prefill(ids)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(one.cache.k[:, :, :50], chunked.cache.k[:, :, :50], atol=1e-5, rtol=1e-5)


def test_crop_and_overflow(tiny_lm):
    eng = Engine(tiny_lm.model)
    eng.reset(8)
    eng.prefill([1, 2, 3, 4, 5])
    eng.crop(3)
    assert eng.length == 3
    try:
        eng.step(torch.arange(6), torch.arange(3, 9), CausalView(eng.scale))
    except RuntimeError as exc:
        assert "overflow" in str(exc)
    else:
        raise AssertionError("overflow not detected")


@pytest.mark.parametrize("length", [2048, 2500, 4096])
@pytest.mark.parametrize("heads", [(4, 4), (6, 2), (9, 3)])
def test_split_decode_attention_equals_sdpa(length, heads):
    """The CPU float32 one-row path (query heads of a group in one pass, the value sum split into
    chunks, a remainder chunk when the length is not a multiple) equals SDPA to float32 rounding."""
    from core.attention import decode_attention, sdpa, split_applies

    torch.manual_seed(length)
    h, hkv = heads
    q, k, v = torch.randn(1, h, 1, 64), torch.randn(1, hkv, length, 64), torch.randn(1, hkv, length, 64)
    assert split_applies(q, k)
    out, ref = decode_attention(q, k, v, 0.125), sdpa(q, k, v, None, 0.125)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("heads", [(4, 4), (9, 3)])
def test_one_row_over_two_slices_equals_sdpa_over_their_valid_keys(heads):
    """`one_row_two_slices`: a ragged first slice (valid length per KV head) and a second slice, one
    softmax over both, equals SDPA over each head's valid keys concatenated."""
    from core.attention import one_row_two_slices, sdpa

    torch.manual_seed(heads[0])
    h, hkv = heads
    q = torch.randn(1, h, 1, 16)
    k1, v1 = torch.randn(1, hkv, 40, 16), torch.randn(1, hkv, 40, 16)
    k2, v2 = torch.randn(1, hkv, 7, 16), torch.randn(1, hkv, 7, 16)
    for lens in ([40] * hkv, [40, 33, 5, 1][:hkv] if hkv > 3 else [40, 33, 5]):
        len1 = torch.tensor(lens)
        out = one_row_two_slices(q, k1, v1, len1, k2, v2, 0.25)
        g = h // hkv
        for kh in range(hkv):
            keys = torch.cat([k1[:, kh : kh + 1, : lens[kh]], k2[:, kh : kh + 1]], dim=2)
            vals = torch.cat([v1[:, kh : kh + 1, : lens[kh]], v2[:, kh : kh + 1]], dim=2)
            ref = sdpa(q[:, kh * g : (kh + 1) * g], keys, vals, None, 0.25)
            torch.testing.assert_close(out[:, kh * g : (kh + 1) * g], ref, atol=1e-6, rtol=1e-5)


def test_split_decode_attention_applies_only_where_it_gains():
    from core.attention import SPLIT_MIN_KEYS, split_applies

    q, k = torch.randn(1, 4, 1, 8), torch.randn(1, 2, SPLIT_MIN_KEYS, 8)
    assert split_applies(q, k)
    assert not split_applies(q, k[:, :, :-1])  # a short cache: SDPA
    assert not split_applies(torch.randn(1, 4, 2, 8), k)  # a block of rows
    assert not split_applies(q.bfloat16(), k.bfloat16())  # bf16 keeps SDPA's float32 accumulation


# --- fixed-shape decode forwards (core/decode_graph.py): eager here, captured as CUDA graphs on a GPU --
def _vanilla_with_steps(eng, prompt, n):
    """Greedy ids and every step's logits of vanilla on `eng`."""
    eng.reset(len(prompt) + n + 1)
    logits = eng.prefill(prompt)
    out, rows = [int(logits.argmax())], [logits]
    for i in range(n - 1):
        tok = torch.tensor([out[-1]], device=eng.device)
        pos = torch.tensor([len(prompt) + i], device=eng.device)
        step = eng.step(tok, pos, CausalView(eng.scale))
        eng.commit([0])
        rows.append(step[0])
        out.append(int(step[0].argmax()))
    return out, torch.stack(rows)


def _static(tiny_lm) -> Engine:
    from core.decode_graph import StaticForwards

    eng = Engine(tiny_lm.model)
    eng.graphs = StaticForwards(eng, capture=False)
    return eng


def test_static_decode_equals_the_regular_one_row_step(tiny_lm):
    """The fixed-shape forward (device-index cache write, attention over the whole allocation through
    a visibility of every slot) gives the regular step's logits, tokens and cache contents."""
    prompt = list(range(3, 40))
    plain = Engine(tiny_lm.model)
    ref_ids, ref_logits = _vanilla_with_steps(plain, prompt, 24)
    static = _static(tiny_lm)
    ids, logits = _vanilla_with_steps(static, prompt, 24)
    assert ids == ref_ids and set(static.graphs.by_rows) == {1}
    torch.testing.assert_close(logits, ref_logits, atol=1e-5, rtol=1e-5)
    n = plain.length
    assert static.length == n
    torch.testing.assert_close(static.cache.k[:, :, :n], plain.cache.k[:, :, :n], atol=1e-6, rtol=1e-6)
    assert torch.equal(static.cache.slot_pos[:n], plain.cache.slot_pos[:n])


def _block_step(eng, prompt, tokens, view_of, keep, logits_rows=None):
    """Prefill `prompt`, run one block of `tokens` under `view_of(eng)`, commit `keep`; the logits."""
    eng.reset(len(prompt) + 16)
    eng.prefill(prompt)
    p, dev = len(prompt), eng.device
    depth = torch.tensor([0, 1, 2, 1, 2], device=dev)[: len(tokens)]
    logits = eng.step(torch.tensor(tokens, device=dev), p + depth, view_of(eng), logits_rows=logits_rows)
    eng.commit(keep)
    return logits


@pytest.mark.parametrize("kind", ["causal", "tree", "block"])
def test_static_block_equals_the_regular_block(tiny_lm, kind):
    """A padded block (5 rows in 8) under a causal view, a tree mask over [cache | block] or the same tree
    as a `BlockView` gives the regular step's logits (selected rows too), and the committed rows' cache
    entries; the pad rows stay uncommitted."""
    prompt = list(range(3, 30))
    tokens = [7, 9, 11, 13, 15]
    if kind == "causal":
        view_of, keep = (lambda e: CausalView(e.scale)), [0, 1, 2]
    else:  # root, a chain of two, and a second chain of two: rows 3-4 do not see rows 1-2
        block = torch.tensor(
            [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [1, 0, 0, 1, 0], [1, 0, 0, 1, 1]],
            dtype=torch.bool,
        )

        def view_of(e):
            if kind == "block":
                return BlockView(block.to(e.device), e.scale)
            mask = torch.cat([torch.ones(5, len(prompt), dtype=torch.bool), block], dim=1)
            return MaskView(mask.to(e.device), e.scale)

        keep = [0, 3, 4]
    plain, static = Engine(tiny_lm.model), _static(tiny_lm)
    for rows in (None, [0, 2, 4]):
        ref = _block_step(plain, prompt, tokens, view_of, keep, rows)
        got = _block_step(static, prompt, tokens, view_of, keep, rows)
        assert got.shape == ref.shape
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
        n = plain.length
        assert static.length == n == len(prompt) + 3 and set(static.graphs.by_rows) == {8}
        torch.testing.assert_close(static.cache.k[:, :, :n], plain.cache.k[:, :, :n], atol=1e-6, rtol=1e-6)
        assert torch.equal(static.cache.slot_pos[:n], plain.cache.slot_pos[:n])


@pytest.mark.parametrize("rows", [None, [0, 2, 4]])
def test_step_argmax_is_the_argmax_of_its_logits_on_both_paths(tiny_lm, rows):
    """`step(..., argmax=True)` returns the logits a plain step returns and, beside them, the argmax of
    each returned row (chosen inside the fixed-shape forward when that path runs), for every row or the
    selected ones; a tied row keeps the first maximum, as `Tensor.argmax`."""
    prompt = list(range(3, 30))
    tokens = [7, 9, 11, 13, 15]
    for eng in (Engine(tiny_lm.model), _static(tiny_lm)):
        eng.reset(len(prompt) + 16)
        eng.prefill(prompt)
        p = len(prompt)
        args = (torch.tensor(tokens), torch.arange(p, p + 5), CausalView(eng.scale))
        plain = eng.step(*args, logits_rows=rows)
        eng.commit([])
        logits, ids = eng.step(*args, logits_rows=rows, argmax=True)
        eng.commit([])
        torch.testing.assert_close(logits, plain, atol=0, rtol=0)
        assert ids.dtype == torch.long and torch.equal(ids, logits.argmax(dim=-1))
        assert ids.shape == (5 if rows is None else 3,)
    assert eng.fixed_shape_steps == 2  # the second engine took the fixed-shape path both times


def test_decoders_on_static_forwards_equal_vanilla(tiny_lm):
    """PLD, Lookahead, FAFO (kv=full) and LongSpec (its tree, drafted on the device, under the masked
    backend) verify through the fixed-shape forwards and give vanilla's tokens; their blocks took the
    padded sizes."""
    from core.types import Counts
    from decoders.fafo.decoder import FAFO
    from decoders.longspec import LongSpec
    from decoders.lookahead import Lookahead
    from decoders.pld import PromptLookup
    from decoders.vanilla import Vanilla

    prompts = [[5, 6, 7, 5, 6, 7, 5, 6] * 3, list(range(40, 70)), [9, 8, 7, 9, 8, 7, 1, 2] * 2]
    plain = Engine(tiny_lm.model)
    refs = [Vanilla(plain).generate(p, 32, set(), Counts()) for p in prompts]
    for make in (
        lambda e: PromptLookup(e, num_tokens=5),
        lambda e: Lookahead(e, N=3, W=4, G=2),
        lambda e: FAFO(e, k=2, n=4),
        lambda e: LongSpec(e, depth=3, widths=[2, 3, 3], checkpoint="random", window=16),
    ):
        static = _static(tiny_lm)
        dec = make(static)
        assert [dec.generate(p, 32, set(), Counts()) for p in prompts] == refs, type(dec).__name__
        assert max(static.graphs.by_rows) > 1  # verification blocks took the fixed-shape path
        assert static.fixed_shape_steps > 0


FIXED_POLICIES = {  # at budgets below the 60-token prompt
    "streaming": {"budget": 20, "sinks": 4},  # one selection for every layer and head
    "snapkv": {"budget": 24, "window": 8},  # per layer and head, from the prefill
    "h2o": {"budget": 24, "recent": 8},  # per layer and head, from the queries it observes
    "retrieval": {"budget": 24, "chunk": 4},  # per layer and head, from the last prompt query
    "quest": {"budget": 24, "page_size": 8, "dense_layers": 0},  # per layer, from this forward's queries
}


@pytest.mark.parametrize("name", sorted(FIXED_POLICIES))
def test_restricted_blocks_take_the_fixed_shape_forward(tiny_lm, name):
    """A restricted block is one staged visibility when the policy chooses before the forward
    (`SelectionView`, `LayerSelectionView`), or chooses inside the fixed-shape forward from its queries
    (Quest, `QuestView`): vanilla + the policy and FAFO with it take the fixed-shape forward on every
    decode step and give the tokens, KV reads and policy activity of the regular `RestrictedView`."""
    from core.types import Counts
    from decoders.fafo.decoder import FAFO
    from decoders.vanilla import Vanilla
    from kv_policies.base import REGISTRY, build_policy

    module, cls = REGISTRY[name].split(":")
    policy_class = getattr(__import__(module, fromlist=[cls]), cls)

    class PerLayer(policy_class):  # the reference: the regular forward's `RestrictedView`
        query_free = False

        def fixed_selection(self, cache_len):
            return None

        def forward_view(self, *args):
            return None

    prompt = torch.randint(0, 256, (60,), generator=torch.Generator().manual_seed(3)).tolist()
    for make in (lambda e, kv: Vanilla(e, kv), lambda e, kv: FAFO(e, kv, k=2, n=4)):
        ref_kv, ref_counts = PerLayer(**FIXED_POLICIES[name]), Counts()
        ref = make(Engine(tiny_lm.model), ref_kv).generate(prompt, 24, set(), ref_counts)
        static, counts = _static(tiny_lm), Counts()
        kv = build_policy(name, **FIXED_POLICIES[name])
        assert make(static, kv).generate(prompt, 24, set(), counts) == ref
        assert static.fixed_shape_steps == counts.forwards > 0
        assert [s.kv_attended for s in counts.steps] == [s.kv_attended for s in ref_counts.steps]
        activity = kv.activity_summary(counts.forwards)
        assert activity == ref_kv.activity_summary(ref_counts.forwards) and activity.restricted_frac > 0.5


def test_triforce_middle_level_over_retrieval_takes_the_fixed_shape_forward(tiny_lm):
    """TriForce's middle level checks the draft model's tokens in a block of every row restricted to the
    retrieval selection, which observes their queries: on the fixed-shape path (blocks padded to a power
    of two) it gives the regular path's tokens and counts, and the policy sees the real rows only."""
    from core.types import Counts
    from decoders.draft_model import DraftModel
    from decoders.triforce import TriForce
    from kv_policies.base import build_policy

    prompt = torch.randint(0, 256, (60,), generator=torch.Generator().manual_seed(7)).tolist()
    results = []
    for eng in (Engine(tiny_lm.model), _static(tiny_lm)):
        draft = DraftModel(eng.truncated(1), "self-1", eng.w.vocab_size, budget=24, sinks=4, room=12)
        kv = build_policy("retrieval", budget=24, chunk=4)
        counts = Counts()
        dec = TriForce(eng, kv=kv, gamma1=2, gamma2=4, draft=draft, rebuild_every=1)  # from the last queries
        out = dec.generate(prompt, 24, set(), counts)
        results.append((out, counts.draft_forwards, counts.accepted_l1, kv.activity_summary(counts.forwards)))
    assert results[0] == results[1]


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
            staged.append(torch.equal(got, KVPolicy.layer_selections(pol, cache_len)))
            return got

        pol.layer_selections = checked
        dec = SlowFast(eng, kv=pol, t_max=4, trigger_token_ids=every)
        out = dec.generate(prompt, 24, set(), counts)
        results.append((out, counts.slow_steps, [s.kv_attended for s in counts.steps]))
    assert results[0] == results[1] and 0 < results[0][1] < 23
    assert staged and all(staged)
    assert eng.fixed_shape_steps == 23 and eng.graphs.by_rows_observed and eng.graphs.by_rows_selected


def test_static_forwards_are_only_for_plain_steps_that_fit(tiny_lm):
    """The prefill, per-head masks, hooks, a block whose padded size overflows the cache and the
    layer-truncated self-draft take the regular forward; CUDA graphs are refused off a CUDA device."""

    class Spy:
        calls = 0

        def applies(self, n, view):
            from core.decode_graph import StaticForwards

            return StaticForwards.applies(self, n, view)

        def __call__(self, *args):
            Spy.calls += 1
            raise AssertionError("the fixed-shape path took a step it must not")

    eng = Engine(tiny_lm.model)
    spy = Spy()
    spy.engine = eng
    eng.graphs = spy
    eng.reset(24)
    eng.prefill(list(range(3, 20)))  # 17 rows: a 32-row padded block would not fit, nor is it replayed
    dev = eng.device
    per_head = torch.ones(tiny_lm.model.config.num_attention_heads, 1, 18, dtype=torch.bool, device=dev)
    eng.step(torch.tensor([5], device=dev), torch.tensor([17], device=dev), MaskView(per_head, eng.scale))
    eng.crop(17)
    eng.step(
        torch.tensor([5], device=dev),
        torch.tensor([17], device=dev),
        CausalView(eng.scale),
        hooks=[lambda *a: None],
    )
    eng.crop(17)
    five = torch.arange(5, 10, device=dev)
    eng.step(five, torch.arange(17, 22, device=dev), CausalView(eng.scale))  # 8 padded rows > 7 free
    eng.crop(17)
    chain = torch.ones(2, 2, dtype=torch.bool, device=dev).tril()
    hybrid = HybridTreeView(chain, eng.scale, "hybrid")  # the LSE split is not the masked replay
    eng.step(five[:2], torch.arange(17, 19, device=dev), hybrid)
    assert Spy.calls == 0 and eng.truncated(1).graphs is None
    if dev.type != "cuda":
        with pytest.raises(ValueError, match="needs the model on a CUDA device"):
            Engine(tiny_lm.model, cuda_graphs=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make test-gpu)")
def test_cuda_graph_decode_equals_eager_and_recaptures_on_a_new_allocation(tiny_lm):
    if tiny_lm.device.type != "cuda":
        pytest.skip("the model fixtures are on the CPU (HARNESS_TEST_DEVICE=cuda)")
    prompt = list(range(3, 40))
    ref_ids, ref_logits = _vanilla_with_steps(Engine(tiny_lm.model), prompt, 24)
    eng = Engine(tiny_lm.model, cuda_graphs=True)
    ids, logits = _vanilla_with_steps(eng, prompt, 24)
    assert ids == ref_ids and eng.graphs.captures == 1
    torch.testing.assert_close(logits, ref_logits, atol=1e-4, rtol=1e-4)
    _vanilla_with_steps(eng, prompt, 24)  # same allocation: the graph is replayed, not captured again
    assert eng.graphs.captures == 1
    ids, _ = _vanilla_with_steps(eng, prompt * 3, 24)  # a larger cache: captured again
    assert eng.graphs.captures == 2 and ids == _vanilla_with_steps(Engine(tiny_lm.model), prompt * 3, 24)[0]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make test-gpu)")
def test_cuda_graph_blocks_equal_eager(tiny_lm):
    """Captured block graphs: PLD, Lookahead, FAFO (full cache, streaming, Quest choosing inside the
    graph, H2O observing from it) and LongSpec's tree give the eager tokens."""
    if tiny_lm.device.type != "cuda":
        pytest.skip("the model fixtures are on the CPU (HARNESS_TEST_DEVICE=cuda)")
    from core.types import Counts
    from decoders.fafo.decoder import FAFO
    from decoders.longspec import LongSpec
    from decoders.lookahead import Lookahead
    from decoders.pld import PromptLookup
    from decoders.vanilla import Vanilla

    prompt = [5, 6, 7, 5, 6, 7, 5, 6] * 3
    ref = Vanilla(Engine(tiny_lm.model)).generate(prompt, 48, set(), Counts())
    from kv_policies.base import build_policy
    from kv_policies.streaming import StreamingLLM

    for make in (
        lambda e: PromptLookup(e, num_tokens=5),
        lambda e: Lookahead(e, N=3, W=4, G=2),
        lambda e: FAFO(e, k=2, n=4),
        lambda e: FAFO(e, StreamingLLM(budget=12, sinks=2), k=2, n=4),  # stream rows see 12 of ~30
        lambda e: FAFO(e, build_policy("quest", budget=16, page_size=8, dense_layers=0), k=2, n=4),
        lambda e: FAFO(e, build_policy("h2o", budget=16, recent=4), k=2, n=4),
        lambda e: LongSpec(e, depth=3, widths=[2, 3, 3], checkpoint="random", window=16),
    ):
        eng = Engine(tiny_lm.model, cuda_graphs=True)
        assert make(eng).generate(prompt, 48, set(), Counts()) == ref
        assert eng.graphs.captures >= 2 and max(eng.graphs.by_rows) > 1
