"""LongSpec `lookup=N` (ours, decoders/longspec/): prompt lookup's guess joins the drafted tree as one
more root path. The chain merges with drafted nodes it shares; greedy stays token-identical to vanilla
(tiny models, fixed and auto blocks, every tree; SmolLM2 MT-Bench), sampling stays exact in
distribution; block=auto rates lookup nodes from the chain's own acceptance; lookup=0 leaves run ids
and behaviour as they were; bad values are one clear error."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.engine import Engine
from core.sampling import Sampler
from core.types import Counts, HarnessError
from decoders.longspec.decoder import LongSpec, Tree
from decoders.vanilla import Vanilla
from runners.identity import method_params
from tests.conftest import needs_smollm
from tests.helpers import TREES, TargetDraft, compose_config, flat, steep, varied_prompts
from tests.lossless_check import (
    check_lossless,
    chi_square_pvalue,
    mtbench_lossless,
    sample_generations,
    tiny_sampling_case,
)

pytestmark = pytest.mark.usefixtures("one_thread")
DECODERS = Path(__file__).resolve().parents[1] / "conf" / "decoder"
N_NEW = 48


def repeating_prompts() -> list[list[int]]:
    """Prompts that repeat themselves, so that a 2-gram lookup finds matches, and varied ones."""
    loops = [list(b"abcabcabd abcabcabd ab"), [5, 9, 2, 7] * 6 + [5, 9], list(b"the cat sat. the cat")]
    return loops + varied_prompts(4, seed=9)


@pytest.fixture(scope="module")
def refs(tiny_lm):
    eng = Engine(tiny_lm.model)
    return eng, [(p, Vanilla(eng).generate(p, N_NEW, set(), Counts())) for p in repeating_prompts()]


def decoder(eng, tree: str, draft: str, lm=None, **kw) -> LongSpec:
    depth, widths = TREES[tree]
    if draft == "target":
        return LongSpec(eng, depth=depth, widths=widths, draft_module=TargetDraft(lm.model), **kw)
    return LongSpec(eng, depth=depth, widths=widths, checkpoint="random", window=16, **kw)


def run_all(dec, eng, cases) -> Counts:
    total = Counts(keep_steps=False)
    for prompt, ref in cases:
        counts = Counts()
        got = dec.generate(prompt, N_NEW, set(), counts)
        check_lossless(eng, prompt, ref, got)
        assert counts.committed == len(got) - 1
        assert all(s.block_tokens <= dec.max_block() for s in counts.steps)
        total.forwards += counts.forwards
        total.committed += counts.committed
    return total


def test_chain_merges_with_drafted_nodes():
    tree = Tree([1])
    a = tree.add(2, 0, -0.1)
    tree.add(3, 0, -1.0)
    b = tree.add(4, a, -0.5)
    tree.add_chain([2, 4, 6, 7], key=2)
    assert tree.lookup_key == 2
    assert tree.lookup[a] == 1 and tree.lookup[b] == 2 and tree.drafted[a] and tree.drafted[b]
    c, d = len(tree.tokens) - 2, len(tree.tokens) - 1
    assert tree.tokens[c:] == [6, 7] and tree.parent[c] == b and tree.parent[d] == c
    assert tree.lookup[c:] == [3, 4] and not tree.drafted[c] and not tree.drafted[d]
    assert tree.depth[d] == 4 and tree.lookup[2] == 0  # the other drafted child is not on the chain
    empty = Tree([1])
    empty.add_chain([], key=0)
    assert empty.lookup_key == 0 and len(empty.tokens) == 1


def test_the_ancestor_mask_is_each_rows_path_from_the_root():
    """The verification's visibility over a host tree (drafted nodes, then a lookup chain hung off one):
    row i sees row j exactly when j is on i's path from the root, itself included."""
    tree = Tree([1])
    a = tree.add(2, 0, -0.1)
    tree.add(3, 0, -1.0)
    b = tree.add(4, a, -0.5)
    tree.add(5, b, -0.7)
    tree.add_chain([3, 8, 9], key=1)
    n = len(tree.tokens)
    mask = tree.ancestor_mask()
    assert mask.dtype == torch.bool and mask.shape == (n, n)
    expected = [[j in tree.path(i) for j in range(n)] for i in range(n)]
    assert mask.tolist() == expected
    assert Tree([7]).ancestor_mask().tolist() == [[True]]


@pytest.mark.parametrize("draft", ["random", "target"])
@pytest.mark.parametrize("tree", sorted(TREES))
def test_greedy_equals_vanilla_with_lookup(refs, tiny_lm, tree, draft):
    eng, cases = refs
    plain = run_all(decoder(eng, tree, draft, tiny_lm), eng, cases)
    with_lookup = run_all(decoder(eng, tree, draft, tiny_lm, lookup=6), eng, cases)
    print(f"[longspec lookup] {tree} {draft}: tau {plain.tau:.2f} -> {with_lookup.tau:.2f}")
    if draft == "random":  # an untrained draft is never right; the lookup branch is, on repeats
        assert with_lookup.tau > plain.tau + 0.2
    assert with_lookup.tau >= plain.tau - 0.05


