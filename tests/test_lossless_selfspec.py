"""Self-speculative decoding (decoders/selfspec.py) and the policies it drafts through (kv=retrieval,
kv=topk): drafting over the whole cache is always accepted, dense layers, rebuilds and the sliced
layout's drafts, speculative sampling itself is exact, bad input is one clear error. Greedy == vanilla
with every policy and layout, stop and length, the cache and sampling in distribution:
tests/test_every_method.py."""

from __future__ import annotations

import pytest
import torch

from core.engine import Engine
from core.sampling import Sampler
from core.types import Counts, HarnessError
from decoders.sampled_verify import ChainCheck
from decoders.selfspec import SelfSpeculative
from decoders.vanilla import Vanilla
from kv_policies.registry import build_policy
from kv_policies.retrieval import Retrieval, chunk_means, chunk_scores
from kv_policies.stacking import every_layer
from tests.conftest import needs_smollm, prefill_under
from tests.helpers import POLICIES, varied_prompts
from tests.lossless_check import (
    check_lossless,
    chi_square_pvalue,
    mtbench_lossless,
)

pytestmark = pytest.mark.usefixtures("one_thread")
N_NEW = 32


@pytest.fixture(scope="module")
def refs(tiny_lm):
    eng = Engine(tiny_lm.model)
    return eng, [(p, Vanilla(eng).generate(p, N_NEW, set(), Counts())) for p in varied_prompts(6, seed=3)]


LAYOUTS = [(n, b) for n in sorted(POLICIES) for b in ("dense", "sliced") if n != "full" or b == "dense"]


def test_full_policy_drafts_are_always_accepted(refs):
    """Drafting over the whole cache is the target itself: every draft is accepted (greedy)."""
    eng, cases = refs
    for prompt, ref in cases[:3]:
        counts = Counts()
        assert SelfSpeculative(eng, gamma=5).generate(prompt, N_NEW, set(), counts) == ref
        assert counts.accepted == counts.drafted and counts.tau > 4


def test_draft_tail_is_refused_by_flex(refs):
    with pytest.raises(HarnessError, match="backend=sliced"):
        SelfSpeculative(refs[0], kv=build_policy("streaming", budget=24, backend="flex"), gamma=2)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_bad_gamma_is_one_clear_error(refs, bad):
    with pytest.raises(HarnessError, match="decoder.gamma must be an integer >= 1"):
        SelfSpeculative(refs[0], gamma=bad)


def test_bad_retrieval_budget_is_one_clear_error():
    with pytest.raises(HarnessError, match="must exceed the chunk size"):
        Retrieval(budget=8, chunk=8)
    with pytest.raises(HarnessError, match="chunk must be a positive integer"):
        Retrieval(chunk=0)


# --- the retrieval policy ---------------------------------------------------------------------------
def test_retrieval_chooses_sink_tail_and_top_chunks_by_mean_key():
    torch.manual_seed(0)
    hkv, h, length, d, chunk = 2, 4, 45, 8, 4
    k = torch.randn(hkv, length, d)
    q = torch.randn(h, d)
    pol = Retrieval(budget=20, chunk=chunk)  # 5 chunks: the sink, the partial tail, 3 chosen
    keep = pol.choose(q, k)
    scores = chunk_scores(q, k, chunk)
    for j in range(hkv):
        brute = [float(q[j * 2 : j * 2 + 2].mean(0) @ k[j, c * 4 : c * 4 + 4].mean(0)) for c in range(11)]
        torch.testing.assert_close(scores[j], torch.tensor(brute), atol=1e-5, rtol=1e-5)
        top = sorted(range(1, 11), key=lambda c: -brute[c])[:3]
        chunks = {c for c in range(11) if keep[j, c * 4]}
        assert chunks == {0, *top}
        assert keep[j, 44] and int(keep[j].sum()) == 4 * 4 + 1


def test_retrieval_gqa_prob_ranks_chunks_by_the_groups_mean_attention_share():
    torch.manual_seed(1)
    hkv, h, length, d, chunk = 2, 6, 40, 8, 4
    k, q = torch.randn(hkv, length, d), torch.randn(h, d) * 3
    scores = chunk_scores(q, k, chunk, "prob")
    g = h // hkv
    for j in range(hkv):
        kbar = torch.stack([k[j, c * 4 : c * 4 + 4].mean(0) for c in range(10)])
        shares = [torch.softmax(q[j * g + i] @ kbar.T, 0) for i in range(g)]
        torch.testing.assert_close(scores[j], torch.stack(shares).mean(0), atol=1e-6, rtol=1e-5)
    one = chunk_scores(q[:hkv], k, chunk, "prob").argsort(1)  # one query head per KV head: same ranking
    assert torch.equal(one, chunk_scores(q[:hkv], k, chunk, "logit").argsort(1))
    keep = Retrieval(budget=12, chunk=chunk, gqa_score="prob").choose(q, k)
    for j in range(hkv):
        assert {c for c in range(10) if keep[j, c * 4]} == {0, *scores[j, 1:].topk(2).indices.add(1).tolist()}
    with pytest.raises(HarnessError, match="gqa_score must be one of logit, prob"):
        Retrieval(gqa_score="max")


