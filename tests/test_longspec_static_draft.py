"""LongSpec's draft on fixed-shape forwards (decoders/longspec/static_draft.py): eager here (the target's
`Engine.use_graphs(capture=False)`), captured as CUDA graphs on a GPU. Its level steps give the regular
path's logits up to rounding, its commits the same window, and LongSpec on them vanilla's tokens with
the regular path's acceptance; runs count the share as `draft_static_frac`."""

from __future__ import annotations

import pytest
import torch

from core.engine import Engine
from core.types import Counts
from decoders.longspec.decoder import LongSpec
from decoders.longspec.draft import LongSpecDraft
from decoders.longspec.static_draft import LevelLengths
from decoders.longspec.tree import DraftedTree
from decoders.vanilla import Vanilla
from runners.timing import DraftClock
from tests.helpers import varied_prompts

pytestmark = pytest.mark.usefixtures("one_thread")


def _engines(tiny_lm) -> tuple[Engine, Engine]:
    static = Engine(tiny_lm.model)
    static.use_graphs(capture=False)
    return Engine(tiny_lm.model), static


def _block(draft: LongSpecDraft, length: int, widths: list[int]) -> list[torch.Tensor]:
    """One tree's level steps (each beam the previous level's rows, every row seeing the window and
    the whole block so far): every level's logits."""
    draft.begin_block()
    out, staged, token = [], 0, 3
    for beam in [1, *widths]:
        tokens = torch.arange(token, token + beam)
        positions = torch.full((beam,), length + len(out))
        visible = torch.ones(beam, draft.cached + staged + beam, dtype=torch.bool)
        out.append(draft.step(tokens, positions, visible, length))
        staged, token = staged + beam, token + beam
    draft.begin_block()
    return out


