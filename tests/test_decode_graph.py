"""Fixed-shape decode forwards (core/decode_graph.py): eager here (`Engine.use_graphs(capture=False)`),
captured as CUDA graphs on a GPU. Each path gives the regular `Engine.step`'s logits, tokens, cache
contents and counts; what does not fit takes the regular forward."""

from __future__ import annotations

import pytest
import torch

from core.attention import BlockView, CausalView, MaskView
from core.engine import Engine
from core.tree_attention import HybridTreeView
from tests.helpers import _static


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
        forwards = static.graphs.by_rows_masked if kind not in ("causal", "block") else static.graphs.by_rows
        assert static.length == n == len(prompt) + 3 and set(forwards) == {8}
        torch.testing.assert_close(static.cache.k[:, :, :n], plain.cache.k[:, :, :n], atol=1e-6, rtol=1e-6)
        assert torch.equal(static.cache.slot_pos[:n], plain.cache.slot_pos[:n])
        seen = forwards[8].visible[:, : len(prompt) + 8]  # as the forward saw it
        assert not seen[:5, len(prompt) + 5 :].any()  # no real row sees a pad row
        for pad in range(5, 8):  # a pad row sees the cache and its own slot, never nothing
            assert seen[pad, : len(prompt)].all() and seen[pad, len(prompt) + pad]


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
        none, alone = eng.step(*args, logits_rows=rows, argmax=True, with_logits=False)
        eng.commit([])
        assert none is None and torch.equal(alone, ids)  # the argmax alone, the logits left in the step
    assert eng.fixed_shape_steps == 3  # the second engine took the fixed-shape path every time


def test_static_forwards_are_only_for_plain_steps_that_fit(tiny_lm):
    """The prefill, per-head masks, hooks and a block whose padded size overflows the cache take the
    regular forward; CUDA graphs are refused off a CUDA device."""

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
    assert Spy.calls == 0
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
    """Captured block graphs: PLD, Lookahead, FAFO (full cache, streaming, Quest and Top-K choosing
    inside the graph, H2O observing from it) and LongSpec's tree give the eager tokens."""
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
    from kv_policies.registry import build_policy
    from kv_policies.streaming import StreamingLLM

    for make in (
        lambda e: PromptLookup(e, num_tokens=5),
        lambda e: Lookahead(e, N=3, W=4, G=2),
        lambda e: FAFO(e, k=2, n=4),
        lambda e: FAFO(e, StreamingLLM(budget=12, sinks=2), k=2, n=4),  # stream rows see 12 of ~30
        lambda e: FAFO(e, build_policy("quest", budget=16, page_size=8, dense_layers=0), k=2, n=4),
        lambda e: FAFO(e, build_policy("h2o", budget=16, recent=4), k=2, n=4),
        lambda e: FAFO(e, build_policy("topk", budget=16), k=2, n=4),  # chosen inside the graph
        lambda e: LongSpec(e, depth=3, widths=[2, 3, 3], checkpoint="random", window=16),
    ):
        eng = Engine(tiny_lm.model, cuda_graphs=True)
        assert make(eng).generate(prompt, 48, set(), Counts()) == ref
        # FAFO's blocks keep one shape, and a selection's forwards are keyed apart from `by_rows`
        assert eng.graphs.captures >= 1 and eng.fixed_shape_steps > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make test-gpu)")
def test_cuda_graph_draft_model_steps_equal_eager(tiny_lm):
    """TriForce with a layer-truncated self-draft on a graphed target: the draft's steps are replayed
    from graphs of the draft's own engine, and the tokens are the eager ones."""
    if tiny_lm.device.type != "cuda":
        pytest.skip("the model fixtures are on the CPU (HARNESS_TEST_DEVICE=cuda)")
    from core.types import Counts
    from decoders.draft_model import DraftModel
    from decoders.triforce import TriForce
    from decoders.vanilla import Vanilla
    from kv_policies.streaming import StreamingLLM

    prompt = [5, 6, 7, 5, 6, 7, 5, 6] * 3
    ref = Vanilla(Engine(tiny_lm.model)).generate(prompt, 48, set(), Counts())
    eng = Engine(tiny_lm.model, cuda_graphs=True)
    # room and budget for TriForce's up to 10 speculative tokens (`DraftModel.check_block`)
    draft = DraftModel(eng.truncated(1), "self-1", eng.w.vocab_size, budget=24, sinks=2, room=10)
    got = TriForce(eng, StreamingLLM(budget=12, sinks=2), draft=draft).generate(prompt, 48, set(), Counts())
    assert got == ref and draft.engine.graphs.captures >= 1 and 1 in draft.engine.graphs.by_rows