def test_topk_keeps_the_most_attended_entries(refs):
    eng, cases = refs
    pol = build_policy("topk", budget=8)
    pol.attach(eng)
    prompt = cases[0][0]
    eng.reset(len(prompt) + 4)
    eng.prefill(prompt)
    q = torch.randn(eng.w.n_heads, 1, eng.w.head_dim, device=eng.device)
    k = eng.cache.k[1, :, : eng.length]
    sel = pol.select(1, q, k, eng.length)
    att = (q.reshape(k.shape[0], -1, k.shape[-1]) @ k.transpose(1, 2) * eng.scale).softmax(-1).sum(1)
    for j in range(k.shape[0]):
        assert set(sel[j].nonzero().squeeze(1).tolist()) == set(att[j].topk(8).indices.tolist())


# --- sampling --------------------------------------------------------------------------------------
def test_chain_check_is_exact_in_distribution():
    """One draft token from q, verified against p: the committed first token is distributed as p."""
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(6, generator=g), 0)
    q = torch.softmax(torch.randn(6, generator=g) * 2, 0)
    sampler = Sampler(temperature=1.0, seed=3)
    firsts = []
    for _ in range(6000):
        x = sampler.device_draw(q).view(1)
        verdict = ChainCheck(x, q[None], torch.stack([p, p]), sampler).run()
        firsts.append((verdict.tokens[0],))
    assert chi_square_pvalue(firsts, {(i,): float(p[i]) for i in range(6)}) > 1e-3


# --- SmolLM2 ----------------------------------------------------------------------------------------
@pytest.mark.smollm
@needs_smollm
def test_smollm_mtbench_fast(smollm):
    """One MT-Bench question (turn 1), 32 tokens: MagicDec (streaming) and retrieval drafting."""

    def maker(name: str, **params):
        return lambda e: SelfSpeculative(e, kv=build_policy(name, budget_frac=0.25, **params), gamma=4)

    makers = [("selfspec-streaming", maker("streaming")), ("selfspec-retrieval", maker("retrieval"))]
    taus = mtbench_lossless(smollm, makers, 1, 1, 32)
    assert max(taus) > 1.5


@pytest.mark.parametrize("name", ["streaming", "h2o", "retrieval", "topk"])
def test_dense_layers_see_the_whole_cache(refs, name):
    """kv.dense_layers=1: the first layer keeps every entry, the second is restricted; as many dense
    layers as the model has make drafting exact (every draft accepted)."""
    eng, cases = refs
    prompt, ref = cases[1]  # 90 tokens: over every budget here
    pol = build_policy(name, **POLICIES[name], dense_layers=1)
    prefill_under(eng, pol, prompt, 4)
    assert pol.keeps_all(0, eng.length) and not pol.keeps_all(1, eng.length)
    counts = Counts()
    every = build_policy(name, **POLICIES[name], dense_layers=eng.w.n_layers)
    assert SelfSpeculative(eng, kv=every, gamma=4).generate(prompt, N_NEW, set(), counts) == ref
    assert counts.accepted == counts.drafted
    with pytest.raises(HarnessError, match="dense_layers must be a non-negative integer"):
        build_policy(name, **POLICIES[name], dense_layers=-1)


def test_rebuild_when_acceptance_drops(refs):
    """rebuild_below: the retrieval selection is rebuilt when the acceptance of the last verifications
    falls below the threshold; the output stays vanilla's."""
    eng, cases = refs
    calls = []
    pol = build_policy("retrieval", budget=24, chunk=4)
    original = pol.rebuild
    pol.rebuild = lambda e: (calls.append(e.length), original(e))[1]
    prompt, ref = cases[1]
    dec = SelfSpeculative(eng, kv=pol, gamma=4, rebuild_below=0.99, rebuild_window=2)
    check_lossless(eng, prompt, ref, dec.generate(prompt, N_NEW, set(), Counts()))
    assert len(calls) > 1  # after the prefill, then on low acceptance
    for bad in (1.0, -0.1, "x"):
        with pytest.raises(HarnessError, match="decoder.rebuild_below must be a number >= 0 and < 1"):
            SelfSpeculative(eng, rebuild_below=bad)
    with pytest.raises(HarnessError, match="decoder.rebuild_window must be an integer >= 1"):
        SelfSpeculative(eng, rebuild_window=0)


