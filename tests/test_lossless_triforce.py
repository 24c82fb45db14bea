"""TriForce (decoders/triforce.py) and its draft model (decoders/draft_model.py): greedy equals vanilla
greedy (fp32) with a separate draft model through every KV policy, with the draft's StreamingLLM cache
evicting; the draft's eviction re-rotates keys exactly; fixed-shape drafts; bad input is one clear
error. The self-draft under every policy, stop and length, the cache and sampling in distribution:
tests/test_every_method.py."""

from __future__ import annotations

import pytest
import torch

from core.engine import Engine
from core.models import load_model
from core.tokenizer import ByteTokenizer
from core.types import Counts, HarnessError
from decoders.draft_model import DraftModel, build_draft, check_same_vocabulary
from decoders.selfspec import SelfSpeculative
from decoders.triforce import TriForce
from decoders.vanilla import Vanilla
from kv_policies.registry import build_policy
from tests.conftest import TEST_DEVICE, needs_smollm
from tests.helpers import POLICIES, varied_prompts
from tests.lossless_check import (
    check_lossless,
    mtbench_lossless,
    prompts_lossless,
    task_prompts,
)

pytestmark = pytest.mark.usefixtures("one_thread")
N_NEW = 40


@pytest.fixture(scope="module")
def refs(tiny_lm):
    eng = Engine(tiny_lm.model)
    return eng, [(p, Vanilla(eng).generate(p, N_NEW, set(), Counts())) for p in varied_prompts(6, seed=5)]


@pytest.fixture(scope="module")
def other_draft():
    """A separate one-layer random Llama sharing the tiny models' byte vocabulary."""
    return load_model(
        "tiny", "tiny", arch="llama", dtype="float32", device=TEST_DEVICE, seed=7, tiny={"layers": 1}
    )


def drafts(eng, other) -> dict[str, DraftModel]:
    # budget 24 + room 12 over prompts of up to 60 tokens + 40 new: the draft cache evicts
    return {
        "self": DraftModel(eng.truncated(1), "self-1", eng.w.vocab_size, budget=24, sinks=4, room=12),
        "other": DraftModel(Engine(other.model), "tiny", eng.w.vocab_size, budget=24, sinks=4, room=12),
    }


@pytest.mark.parametrize("name", sorted(POLICIES))
@pytest.mark.parametrize("which", ["other"])  # the self-draft under every policy: tests/test_every_method.py
def test_greedy_equals_vanilla_tiny(refs, other_draft, name, which):
    eng, cases = refs
    draft = drafts(eng, other_draft)[which]
    l1 = l1_ok = forwards = 0
    for gamma1, gamma2 in ((1, 3), (2, 6), (3, 2)):
        for prompt, ref in cases:
            counts = Counts()
            dec = TriForce(
                eng, kv=build_policy(name, **POLICIES[name]), gamma1=gamma1, gamma2=gamma2, draft=draft
            )
            got = dec.generate(prompt, N_NEW, set(), counts)
            check_lossless(eng, prompt, ref, got)
            assert counts.committed == len(got) - 1
            assert counts.accepted <= counts.drafted and counts.accepted_l1 <= counts.drafted_l1
            l1, l1_ok, forwards = (
                l1 + counts.drafted_l1,
                l1_ok + counts.accepted_l1,
                forwards + counts.forwards,
            )
            assert counts.draft_model_forwards > 0 and counts.draft_forwards >= counts.forwards
    assert l1 > 0 and forwards < 3 * len(cases) * (N_NEW - 1)
    if which == "self":  # a one-layer truncation of a two-layer model agrees now and then
        assert 0 < l1_ok < l1


def test_without_a_draft_model_it_is_self_speculation(refs):
    """draft=none: the target over the policy drafts gamma2 tokens itself (no level 1)."""
    eng, cases = refs
    for prompt, ref in cases[:3]:
        counts = Counts()
        got = TriForce(eng, kv=build_policy("retrieval", budget=24, chunk=4), gamma2=4).generate(
            prompt, N_NEW, set(), counts
        )
        check_lossless(eng, prompt, ref, got)
        assert counts.draft_model_forwards == 0 and counts.drafted_l1 == 0
        assert counts.draft_forwards == counts.drafted