def test_a_region_backend_under_graphs_says_it_takes_the_regular_forward(tiny_lm, caplog):
    """The compressed-region backends move entries between steps: on an engine with fixed-shape forwards
    the user is told once that the steps a region lays out (here Quest's, chosen from each forward's
    queries) take the regular forward."""
    import core.policy_views as views
    from core.types import Counts
    from decoders.vanilla import Vanilla
    from kv_policies.registry import build_policy

    views._WARNED_UNGRAPHED.discard("sliced")
    prompt = list(range(3, 60))
    for _ in range(2):
        kv = build_policy("quest", budget=24, page_size=8, dense_layers=0, backend="sliced")
        Vanilla(_static(tiny_lm), kv).generate(prompt, 6, set(), Counts())
    warned = [r for r in caplog.records if "kv.backend=sliced" in r.getMessage()]
    assert len(warned) == 1 and "regular forward" in warned[0].getMessage()


def test_graph_launches_count_each_replay_once_and_the_staging_around_it(tiny_lm):
    """`graph_bodies_apart` counts what a step launches with graphs on: each fixed-shape forward (run
    eagerly here) as the one graph a GPU replays, plus the operators around it. Vanilla's step is its
    replay and a handful of staging operators, far fewer than one forward's; the class is restored."""
    import contextlib

    from core.replay import Replay
    from core.types import Counts
    from decoders.vanilla import Vanilla
    from runners.host_syncs import HostSyncs, graph_bodies_apart

    original = Replay.__call__
    eng = _static(tiny_lm)
    per_step = {}
    for apart in (False, True):
        syncs = HostSyncs(eng.device)
        counts = Counts(on_prefill_done=syncs.mark, keep_steps=False)
        with syncs, graph_bodies_apart(syncs) if apart else contextlib.nullcontext():
            Vanilla(eng).generate(list(range(3, 20)), 8, set(), counts)
        per_step[apart] = syncs.launches_since_mark / counts.forwards
    assert 2 <= per_step[True] <= 10 and per_step[False] > 5 * per_step[True]
    assert Replay.__call__ is original and eng.fixed_shape_steps == 2 * counts.forwards  # both runs


def test_positions_after_the_cache_are_staged_once_and_the_length_added_in_the_forward(tiny_lm):
    """A block right after the cache (a chain of `Engine.positions`, or a `RelativePositions` starting at
    the cache length) keeps its positions relative to the length, staged only when they change (the
    same offsets object comes back unstaged; one written in place is staged again); any other block's
    positions are taken as absolute. Every step, pad rows included, gives the regular forward's logits."""
    from core.positions import RelativePositions

    prompt, n = list(range(3, 40)), 5
    offsets = torch.tensor([0, 1, 1, 2, 2])  # a layout's: a root, then two two-token candidates
    view = lambda e: BlockView(torch.ones(n, n, dtype=torch.bool).tril(), e.scale)  # noqa: E731
    steps = [  # (positions for a cache of length p, taken relative to p)
        (lambda e, p: e.positions(p, n), True),
        (lambda e, p: e.positions(p, n), True),  # the same relative positions: not staged again
        (lambda e, p: RelativePositions(offsets, p), True),
        (lambda e, p: RelativePositions(offsets, p), True),  # offsets written in place before it
        (lambda e, p: torch.arange(p, p + n), False),  # a fresh tensor: absolute
        (lambda e, p: RelativePositions(offsets, p + 2), False),  # not after the cache: absolute
        (lambda e, p: e.positions(p, n), True),
    ]
    out, relative, unstaged, slot_pos = [], [], [], []
    for eng in (Engine(tiny_lm.model), _static(tiny_lm)):
        offsets[4] = 2
        eng.reset(64)
        eng.prefill(prompt)
        logits = []
        for i, (positions, _) in enumerate(steps):
            if i == 3:
                offsets[4] = 3
            staged = eng.graphs.forward_for(8, view(eng)).positions.staged if eng.graphs else None
            logits.append(eng.step(torch.arange(5, 5 + n), positions(eng, eng.length), view(eng)))
            eng.commit([0])
            if eng.graphs is not None:
                fwd = eng.graphs.forward_for(8, view(eng))
                relative.append(fwd.positions.relative)
                unstaged.append(staged is not None and fwd.positions.staged is staged)
        out.append(torch.stack(logits))
        slot_pos.append(eng.cache.slot_pos[: eng.length].clone())
    assert eng.fixed_shape_steps == len(steps)
    assert relative == [rel for _, rel in steps]
    assert unstaged == [False, True, False, False, False, False, False]
    torch.testing.assert_close(out[1], out[0], atol=1e-5, rtol=1e-5)
    assert torch.equal(slot_pos[1], slot_pos[0])  # the committed roots' positions