@pytest.mark.parametrize("backend", ["dense", "sliced"])
def test_rebuild_every_verification_rechooses_prompt_chunks_and_keeps_generated_tokens(refs, backend):
    """decoder.rebuild_every=1: every rebuild chooses again among the prompt's chunks from the latest
    query, over chunk means computed once; the generated tokens stay visible; each rebuild is counted
    with the keys it read (half an entry each); the output stays vanilla's."""
    eng, cases = refs
    prompt, ref = cases[2]
    pol = build_policy("retrieval", budget=24, chunk=4, backend=backend, dense_layers=1)
    counts = Counts()
    dec = SelfSpeculative(eng, kv=pol, gamma=3, rebuild_every=1)
    check_lossless(eng, prompt, ref, dec.generate(prompt, N_NEW, set(), counts))
    assert counts.kv_rebuilds == counts.forwards
    p = len(prompt)
    assert pol.built_len == p and 0 not in pol._means and set(pol._means) == set(range(1, eng.w.n_layers))
    pos = torch.arange(p, device=eng.device)
    for layer, kbar in pol._means.items():
        keys = pol.slots.gather_keys(layer, eng.cache.k[layer], pos)
        torch.testing.assert_close(kbar, chunk_means(keys, 4))
        assert torch.equal(pol._keep[layer], pol.choose(pol._q[layer], keys))
        sel = pol.select(layer, pol._q[layer], eng.cache.k[layer], p + 5)
        assert sel[:, p:].all() and int(sel[0, :p].sum()) <= 24
    n_layers = eng.w.n_layers
    assert pol.rebuild(eng) == pytest.approx((p // 4) * (n_layers - 1) / 2 / n_layers)  # the kept means
    # the stacked selections the fixed-shape forward stages follow a rebuild (not the stack of before)
    length = eng.length
    per_layer = every_layer  # every layer's `visible`, one by one
    assert torch.equal(pol.layer_selections(length), per_layer(pol, length))
    for layer in pol._q:
        pol._q[layer] = -pol._q[layer]  # another query chooses other chunks
    before = pol.layer_selections(length).clone()
    pol.rebuild(eng)
    assert torch.equal(pol.layer_selections(length), per_layer(pol, length))
    assert not torch.equal(pol.layer_selections(length), before)


@pytest.mark.parametrize("rebuild_every", [0, 1])
def test_sliced_drafts_equal_the_dense_ones(refs, rebuild_every):
    """The compressed region places retrieval's selection once per selection (a step's draft rounds
    share one; a rebuild makes a new one): the drafts, their acceptance and the KV read of every
    forward are the dense layout's."""
    eng, cases = refs
    results = []
    for backend in ("dense", "sliced"):
        per_prompt = []
        for prompt, ref in cases[:3]:
            pol = build_policy("retrieval", budget=24, chunk=4, backend=backend)
            counts = Counts()
            dec = SelfSpeculative(eng, kv=pol, gamma=4, rebuild_every=rebuild_every)
            assert dec.generate(prompt, N_NEW, set(), counts) == ref
            per_prompt.append((counts.accepted, counts.drafted, [s.kv_attended for s in counts.steps]))
        results.append(per_prompt)
    assert results[0] == results[1] and any(acc for acc, _, _ in results[0])


def test_sliced_drafts_read_the_device_a_few_times_per_step(refs):
    """On the compressed region a step's placement (every layer at once) reads the device a few times;
    the draft rounds read nothing more (their lengths are known from the placement)."""
    from runners.host_syncs import HostSyncs

    eng, cases = refs
    prompt, ref = cases[0]
    syncs = HostSyncs(eng.device)
    counts = Counts(on_prefill_done=syncs.mark, on_decode_done=syncs.stop)
    dec = SelfSpeculative(eng, kv=build_policy("retrieval", budget=24, chunk=4, backend="sliced"), gamma=4)
    with syncs:
        assert dec.generate(prompt, N_NEW, set(), counts) == ref
    assert counts.draft_forwards > 2 * counts.forwards and syncs.since_mark <= 6 * counts.forwards
