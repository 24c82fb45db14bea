"""FAFO's own checks: greedy equals vanilla greedy (fp32) for every layout option and FAFO-2forward
under the tests' own policies (one StreamingLLM-shaped, one random: adversarial for the guesses), with
the flex region, the oneDNN engine and on SmolLM2 (every configured policy); the fumble rows really are
restricted; tree and gathered sampling checks are lossless in distribution; n-gram stores are deferred.
Every registered policy (dense and sliced), stop and length, the cache and the plain sampling check:
tests/test_every_method.py.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import torch

from core.engine import Engine
from core.sampling import Sampler
from core.types import Counts
from decoders.fafo.decoder import FAFO, FAFO2Forward
from decoders.vanilla import Vanilla
from kv_policies.base import KVPolicy
from kv_policies.full import FullKV
from tests.conftest import needs_smollm
from tests.helpers import CPU_PRESET
from tests.lossless_check import (
    check_lossless,
    check_pool_deferral,
    chi_square_pvalue,
    exact_distribution,
    mtbench_lossless,
    mtbench_policies_only,
)

pytestmark = pytest.mark.usefixtures("one_thread")


class SinkRecent(KVPolicy):
    """Test policy: the first `sink` and the last `recent` cached positions (StreamingLLM-shaped)."""

    name = "sink_recent"

    def __init__(self, sink: int = 2, recent: int = 6) -> None:
        self.sink, self.recent, self.budget = sink, recent, sink + recent
        self.calls: list[int] = []

    def select(self, layer, q, k_cache, cache_len):
        self.calls.append(q.shape[1])
        pos = torch.arange(cache_len)
        keep = (pos < self.sink) | (pos >= cache_len - self.recent)
        return keep.unsqueeze(0).expand(k_cache.shape[0], -1)


class RandomSubset(KVPolicy):
    """Test policy: `budget` random entries per layer and KV head (adversarial for the guesses)."""

    name = "random_subset"

    def __init__(self, budget: int = 8, seed: int = 0) -> None:
        self.budget = budget
        self.gen = torch.Generator().manual_seed(seed)

    def select(self, layer, q, k_cache, cache_len):
        scores = torch.rand(k_cache.shape[0], cache_len, generator=self.gen)
        top = scores.topk(self.budget, dim=1).indices
        return torch.zeros(k_cache.shape[0], cache_len, dtype=torch.bool).scatter(1, top, True)


def project_policies() -> list[tuple[str, object]]:
    """Every KV policy configured in conf/kv/ (instantiated from its yaml), with small budgets where
    the policy exposes one so that the restriction bites on short test contexts."""
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from runners.schemas import register_schemas

    register_schemas()
    conf = Path(__file__).resolve().parents[1] / "conf"
    out = []
    for path in sorted(conf.glob("kv/*.yaml")):
        with initialize_config_dir(str(conf), version_base="1.3"):
            cfg = OmegaConf.create(OmegaConf.to_container(compose("config", [f"kv={path.stem}"]).kv))
        for key, small in (("budget", 16), ("sink", 2), ("page_size", 4), ("window", 4), ("recent", 8)):
            if key in cfg:
                cfg[key] = small
        if "press_kwargs" in cfg:  # kvpress: an observation window shorter than the test prompts
            small_window = {"window_size": 4}
            if "chunk_length" in cfg.press_kwargs:
                cfg.press_kwargs.update(chunk_length=4, inner_kwargs=small_window)
            else:
                cfg.press_kwargs.update(small_window)
        out.append((path.stem, lambda cfg=cfg: instantiate(cfg)))
        if "backend" in cfg:  # the compressed-region layout too (sliced: no compile; flex: see below)
            sliced = OmegaConf.merge(cfg, {"backend": "sliced"})
            out.append((f"{path.stem}-sliced", lambda cfg=sliced: instantiate(cfg)))
    return out


# the tests' own policies (the registered ones, dense and sliced: tests/test_every_method.py)
POLICIES = [("sink_recent", SinkRecent), ("random_subset", RandomSubset)]
# The full MT-Bench check's setting (it began before the preset went from 2 streams to 1): the preset
# with two fumble streams, so two streams' restricted rows are checked against every policy each step.
MTBENCH_CPU = {**CPU_PRESET, "n": 2}
SETTINGS = [
    (FAFO, CPU_PRESET),
    (FAFO, MTBENCH_CPU),
    (FAFO, dict(k=4, n=8)),
    (FAFO, dict(k=3, n=5, m=2, stream_positions="slide")),
    (FAFO, dict(k=5, n=3, m=12, fumble_sees_last=False)),
    (FAFO, dict(k=2, n=16, pool_from_prompt=True, seed=3)),
    (FAFO, dict(k=4, n=10, tree=True)),
    (FAFO2Forward, dict(k=4, n=6)),
]
N_NEW = 40


def prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        length = int(torch.randint(8, 48, (1,), generator=g))
        out.append(torch.randint(0, 256, (length,), generator=g).tolist())
    return out


@pytest.fixture(scope="module")
def references(tiny_lm):
    eng = Engine(tiny_lm.model)
    ps = prompts(3)
    return eng, [(p, Vanilla(eng).generate(p, N_NEW, set(), Counts())) for p in ps]


@pytest.mark.parametrize("policy", POLICIES, ids=[p[0] for p in POLICIES])
def test_greedy_equals_vanilla_tiny(references, policy):
    eng, refs = references
    taus = []
    for (cls, kw), (prompt, ref) in itertools.product(SETTINGS, refs):
        counts = Counts()
        dec = cls(eng, kv=policy[1](), **kw)
        got = dec.generate(prompt, N_NEW, set(), counts)
        check_lossless(eng, prompt, ref, got)
        assert counts.committed == len(got) - 1  # first token comes from the prefill
        taus.append(counts.tau)
    assert max(taus) > 1.5, taus  # acceptance is exercised


def test_two_forward_counts_its_fumble_forward_as_a_draft_forward(references):
    """FAFO-2forward's forward A (the fumble rows over the compressed view, nothing committed) is a
    draft forward: one per verification, with its own rows, outside tau; the steps alternate."""
    eng, refs = references
    counts = Counts()
    got = FAFO2Forward(eng, kv=SinkRecent(), k=3, n=4).generate(refs[0][0], 24, set(), counts)
    assert counts.draft_forwards == counts.forwards and counts.committed == len(got) - 1
    assert [s.draft for s in counts.steps] == [True, False] * counts.forwards
    fumble, verify = counts.steps[0], counts.steps[1]
    assert fumble.committed == 0 and fumble.block_tokens == 1 + 3 * 4  # x_last + the k*n stream rows
    assert verify.kv_attended == len(refs[0][0])  # the first verification reads the whole prompt's cache


def test_fumble_rows_are_the_restricted_rows(references):
    """The policy is asked only about the n*k stream rows; verification rows are never restricted."""
    eng, refs = references
    policy = SinkRecent()
    FAFO(eng, kv=policy, k=3, n=5).generate(refs[0][0], 12, set(), Counts())
    assert policy.calls and set(policy.calls) == {15}


def test_compression_changes_guesses_not_output(references):
    """A policy that hides most of the cache changes what the streams guess (steps differ) while
    the output stays vanilla's."""
    eng, refs = references
    prompt, ref = refs[1]
    runs = {}
    for name, kv in (("full", FullKV()), ("tight", SinkRecent(1, 1))):
        counts = Counts()
        got = FAFO(eng, kv=kv, k=4, n=8).generate(prompt, N_NEW, set(), counts)
        check_lossless(eng, prompt, ref, got)
        runs[name] = [s.accepted for s in counts.steps]
    assert runs["full"] != runs["tight"]


