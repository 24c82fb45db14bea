"""LongSpec (decoders/longspec/): with the target as its own draft, long paths are accepted; the beam
keeps the best nodes; sampling is exact in distribution (the tree rule, the target draft, gathered
checks); the draft's memory is constant in context length; its checkpoints round-trip; bad input is one
clear error. Greedy == vanilla for every tree and draft, stop and length, the cache and the plain
sampling check: tests/test_every_method.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from core.engine import Engine
from core.models import load_model
from core.sampling import Sampler
from core.types import Counts, HarnessError
from decoders.longspec.decoder import DraftedTree, LongSpec, Tree
from decoders.longspec.draft import LongSpecDraft, weights_digest
from decoders.vanilla import Vanilla
from kv_policies.registry import build_policy
from tests.conftest import needs_smollm
from tests.helpers import TREES, TargetDraft, compose_config, varied_prompts
from tests.lossless_check import (
    check_lossless,
    chi_square_pvalue,
    mtbench_lossless,
    sample_generations,
    tiny_sampling_case,
)

pytestmark = pytest.mark.usefixtures("one_thread")
N_NEW = 32


def make(eng, tree: str, draft: str, lm=None, **kw) -> LongSpec:
    depth, widths = TREES[tree]
    if draft == "target":
        return LongSpec(eng, depth=depth, widths=widths, draft_module=TargetDraft(lm.model), **kw)
    return LongSpec(eng, depth=depth, widths=widths, checkpoint="random", window=16, **kw)


@pytest.fixture(scope="module")
def refs(tiny_lm):
    eng = Engine(tiny_lm.model)
    return eng, [(p, Vanilla(eng).generate(p, N_NEW, set(), Counts())) for p in varied_prompts(6, seed=5)]


@pytest.mark.parametrize("tree", sorted(TREES))
def test_the_target_as_its_draft_commits_long_paths(refs, tiny_lm, tree):
    """With the target as its own draft, multi-token paths are accepted and committed (greedy == vanilla
    and the cache for every tree and draft: tests/test_every_method.py); blocks stay within the tree."""
    eng, cases = refs
    dec = make(eng, tree, "target", tiny_lm, tree_attention="hybrid")
    total = Counts(keep_steps=False)
    for prompt, ref in cases:
        counts = Counts()
        assert dec.generate(prompt, N_NEW, set(), counts) == ref
        assert all(s.block_tokens <= 1 + sum(TREES[tree][1]) for s in counts.steps if not s.draft)
        assert counts.draft_model_forwards >= counts.forwards - 1  # the last step may draft nothing
        total.forwards, total.committed = total.forwards + counts.forwards, total.committed + counts.committed
    assert total.tau > 1.5 and total.tau > 0.6 * (TREES[tree][0] + 1)


def test_beam_temperature_changes_the_tree_not_the_output(refs, tiny_lm):
    """decoder.beam_temperature (ours) reranks the beam; verification is unchanged, so the output is
    vanilla's."""
    eng, cases = refs
    dec = make(eng, "paper", "target", tiny_lm, beam_temperature=3.0)
    for prompt, ref in cases:
        check_lossless(eng, prompt, ref, dec.generate(prompt, N_NEW, set(), Counts()))


# --- the draft ----------------------------------------------------------------------------------
def test_draft_memory_is_constant_in_context_length(tiny_lm):
    """The draft holds its weights and a `window`-entry cache (plus one tree block while drafting),
    whatever the context: after a 20-token and a 600-token prompt it holds the same bytes in the same
    tensors, while the target's cache grew."""
    eng = Engine(tiny_lm.model)
    dec = make(eng, "paper", "random")
    draft = dec.draft
    seen = []
    for n in (20, 600):
        prompt = [(7 * i) % 256 for i in range(n)]
        dec.generate(prompt, 16, set(), Counts())
        assert draft.cached == draft.window == 16
        seen.append((draft.memory_bytes(), draft.win_k.data_ptr(), draft.win_v.data_ptr()))
    assert seen[0] == seen[1]
    assert eng.length > 600  # the target's cache did grow