# a window full from the start, one that fills then shifts (one commit does both: the regular path's),
# one that only fills
@pytest.mark.parametrize(("window", "fixed"), [(8, 10), (43, 9), (64, 10)])
def test_static_steps_and_commits_equal_the_regular_ones(tiny_lm, window, fixed):
    prompt = list(range(5, 45))
    drafts = []
    for eng in _engines(tiny_lm):
        eng.reset(len(prompt) + 32)
        eng.prefill(prompt)
        draft = LongSpecDraft.init_for(eng, window=window, seed=3)
        draft.start(prompt)
        levels = _block(draft, eng.length, [2, 3])
        for i, m in enumerate([1, 3, 2, 6]):  # commits of several sizes, then a block after them
            draft.commit(list(range(50 + 7 * i, 50 + 7 * i + m)), len(prompt) + 6 * i)
        drafts.append((draft, levels + _block(draft, eng.length, [4, 1])))
    (regular, want), (static, got) = drafts
    assert static.static is not None and regular.static is None
    assert len(static.static.steps) == 5 and static.static.commits  # every level, the commits
    for a, b in zip(want, got, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(static.win_k, regular.win_k, rtol=0, atol=0)  # the same K/V, same places
    assert static.cached == regular.cached
    # six level steps and the commits that fit (not the prompt's: one per prompt length); the regular
    # path counts what would take the fixed-shape forwards the same way
    assert static.fixed_shape_steps == regular.fixed_shape_steps == fixed


@pytest.mark.parametrize("window", [16, 64])
def test_longspec_on_the_static_draft_equals_vanilla_with_the_regular_acceptance(tiny_lm, window):
    regular_eng, static_eng = _engines(tiny_lm)
    make = lambda eng: LongSpec(eng, depth=4, widths=[2, 2, 2, 2], checkpoint="random", window=window)  # noqa: E731
    regular, static = make(regular_eng), make(static_eng)
    for prompt in varied_prompts(3, seed=5):
        ref = Vanilla(regular_eng).generate(prompt, 32, set(), Counts())
        shares = []
        for dec in (regular, static):
            with DraftClock(dec, dec.engine.device) as clock:
                counts = Counts(on_prefill_done=clock.mark)
                got = dec.generate(prompt, 32, set(), counts)
            assert got == ref
            shares.append((counts.accepted, counts.draft_model_forwards, clock.static_frac_since_mark))
        assert shares[0] == shares[1]  # acceptance, draft forwards and the share, both paths alike
        assert shares[1][2] > 0.9  # every level step and nearly every commit
    assert static.draft.static is not None and static.draft.static.levels  # each level in one forward


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_a_static_beam_search_level_grows_the_regular_tree(tiny_lm, temperature):
    """`expand` in one fixed-shape forward: the same children (tokens, parents, scores, ancestors) as
    the regular level, level after level, its block K/V staged alike."""
    trees = []
    for eng in _engines(tiny_lm):
        eng.reset(96)
        eng.prefill(list(range(5, 60)))
        draft = LongSpecDraft.init_for(eng, window=16, seed=4)
        draft.start(list(range(5, 60)))
        tree = DraftedTree(1 + 2 + 4 + 4, draft.window, eng.device).start(7)
        draft.begin_block()
        lo, hi = 0, 1
        for depth, width in enumerate([2, 4, 4], 1):
            draft.expand(tree, lo, hi, eng.length, depth, width, temperature)
            lo, hi = hi, tree.size
        trees.append((draft, tree))
    (regular, want), (static, got) = trees
    assert static.static is not None and len(static.static.levels) == 3 and regular.static is None
    assert got.depth == want.depth == [0, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]
    for name in ("tokens", "parent", "depths", "ancestors"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    torch.testing.assert_close(got.score, want.score, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(static.block_k[:, : got.size - 4], regular.block_k[:, : want.size - 4])


def test_a_restricted_vocabulary_drops_the_static_forwards(tiny_lm):
    _, eng = _engines(tiny_lm)
    eng.reset(64)
    eng.prefill(list(range(5, 30)))
    draft = LongSpecDraft.init_for(eng, window=16)
    draft.start(list(range(5, 30)))
    full = _block(draft, eng.length, [2])
    assert draft.static is not None
    draft.token_counts = torch.arange(draft.config.vocab_size).flip(0)
    draft.restrict_vocab(10)
    assert draft.static is None
    narrow = _block(draft, eng.length, [2])
    assert narrow[0].shape[-1] == 10 and full[0].shape[-1] == draft.config.vocab_size
    torch.testing.assert_close(narrow[1], full[1][:, draft.vocab_ids], rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make test-gpu)")
def test_cuda_graph_longspec_draft_equals_eager(tiny_lm):
    """LongSpec on a graphed target: the draft's level steps and commits replay captured graphs, and the
    tokens are vanilla's."""
    if tiny_lm.device.type != "cuda":
        pytest.skip("the model fixtures are on the CPU (HARNESS_TEST_DEVICE=cuda)")
    prompt = [5, 6, 7, 5, 6, 7, 5, 6] * 3
    ref = Vanilla(Engine(tiny_lm.model)).generate(prompt, 48, set(), Counts())
    eng = Engine(tiny_lm.model, cuda_graphs=True)
    dec = LongSpec(eng, depth=4, widths=[2, 2, 2, 2], checkpoint="random", window=16)
    assert dec.generate(prompt, 48, set(), Counts()) == ref
    assert dec.draft.static is not None and dec.draft.static.captures >= 5 and dec.draft.static.levels


def test_a_reused_tree_buffer_holds_each_new_tree_alone():
    """`DraftedTree.start` writes the root's token only: every level rewrites its rows whole, so a buffer
    reused for a smaller tree after a larger one reads each tree's own ancestors, depths and scores."""
    gen = torch.Generator().manual_seed(0)
    buf = DraftedTree(16, 4, torch.device("cpu"))
    for root, widths in ((7, [3, 5, 6]), (8, [2, 1]), (9, [4, 4, 4])):
        buf.start(root)
        lo, hi = 0, 1
        for depth, width in enumerate(widths, 1):
            parents = torch.randint(lo, hi, (width,), generator=gen).sort().values
            scores = -torch.rand(width, generator=gen)
            buf.grow(torch.randint(0, 50, (width,), generator=gen), parents, scores, depth)
            lo, hi = hi, buf.size
        tree, _ = buf.host(scores=True)
        n = buf.size
        assert tree.tokens[0] == root and tree.score[0] == 0.0 and tree.depth == buf.depths[:n].tolist()
        assert torch.equal(buf.ancestors[:n, :n], tree.ancestor_mask())


def test_a_tree_levels_stage_the_step_lengths_once():
    """The levels of a step's tree share the target length and the window count; each is written only
    when it changes (a launch a step at most, not one per level)."""
    lengths = LevelLengths(torch.device("cpu"))
    lengths.stage(40, 7)
    versions = lengths.length._version, lengths.cached._version
    lengths.stage(40, 7)  # the next level of the same tree
    assert (lengths.length._version, lengths.cached._version) == versions
    lengths.stage(43, 7)  # the next step: the target grew, the window did not
    assert lengths.length._version == versions[0] + 1 and lengths.cached._version == versions[1]
    assert lengths.length.item() == 43 and lengths.cached.item() == 7