@pytest.mark.parametrize("curve", [flat, steep], ids=["flat", "steep"])
@pytest.mark.parametrize("tree", ["chain", "paper"])
def test_auto_with_lookup_is_lossless_and_calibrates_the_chain(refs, tiny_lm, tree, curve):
    eng, cases = refs
    dec = decoder(eng, tree, "random", lookup=6, block="auto")
    dec.use_cost(curve)
    dec.draft_seconds = dict.fromkeys(dec.draft_seconds, 0.02)
    total = run_all(dec, eng, cases[:3])
    assert dec.lookup_stats.reached  # the chain's places were verified and counted
    if curve is flat:  # free rows: the chain is verified whole, and repeats get accepted
        assert total.tau > 1.3


def test_survivals_rate_lookup_nodes_by_their_place(tiny_lm):
    eng = Engine(tiny_lm.model)
    dec = LongSpec(eng, depth=1, widths=[2], checkpoint="random", block="auto", lookup=3)
    dec.lookup_stats.update(2, drafted=3, accepted=3)  # the chain of 2-gram matches: always right so far
    tree = Tree([1])
    a = tree.add(2, 0, -3.0)  # a drafted node the draft gives 5%
    tree.add_chain([2, 8, 9], key=2)
    s = dec._survivals(tree)
    first = dec.lookup_stats.rate(2, 0)
    assert s[a] == pytest.approx(max(first, dec.calibration.rate(0.0498)))
    assert s[-1] == pytest.approx(s[-2] * dec.lookup_stats.rate(2, 2))
    cut = dec._cut(tree, 100, 0.0, flat)
    assert cut.lookup == tree.lookup and cut.drafted == tree.drafted and cut.lookup_key == 2


@pytest.mark.parametrize("block", ["fixed", "auto"])
def test_sampling_with_lookup_is_lossless_in_distribution(block):
    sampler_kw = dict(temperature=1.0, top_p=0.95, top_k=6)
    eng, prompt, exact = tiny_sampling_case(3, sampler_kw)
    sampler = Sampler(seed=1, **sampler_kw)
    dec = LongSpec(eng, depth=2, widths=[2, 2], sampler=sampler, checkpoint="random", block=block, lookup=3)
    if block == "auto":
        dec.use_cost(flat)
        dec.draft_seconds = dict.fromkeys(dec.draft_seconds, 0.0)
    samples, totals = sample_generations(dec, prompt, 3, 800)
    assert totals["accepted"] > 100  # looked-up tokens are really accepted under sampling
    assert chi_square_pvalue(samples, exact) > 1e-3


def test_bad_lookup_is_one_clear_error(tiny_lm):
    eng = Engine(tiny_lm.model)
    for bad in (-1, True, 2.5, "ten"):
        with pytest.raises(HarnessError, match="decoder.lookup must be an integer >= 0"):
            LongSpec(eng, depth=1, widths=[1], checkpoint="random", lookup=bad)


def test_lookup_off_keeps_run_ids_and_the_preset_says_it_is_ours():
    for name in ("longspec", "longspec_small", "longspec_chain", "longspec_chain_auto"):
        node = compose_config(f"decoder={name}").decoder  # the preset over its Config's defaults
        assert node.lookup == 0 and "lookup" not in method_params(node, "decoder")
    preset = compose_config("decoder=longspec_lookup_auto").decoder
    assert method_params(preset, "decoder")["lookup"] == 10 and preset.block == "auto"
    assert "NOT the" in (DECODERS / "longspec_lookup_auto.yaml").read_text()


def test_table1_labels_the_lookup_rows():
    import pandas as pd

    from analysis.longspec_paper import method_of

    row = {"decoder": "longspec_lookup_auto", "kv": "full", "decoder.widths": "[1, 1, 1, 1]",
           "decoder.draft_vocab": 8192, "decoder.block": "auto", "decoder.lookup": 10}  # fmt: skip
    assert method_of(pd.Series(row)) == "LongSpec chain (CPU preset, draft vocab 8192, block=auto, lookup 10)"
    paper = {**row, "decoder": "longspec", "decoder.widths": "[4, 16, 16, 16, 16]",
             "decoder.draft_vocab": None, "decoder.block": "fixed", "decoder.lookup": 0}  # fmt: skip
    assert method_of(pd.Series(paper)) == "LongSpec"
    assert "lookup" in method_of(pd.Series({**paper, "decoder.lookup": 4}))


@pytest.mark.smollm
@needs_smollm
def test_smollm_mtbench_with_lookup(smollm):
    """Two MT-Bench questions (turn 1), 32 tokens: the chain with an untrained draft and lookup."""
    makers = [("longspec_chain-lookup", lambda e: decoder(e, "chain", "random", lookup=10))]
    mtbench_lossless(smollm, makers, 2, 1, 32)