def test_window_cache_holds_the_last_committed_tokens(tiny_lm):
    """Committed tokens' K/V computed directly (no context) equal the same tokens staged in a block at
    the same positions: the draft's logits after `start(seq)` equal those of a block that feeds the
    last tokens of `seq` causally; and the window keeps exactly the last `window` tokens."""
    eng = Engine(tiny_lm.model)
    seq = [(11 * i + 3) % 256 for i in range(40)]
    eng.reset(64)
    eng.prefill(seq)
    draft = LongSpecDraft.init_for(eng, target_layer=1, window=64, seed=2)
    draft.start(seq[:-1])
    one = draft.step(torch.tensor(seq[-1:]), torch.tensor([39]), torch.ones(1, 40, dtype=torch.bool), 40)
    draft.start(seq[:-6])
    mask = torch.cat([torch.ones(6, 34, dtype=torch.bool), torch.ones(6, 6, dtype=torch.bool).tril()], dim=1)
    many = draft.step(torch.tensor(seq[-6:]), torch.arange(34, 40), mask, 40)
    torch.testing.assert_close(many[-1:], one, atol=1e-5, rtol=1e-5)
    small = LongSpecDraft.init_for(eng, target_layer=1, window=8, seed=2)
    small.start(seq[:30])
    small.commit(seq[30:35], 30)
    direct = LongSpecDraft.init_for(eng, target_layer=1, window=8, seed=2)
    direct.start([0] * 27)  # positions 0..26, then the last 8 tokens at their own positions
    direct.commit(seq[27:35], 27)
    assert small.cached == direct.cached == 8
    torch.testing.assert_close(small.win_k, direct.win_k, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(small.win_v, direct.win_v, atol=1e-6, rtol=1e-6)


def test_checkpoint_round_trip_and_mismatch(tiny_lm, tmp_path):
    eng = Engine(tiny_lm.model)
    draft = LongSpecDraft.init_for(eng, target_layer=0, window=32, seed=7)
    names = set(draft.state_dict())
    assert not any("embed" in k or "lm_head" in k for k in names)  # shared with the target, not saved
    draft.save(tmp_path / "d")
    back = LongSpecDraft.load(tmp_path / "d", eng)
    digest = weights_digest(tmp_path / "d" / "model.safetensors")
    assert back.target_layer == 0 and back.window == 32 and back.label == f"{tmp_path / 'd'}@{digest}"
    for k, v in draft.state_dict().items():
        assert torch.equal(v, back.state_dict()[k])
    dec = LongSpec(eng, depth=2, widths=[2, 2], checkpoint=str(tmp_path / "d"))
    assert (dec.depth, dec.widths, dec.draft.window, dec.draft.target_layer) == (2, [2, 2], 32, 0)
    assert dec.identity_extra() == {"draft": f"{tmp_path / 'd'}@{digest}"}  # which draft, in the run id
    arch = tiny_lm.model.config.model_type
    for tiny, field in ((dict(vocab_size=300), "vocab_size"), (dict(hidden_size=32), "hidden_size")):
        other = load_model("tiny", "tiny", arch=arch, dtype="float32", device="cpu", seed=1, tiny=tiny)
        with pytest.raises(HarnessError, match=f"trained for another target.*{field}") as exc:
            LongSpec(Engine(other.model), checkpoint=str(tmp_path / "d"))
        assert "\n" not in str(exc.value)
    with pytest.raises(HarnessError, match="reads target layer 0"):
        LongSpec(eng, checkpoint=str(tmp_path / "d"), target_layer=1)


@pytest.mark.parametrize("linear", ["aten", "onednn"])
def test_restricted_draft_vocabulary(refs, tiny_lm, tmp_path, linear):
    """decoder.draft_vocab=N: the draft ranks tokens by its saved training counts (ties: lower id),
    proposes only the N most frequent, and the output stays token-identical to vanilla."""
    from core.engine import onednn_applies

    if linear == "onednn" and not onednn_applies(tiny_lm.model):
        pytest.skip("no oneDNN prepacking on this machine")
    eng0, cases = refs
    eng = Engine(tiny_lm.model, linear=linear)
    vocab = tiny_lm.model.config.vocab_size
    draft = LongSpecDraft.init_for(eng, target_layer=-1, window=16, seed=3)
    draft.save(tmp_path / "d")
    counts = torch.zeros(vocab, dtype=torch.int64)
    counts[torch.arange(vocab) % 3 == 0] = 5  # every third id is frequent; the rest tie at 1
    counts[torch.arange(vocab) % 3 != 0] = 1
    draft.save_counts(tmp_path / "d", counts)
    n = len(range(0, vocab, 3)) + 4
    dec = LongSpec(eng, depth=4, widths=[2, 2, 2, 2], checkpoint=str(tmp_path / "d"), draft_vocab=n)
    allowed = set(range(0, vocab, 3)) | set([i for i in range(vocab) if i % 3 != 0][:4])
    assert set(dec.draft.vocab_ids.tolist()) == allowed and dec.draft_vocab == n
    h = torch.randn(3, tiny_lm.model.config.hidden_size)
    full = eng.lm_logits(h)
    torch.testing.assert_close(dec.draft._head(h).float(), full[:, dec.draft.vocab_ids])
    drafted: set[int] = set()
    real_grow = DraftedTree.grow

    def spy(tree, tokens, parents, scores, depth):
        drafted.update(tokens.tolist())
        return real_grow(tree, tokens, parents, scores, depth)

    DraftedTree.grow = spy
    try:
        for prompt, ref in cases:
            got = dec.generate(prompt, N_NEW, set(), Counts())
            check_lossless(eng0, prompt, ref, got)
    finally:
        DraftedTree.grow = real_grow
    assert drafted and drafted <= allowed
    for bad in (0, -3, True, 2.5, "8192"):
        with pytest.raises(HarnessError, match="draft_vocab must be a positive integer or null"):
            LongSpec(eng, checkpoint=str(tmp_path / "d"), draft_vocab=bad)
    with pytest.raises(HarnessError, match="has none: set draft_vocab=null") as exc:
        LongSpec(eng, checkpoint="random", draft_vocab=8)
    assert "\n" not in str(exc.value)
    whole = LongSpec(eng, checkpoint="random", draft_vocab=vocab)  # a size that covers the vocabulary
    assert whole.draft.vocab_ids is None


def test_bad_input_is_one_clear_error(tiny_lm, tmp_path):
    eng = Engine(tiny_lm.model)
    cases = [
        (dict(depth=0, widths=[]), "decoder.depth must be an integer >= 1"),
        (dict(depth=2, widths=[2, 0]), "widths must be 2 positive integers"),
        (dict(depth=2, widths=[2]), "widths must be 2 positive integers"),
        (dict(depth=1, widths="4"), "widths must be a list"),
        (dict(window=0, checkpoint="random"), "window must be a positive integer"),
        (dict(target_layer=2, checkpoint="random"), "target_layer must be an integer in \\[-2, 1\\]"),
        (dict(target_layer=-3, checkpoint="random"), "target_layer must be an integer"),
        (dict(), "needs a trained draft.*=random"),
        (dict(checkpoint=str(tmp_path / "missing")), "no LongSpec draft checkpoint at"),
        (dict(checkpoint="random", kv=build_policy("streaming", budget=24)), "use kv=full"),
        (dict(checkpoint="random", tree_attention="flash"), "tree_attention must be one of hybrid, masked"),
        (dict(checkpoint="random", beam_temperature=0), "decoder.beam_temperature must be a number > 0"),
        (dict(checkpoint="random", beam_temperature="hot"), "decoder.beam_temperature must be a number > 0"),
    ]
    for kw, message in cases:
        with pytest.raises(HarnessError, match=message) as exc:
            LongSpec(eng, **kw)
        assert "\n" not in str(exc.value)


def test_params_and_block_size(tiny_lm):
    dec = make(Engine(tiny_lm.model), "paper", "random")
    assert dec.max_block() == 1 + 4 + 4 * 16
    assert (dec.depth, dec.widths, dec.draft.window, dec.draft.target_layer) == (
        5,
        [4, 16, 16, 16, 16],
        16,
        1,
    )
    assert dec.draft.label == "untrained random draft: lossless, tau near 1"
    assert (dec.tree_attention, dec.draft_vocab, dec.block, dec.lookup) == ("masked", None, "fixed", 0)


@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_beam_search_keeps_the_best_cumulative_nodes(tiny_lm, temperature):
    """Depth d keeps the top-w_d children (by cumulative draft log-prob of logits / beam_temperature)
    over every beam node's top-w_d proposals (brute force: the draft run over each parent's root path
    alone); the tree holds exactly sum(widths) nodes, each at its parent's depth + 1."""
    eng = Engine(tiny_lm.model)
    dec = make(eng, "small", "random", beam_temperature=temperature)
    draft = dec.draft
    prompt = list(b"beam search")
    eng.reset(64)
    eng.prefill(prompt)
    draft.start(prompt)
    drafted, _ = dec._draft_tree(5, eng.length, 4, Counts())
    tree = drafted.host(scores=True)[0]
    n = len(tree.tokens)
    assert torch.equal(drafted.ancestors[:n, :n], tree.ancestor_mask())  # what verification attends with
    assert drafted.depths[:n].tolist() == tree.depth
    assert tree.depth == [0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert all(tree.depth[r] == tree.depth[tree.parent[r]] + 1 for r in range(1, len(tree.tokens)))
    mask = tree.ancestor_mask()
    for d in (1, 2, 3, 4):
        cands = []
        for p in (r for r in range(len(tree.tokens)) if tree.depth[r] == d - 1):
            path = tree.path(p)
            draft.begin_block()
            vis = torch.ones(len(path), draft.cached + len(path), dtype=torch.bool)
            vis[:, draft.cached :] = mask[path][:, path]
            pos = eng.length + torch.tensor([tree.depth[r] for r in path])
            tokens = torch.tensor([tree.tokens[r] for r in path])
            logp = torch.log_softmax(draft.step(tokens, pos, vis, eng.length)[-1] / temperature, -1)
            top = logp.topk(2)
            cands += [(tree.score[p] + float(v), p, int(t)) for v, t in zip(top.values, top.indices)]
        cands.sort(key=lambda c: -c[0])
        rows = [r for r in range(len(tree.tokens)) if tree.depth[r] == d]
        assert [(tree.parent[r], tree.tokens[r]) for r in rows] == [(p, t) for _, p, t in cands[:2]]
        for r, (score, _, _) in zip(rows, cands):
            assert abs(tree.score[r] - score) < 1e-4


# --- sampling -----------------------------------------------------------------------------------
def test_tree_sampling_rule_draws_from_the_target():
    """At one node with three one-hot children, the committed token is distributed as p (children
    accepted with p_i(x_i), else the residual draws the token)."""
    p = torch.tensor([0.05, 0.3, 0.1, 0.25, 0.2, 0.1])
    logits = p.log().unsqueeze(0).repeat(4, 1)
    tree = Tree([0])
    for tok in (1, 4, 5):
        tree.add(tok, 0, 0.0)
    dec = object.__new__(LongSpec)
    dec.sampler = Sampler(temperature=1.0, seed=11)
    stage = lambda values: torch.tensor(list(values), dtype=torch.long)  # noqa: E731
    dec.engine = SimpleNamespace(stage=stage, device=torch.device("cpu"))
    firsts = []
    for _ in range(6000):
        _, tokens = dec._accept(tree, logits)
        firsts.append((tokens[0],))
    assert chi_square_pvalue(firsts, {(i,): float(p[i]) for i in range(6)}) > 1e-3


# the random draft with on-demand checks: tests/test_every_method.py
@pytest.mark.parametrize(
    ("draft", "gathered"),
    [("target", False), ("target", True), ("random", True)],
    ids=["target", "target-gathered", "random-gathered"],
)
def test_sampling_is_lossless_in_distribution(draft, gathered, monkeypatch):
    """First 3 sampled tokens of LongSpec (a small tree) fit the exact vanilla-sampling distribution, its
    checks' values computed as the walk reads them (a CPU's) or gathered on the drafted tree (a GPU's)."""
    from decoders import sampled_verify

    monkeypatch.setattr(sampled_verify, "GATHER_ON_CPU", gathered)
    sampler_kw = dict(temperature=1.0, top_p=0.95, top_k=6)
    eng, prompt, exact = tiny_sampling_case(3, sampler_kw)
    widths = [3, 3]
    sampler = Sampler(seed=1, **sampler_kw)
    if draft == "target":
        dec = LongSpec(eng, depth=2, widths=widths, sampler=sampler, draft_module=TargetDraft(eng.model))
    else:
        dec = LongSpec(eng, depth=2, widths=widths, sampler=sampler, checkpoint="random")
    samples, totals = sample_generations(dec, prompt, 3, 800)
    if draft == "target":
        assert totals["accepted"] > 400  # drafts are really accepted under sampling
    assert chi_square_pvalue(samples, exact) > 1e-3


# --- SmolLM2 ------------------------------------------------------------------------------------
@pytest.mark.smollm
@needs_smollm
def test_smollm_mtbench_fast(smollm):
    """One MT-Bench question (turn 1), 32 tokens: the small tree with an untrained random draft and
    the paper's tree with the target as its own draft (long accepted paths)."""
    makers = [
        ("longspec_small-random", lambda e: make(e, "small", "random")),
        ("longspec-target-draft", lambda e: make(e, "paper", "target", smollm)),
    ]
    taus = mtbench_lossless(smollm, makers, 1, 1, 32)
    assert max(taus) > 1.5


def test_presets_and_missing_checkpoint_through_the_config(tiny_lm):
    """conf/decoder/longspec*.yaml: the paper's tree and the two labelled CPU presets; `checkpoint: auto`
    (the default) stops with the one-line message for a model without a shipped draft."""
    from hydra.utils import instantiate

    shapes = {
        "longspec": (5, [4, 16, 16, 16, 16]),
        "longspec_chain": TREES["chain"],
        "longspec_small": TREES["small"],
        "longspec_chain_auto": TREES["chain"],
    }
    eng = Engine(tiny_lm.model)
    for option, (depth, widths) in shapes.items():
        cfg = compose_config(f"decoder={option}").decoder
        assert cfg.depth == depth and list(cfg.widths) == widths and cfg.checkpoint == "auto"
        with pytest.raises(HarnessError, match="no shipped LongSpec draft for '"):
            instantiate(cfg)(engine=eng)
        dec = instantiate(compose_config(f"decoder={option}", "decoder.checkpoint=random").decoder)(
            engine=eng
        )
        assert dec.widths == widths and dec.draft.window == 512
        # the CPU presets draft from the 8192 most frequent tokens (all of the tiny model's vocabulary)
        assert cfg.draft_vocab == (None if option == "longspec" else 8192)
        assert cfg.block == ("auto" if option.endswith("_auto") else "fixed") == dec.block


def test_draft_gemms_run_like_the_targets_and_follow_weight_changes(tiny_lm):
    """Drafting (inference mode) runs the draft's projections through `Engine.linear_for` (prepacked
    for oneDNN where the engine packs): the same logits as its modules to fp32 rounding; a changed
    weight is packed again; training (autograd) uses the modules themselves."""
    from core.engine import onednn_applies

    linear = "onednn" if onednn_applies(tiny_lm.model) else "aten"
    eng = Engine(tiny_lm.model, linear=linear)
    draft = LongSpecDraft.init_for(eng, target_layer=-1, window=16, seed=3)
    prompt = list(range(30, 60))
    eng.reset(64)
    eng.prefill(prompt)
    draft.start(prompt)
    tokens, positions = torch.tensor([5, 9]), torch.tensor([30, 30])
    visible = torch.ones(2, draft.cached + 2, dtype=torch.bool)

    def drafted() -> torch.Tensor:
        draft.begin_block()
        return draft.step(tokens, positions, visible, len(prompt))

    def by_modules() -> torch.Tensor:
        draft.begin_block()
        with torch.no_grad():  # autograd mode: `_gemm` calls the modules
            return torch.inference_mode(False)(draft.step.__wrapped__)(
                draft, tokens, positions, visible, len(prompt)
            )

    first = drafted()
    torch.testing.assert_close(first, by_modules(), rtol=1e-5, atol=1e-5)
    assert set(draft._packed) >= {"q_proj", "gate_proj", "down_proj", "cross_q_proj"}
    with torch.no_grad():
        draft.down_proj.weight.mul_(0.5)
    changed = drafted()
    assert not torch.allclose(changed, first)
    torch.testing.assert_close(changed, by_modules(), rtol=1e-5, atol=1e-5)