@pytest.mark.parametrize("cls", [FAFO, FAFO2Forward])
def test_stream_grams_are_stored_while_the_next_forward_runs(references, monkeypatch, cls):
    """The streams' k-grams of a forward are stored after the next forward's launch, and every step finds
    the same candidates as when they are stored at once."""
    eng, refs = references
    prompt, ref = refs[2]
    check_pool_deferral(monkeypatch, eng, lambda: cls(eng, kv=SinkRecent(), k=3, n=6), prompt, ref, N_NEW)


# the flat layout with on-demand checks: tests/test_every_method.py
@pytest.mark.parametrize(
    ("tree", "gathered"),
    [(False, True), (True, False), (True, True)],
    ids=["gathered", "tree", "tree-gathered"],
)
def test_sampling_is_lossless_in_distribution(tiny_lm, tree, gathered, monkeypatch):
    """Three sampled tokens: FAFO's joint distribution equals the exact one (chi-square), with
    candidates accepted along the way (one-hot multi-candidate verification), the check's values
    computed as the walk reads them or gathered first."""
    from decoders import sampled_verify

    monkeypatch.setattr(sampled_verify, "GATHER_ON_CPU", gathered)
    eng = Engine(tiny_lm.model)
    base = [11, 42, 7, 99, 3, 250, 17]
    cont = Vanilla(eng).generate(base, 6, set(), Counts())
    prompt = base + cont + base  # the prompt's n-grams predict the likely continuation
    sampler_kw = dict(temperature=1.0, top_k=3)
    probs = exact_distribution(eng, prompt, 3, Sampler(**sampler_kw))
    samples, accepted = [], 0
    dec = FAFO(eng, k=3, n=4, pool_from_prompt=True, tree=tree, sampler=Sampler(**sampler_kw))
    for seed in range(400):
        dec.sampler.reseed(seed)
        counts = Counts(keep_steps=False)
        samples.append(tuple(dec.generate(prompt, 3, set(), counts)))
        accepted += counts.accepted
    assert accepted > 50
    assert chi_square_pvalue(samples, probs) > 1e-3