# --- the draft model ---------------------------------------------------------------------------------
def test_evict_rerotates_keys_to_their_slot_positions(tiny_lm):
    """After evicting [4, 20) of 40 entries, the first layer's keys and values (which depend on the
    token and its position only) equal a fresh prefill of the kept tokens at positions 0..23."""
    eng = Engine(tiny_lm.model)
    toks = [(7 * i + 3) % 250 for i in range(40)]
    eng.reset(48)
    eng.prefill(toks)
    eng.evict(4, 20)
    assert eng.length == 24 and torch.equal(eng.cache.slot_pos[:24], torch.arange(24, device=eng.device))
    fresh = Engine(tiny_lm.model)
    fresh.reset(48)
    fresh.prefill(toks[:4] + toks[20:])
    torch.testing.assert_close(eng.cache.k[0, :, :24], fresh.cache.k[0, :, :24], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(eng.cache.v[0, :, :24], fresh.cache.v[0, :, :24], atol=1e-6, rtol=1e-6)


def test_self_draft_without_eviction_is_the_truncated_target(tiny_lm):
    """With a budget above the context, the self-draft's greedy drafts are the first-layer model's
    greedy continuation."""
    eng = Engine(tiny_lm.model)
    prompt = varied_prompts(2, seed=9)[1]
    one = eng.truncated(1)
    want = Vanilla(one).generate(prompt, 6, set(), Counts())
    draft = DraftModel(eng.truncated(1), "self-1", eng.w.vocab_size, budget=200, sinks=4, room=8)
    draft.start(prompt, Counts())
    got = draft.propose_chain(prompt + want[:1], len(prompt) + 1, 5, Counts()).tolist()
    assert got == want[1:]


def test_draft_memory_is_bounded_by_its_budget(refs):
    eng, cases = refs
    draft = DraftModel(eng.truncated(1), "self-1", eng.w.vocab_size, budget=16, sinks=2, room=8)
    dec = TriForce(eng, kv=build_policy("streaming", budget=24), gamma1=1, gamma2=2, draft=draft)
    prompt = cases[0][0] * 3
    dec.generate(prompt, N_NEW, set(), Counts())
    # entries: at most budget + room = 24; slots: 24 + max(chunk 7, room 8) for fixed-shape pad rows
    assert draft.engine.cache.capacity == 32 and draft.engine.length <= 24 < len(prompt)


# --- sampling ----------------------------------------------------------------------------------------


# --- bad input ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("field", ["gamma1", "gamma2"])
@pytest.mark.parametrize("bad", [0, -2, True, 1.5])
def test_bad_gammas_are_one_clear_error(refs, field, bad):
    with pytest.raises(HarnessError, match=f"^decoder.{field} must be an integer >= 1, got {bad!r}$"):
        TriForce(refs[0], **{field: bad})


def test_draft_vocabulary_and_window_are_checked(refs):
    eng = refs[0]

    class OtherTokenizer:
        def get_vocab(self):
            return {"a": 0}

    class SameTokenizer(OtherTokenizer):
        pass

    with pytest.raises(HarnessError, match="vocabulary differs from the target's"):
        check_same_vocabulary(ByteTokenizer(), OtherTokenizer(), "x")
    check_same_vocabulary(SameTokenizer(), OtherTokenizer(), "x")
    short = load_model(
        "tiny", "tiny", arch="llama", dtype="float32", seed=2, tiny={"layers": 1, "max_positions": 64}
    )
    with pytest.raises(HarnessError, match="exceeds the draft model's context \\(64\\)"):
        DraftModel(Engine(short.model), "short", 260, budget=60, sinks=4, room=8)
    with pytest.raises(HarnessError, match="need draft.room >= 10"):
        TriForce(
            eng, gamma1=2, gamma2=6, draft=DraftModel(eng.truncated(1), "s", 260, budget=64, sinks=4, room=8)
        )
    with pytest.raises(HarnessError, match="budget \\(4\\) must exceed sinks"):
        DraftModel(eng.truncated(1), "s", 260, budget=4, sinks=4)


def test_build_draft_from_the_config_group(refs, tiny_lm):
    from omegaconf import OmegaConf

    eng = refs[0]
    assert build_draft(OmegaConf.create({"kind": "none"}), tiny_lm, eng) is None
    d = build_draft(
        OmegaConf.create({"kind": "self_layers", "layers": 1, "budget": 32, "sinks": 4}), tiny_lm, eng
    )
    assert d.engine.w.n_layers == 1 and d.engine.w.layers[0] is eng.w.layers[0] and "self-draft" in d.label
    for layers in (0, 2, "x"):
        with pytest.raises(HarnessError, match="layers must be an integer in \\[1, 1\\]"):
            build_draft(OmegaConf.create({"kind": "self_layers", "layers": layers}), tiny_lm, eng)
    with pytest.raises(HarnessError, match="draft.kind must be one of"):
        build_draft(OmegaConf.create({"kind": "nope"}), tiny_lm, eng)
    with pytest.raises(HarnessError, match="draft=hf needs draft.name"):
        build_draft(OmegaConf.create({"kind": "hub", "name": "???"}), tiny_lm, eng)
    with pytest.raises(HarnessError, match="draft.kind=packaged needs draft.name=<one of smollm2-135m"):
        build_draft(OmegaConf.create({"kind": "packaged"}), tiny_lm, eng)


@needs_smollm
def test_a_packaged_draft_of_another_vocabulary_is_refused(tiny_lm):
    """draft.kind=packaged loads an offline model as the draft; the vocabulary check still applies (the
    packaged SmolLM2 against a tiny random target)."""
    from omegaconf import OmegaConf

    eng = Engine(tiny_lm.model)
    with pytest.raises(HarnessError, match="vocabulary"):
        build_draft(OmegaConf.create({"kind": "packaged", "name": "smollm2-135m"}), tiny_lm, eng)


# --- SmolLM2 ----------------------------------------------------------------------------------------
def _mtbench_makers():
    """TriForce with the self-draft (first 4 layers) over the retrieval and StreamingLLM caches."""

    def maker(name: str):
        def make(e):
            draft = DraftModel(e.truncated(4), "self-4", e.w.vocab_size, budget=64, sinks=4, room=24)
            return TriForce(e, kv=build_policy(name, budget_frac=0.25), gamma1=2, gamma2=6, draft=draft)

        return make

    return [("triforce-retrieval", maker("retrieval")), ("triforce-streaming", maker("streaming"))]


@pytest.mark.smollm
@needs_smollm
def test_smollm_mtbench_fast(smollm):
    """One MT-Bench question (turn 1), 32 tokens: the self-draft (first 4 layers) over the retrieval
    and StreamingLLM caches (the slow test runs every question)."""
    taus = mtbench_lossless(smollm, _mtbench_makers(), 1, 1, 32)
    assert max(taus) > 1.2


@pytest.mark.slow
@needs_smollm
def test_smollm_mtbench_slow(smollm):
    """Every MT-Bench question (turn 1), 48 tokens, the same two hierarchies."""
    taus = mtbench_lossless(smollm, _mtbench_makers(), None, 1, 48)
    assert max(taus) > 1.2


def _smollm_makers():
    def selfspec(e):
        return SelfSpeculative(e, kv=build_policy("retrieval", budget_frac=0.05, backend="sliced"), gamma=6)

    def triforce(name: str):
        def make(e):
            draft = DraftModel(e.truncated(4), "self-4", e.w.vocab_size, budget=128, sinks=8, room=32)
            return TriForce(e, kv=build_policy(name, budget_frac=0.05), gamma1=2, gamma2=6, draft=draft)

        return make

    return [
        ("selfspec-retrieval", selfspec),
        ("triforce-retrieval", triforce("retrieval")),
        ("triforce-streaming", triforce("streaming")),
    ]


@pytest.mark.smollm
@needs_smollm
def test_smollm_long_context_fast(smollm):
    """One 1k-token long-document prompt, 32 tokens: self-speculation and TriForce (self-draft, evicting
    draft cache) through the retrieval cache token-identical to vanilla (the MT-Bench test above covers a
    short prompt; the slow test adds TriForce over StreamingLLM, GSM8K and longer contexts)."""
    prompts = task_prompts(smollm, [("pg19", {"context_length": 1024, "source": "package", "limit": 1})])
    taus = prompts_lossless(smollm, _smollm_makers()[:2], prompts, 32)
    assert max(taus) > 1.5


@pytest.mark.slow
@needs_smollm
def test_smollm_gsm8k_and_long_context_slow(smollm):
    """20 GSM8K questions, then 4k and 7k-token long-document prompts (3 each), 128 tokens."""
    specs = [("gsm8k", {"limit": 20})]
    specs += [("pg19", {"context_length": n, "source": "package", "limit": 3}) for n in (4096, 7168)]
    prompts_lossless(smollm, _smollm_makers(), task_prompts(smollm, specs), 128)


def test_draft_models_take_the_fixed_shape_forward_when_the_target_does(refs, other_draft, tiny_lm):
    """A target on the fixed-shape forwards (`Engine.use_graphs`; here the eager twin of the CUDA graphs)
    gives its draft model, self-truncated or loaded, fixed-shape forwards of its own: the same tokens and
    counts as the regular forwards, and every decode step of the draft (one token) took them."""
    from omegaconf import OmegaConf

    eng, cases = refs
    static = Engine(tiny_lm.model)
    static.use_graphs(capture=False)
    loaded = build_draft(OmegaConf.create({"kind": "tiny", "arch": "llama", "seed": 7}), tiny_lm, static)
    for which in ("self", "other"):
        plain = drafts(eng, other_draft)[which]
        graphed = drafts(static, other_draft)[which]
        if which == "other":  # a loaded draft gets its own fixed-shape forwards from `build_draft`
            graphed = DraftModel(loaded.engine, "tiny", eng.w.vocab_size, budget=24, sinks=4, room=12)
            plain = DraftModel(
                Engine(loaded.engine.model), "tiny", eng.w.vocab_size, budget=24, sinks=4, room=12
            )
        assert graphed.engine.graphs is not None and graphed.engine.graphs.engine is graphed.engine
        assert plain.engine.graphs is None
        for prompt, ref in cases[:3]:
            want, got = Counts(), Counts()
            before = graphed.engine.fixed_shape_steps
            out = TriForce(static, kv=build_policy("streaming", budget=24), draft=graphed).generate(
                prompt, N_NEW, set(), got
            )
            assert out == ref
            plain_out = TriForce(eng, kv=build_policy("streaming", budget=24), draft=plain).generate(
                prompt, N_NEW, set(), want
            )
            assert plain_out == ref and got.accepted_l1 == want.accepted_l1 and got.accepted == want.accepted
            decode_steps = got.draft_model_forwards
            assert graphed.engine.fixed_shape_steps - before >= decode_steps > 0
        assert 1 in graphed.engine.graphs.by_rows
