"""A compressed-region backend (`kv.backend=sliced`) on an engine with fixed-shape forwards: a block whose
rows are all restricted by a policy that chooses before the forward reads the selection by gather
(`core.decode_graph.StaticForward`, `core.policy_views.gathered_view`) instead of moving entries, so
every such step keeps one shape. Eager here (`Engine.use_graphs(capture=False)`); the regular path is
the reference."""

from __future__ import annotations

import pytest
import torch

from core.engine import Engine
from core.policy_views import decode_view, restricted_view
from core.types import Counts
from kv_policies.registry import build_policy
from tests.conftest import prefill_under
from tests.helpers import DECODERS


def _static(tiny_lm) -> Engine:
    eng = Engine(tiny_lm.model)
    eng.use_graphs(capture=False)
    return eng


CASES = {
    "selfspec+retrieval": (
        DECODERS["selfspec"].make,
        lambda: build_policy("retrieval", budget=24, chunk=4, backend="sliced"),
    ),
    "triforce+retrieval": (
        DECODERS["triforce"].make,
        lambda: build_policy("retrieval", budget=24, chunk=4, backend="sliced"),
    ),
    "sfi": (
        DECODERS["sfi"].make,
        lambda: build_policy("sfi", k=8, sinks=2, recent=6, window=3, backend="sliced"),
    ),
}


def _record(counts: Counts, kv) -> tuple:
    reads = [s.kv_attended for s in counts.steps]
    return (
        counts.draft_forwards,
        counts.accepted,
        counts.slow_steps,
        reads,
        kv.activity.summary(counts.forwards),
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_region_backend_blocks_take_the_fixed_shape_forward_by_gather(tiny_lm, case):
    """The region's regular path and the gathered fixed-shape one give the same tokens, acceptance,
    slow steps, KV reads and policy activity; on the fixed-shape engine every decode forward of the
    target takes that path, the restricted ones through gathered forwards, and no region is made; the
    region's run counts every one of them as a step that would take it (`static_frac`)."""
    make, policy = CASES[case]
    prompt = torch.randint(0, 256, (60,), generator=torch.Generator().manual_seed(13)).tolist()
    results, static = [], []
    for eng in (Engine(tiny_lm.model), _static(tiny_lm)):
        kv, counts = policy(), Counts()
        out = make(eng, kv).generate(prompt, 24, set(), counts)
        results.append((out, *_record(counts, kv)))
        static.append(eng.fixed_shape_steps == counts.forwards + counts.draft_forwards)
    assert results[0] == results[1] and results[0][-1].restricted_frac > 0.3
    assert kv.slots.region is None and static == [True, True]  # the region's run counts what it would take
    gathered = [key for key in eng.graphs.by_rows_selected if key[1] is not None]
    assert gathered and all(size < eng.cache.capacity for _, size, *_ in gathered)


def test_gathered_forward_reads_exactly_the_selection_tail_and_block(tiny_lm):
    """One restricted block after a draft's tail: the gathered forward's logits equal the regular
    path's (to rounding), it reads per layer and KV head exactly the selected entries, the tail and
    the block, and a gather too small to hold them changes the logits (none may be cut)."""
    from kv_policies.view import causal_block

    prompt = torch.randint(0, 256, (60,), generator=torch.Generator().manual_seed(17)).tolist()
    kv = build_policy("retrieval", budget=24, chunk=4, backend="sliced")
    eng = _static(tiny_lm)
    prefill_under(eng, kv, prompt, 16)
    tail_from = eng.length
    eng.step(torch.tensor([5, 6]), torch.arange(tail_from, tail_from + 2), decode_view(kv, eng, 2))
    eng.commit([0, 1])  # a draft's tail of two
    tril, rows = causal_block(3, eng.device)
    view = restricted_view(kv, eng, tril, rows, tail_from=tail_from, rows=slice(None))
    assert view.gather_budget is not None and view.whole_layers == frozenset()
    tokens, positions = torch.tensor([7, 8, 9]), torch.arange(eng.length, eng.length + 3)
    ref = eng.step(tokens, positions, view, None, replay=False)
    got = eng.step(tokens, positions, view, None)
    assert torch.allclose(got, ref, atol=1e-5)
    fwd = next(f for key, f in eng.graphs.by_rows_selected.items() if key[:1] == (4,) and key[1] is not None)
    _, valid = fwd._gather_order()
    per_head = view.chosen.sum(-1) + 2 + fwd.rows  # the selection, the tail and the padded block
    assert torch.equal(valid.sum(-1), per_head) and fwd.gather >= int(per_head.max())
    fwd.gather = int(per_head.max()) - 2  # the pad row's slot and the last real row's own cut
    assert not torch.allclose(eng.step(tokens, positions, view, None), ref, atol=1e-3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make test-gpu)")
@pytest.mark.parametrize("case", sorted(CASES))
def test_cuda_graph_gathered_blocks_equal_the_region(tiny_lm, case):
    """Captured gathered forwards give the region's regular path's tokens and counts."""
    if tiny_lm.device.type != "cuda":
        pytest.skip("the model fixtures are on the CPU (HARNESS_TEST_DEVICE=cuda)")
    make, policy = CASES[case]
    prompt = torch.randint(0, 256, (60,), generator=torch.Generator().manual_seed(13)).tolist()
    results = []
    for eng in (Engine(tiny_lm.model), Engine(tiny_lm.model, cuda_graphs=True)):
        kv, counts = policy(), Counts()
        out = make(eng, kv).generate(prompt, 24, set(), counts)
        results.append((out, *_record(counts, kv)[:3]))
    assert results[0] == results[1] and eng.graphs.captures >= 1 and kv.slots.region is None