@pytest.mark.smollm
@needs_smollm
def test_smollm_mtbench_fast(smollm):
    """One MT-Bench question, both turns, with the packaged SmolLM2 in fp32, kv full / streaming / quest
    (budget 16, dense): exact or near-tie. Every other option and policy runs on the tiny models above;
    the slow variant covers every question, policy and the paper setting."""
    _mtbench_check(
        smollm,
        n_questions=1,
        turns=2,
        max_new=24,
        plan=[(dict(k=3, n=5, tree=True), ("full", "streaming", "quest"))],
    )


@pytest.mark.slow
@pytest.mark.smollm
@needs_smollm
def test_smollm_mtbench_full(smollm):
    """Every MT-Bench question, both turns, 256 new tokens: the CPU preset with two streams and every
    configured KV policy (dense and the sliced compressed region), and the paper's k 6, n 40, m 40 with
    kv=streaming (prefix-trie layout: the same verification as the flat one, hours instead of a day)."""
    plan = [(MTBENCH_CPU, None)]
    every_layout = not mtbench_policies_only()
    if every_layout:
        plan.append((dict(k=6, n=40, tree=True), ("streaming",)))
    _mtbench_check(smollm, n_questions=None, turns=2, max_new=256, plan=plan, backends=every_layout)


def _mtbench_check(lm, n_questions, turns, max_new, plan, backends: bool = False) -> None:
    """`plan`: (decoder kwargs, conf/kv names or None = all) pairs; `backends`: the first plan entry
    also runs each policy's compressed-region layout (`-sliced`)."""
    makers = []
    for i, (kw, only) in enumerate(plan):
        named = [("full", FullKV)] if only is None or "full" in only else []
        named += [
            (name, make)
            for name, make in project_policies()
            if name != "full"
            and (backends and i == 0 or "-" not in name)
            and (only is None or name.split("-")[0] in only)
        ]
        for name, make_kv in named:
            label = f"k{kw['k']}n{kw['n']}/{name}"
            makers.append((label, lambda e, kw=kw, make_kv=make_kv: FAFO(e, kv=make_kv(), **kw)))
    taus = mtbench_lossless(lm, makers, n_questions, turns, max_new)
    assert max(taus) > 1.0


def test_flex_compressed_region_is_lossless(references):
    """backend=flex: the policy's selection is swapped into the head region of the one KV cache and
    the fumble rows read it through the static FlexAttention block mask (compiled); output stays
    vanilla's, and the region really was used (entries swapped, fumble rows restricted)."""
    from kv_policies.registry import build_policy

    eng, refs = references
    for prompt, ref in refs[:2]:
        kv = build_policy("streaming", budget=16, sinks=2, backend="flex")
        dec = FAFO(eng, kv=kv, k=3, n=6, m=4)
        assert dec.pad_candidates and dec.layouts.align == 16
        counts = Counts()
        got = dec.generate(prompt, N_NEW, set(), counts)
        check_lossless(eng, prompt, ref, got)
        assert kv.slots.region is not None and kv.slots.region.backend == "flex" and kv.slots.region.swaps > 0
        assert {s.block_tokens for s in counts.steps} == {dec.max_block()}  # one static block shape


def test_onednn_engine_is_lossless(tiny_lm):
    """Engine(linear="onednn") (prepacked oneDNN weights, the benchmark's engine): FAFO equals
    vanilla on the same engine."""
    if tiny_lm.device.type != "cpu":
        pytest.skip("oneDNN prepacking is a CPU path")
    eng = Engine(tiny_lm.model, linear="onednn")
    for prompt in prompts(2, seed=5):
        ref = Vanilla(eng).generate(prompt, N_NEW, set(), Counts())
        for kw in (CPU_PRESET, dict(k=4, n=8)):
            got = FAFO(eng, kv=SinkRecent(), **kw).generate(prompt, N_NEW, set(), Counts())
            check_lossless(eng, prompt, ref, got)
