"""Every decoder of `decoders/registry.py` under every KV policy of `kv_policies/registry.py`, at the
tiny settings of `tests/helpers.py` (`tiny`, `tiny_policy`: a method's entry there, or its Config's
defaults for a method registered without one, so a new decoder or policy is covered by its registry entry):

- greedy: a lossless decoder's output is vanilla greedy's token for token (fp32; a divergence only at an
  audited near-tie, `tests.lossless_check`) under every policy it accepts, in every layout (dense and
  the compressed region), and its one KV cache ends as vanilla's; a refused policy is one clear line;
- a stop token and the length limit end a generation where vanilla's ends;
- sampling is lossless in distribution (chi-square against the exact distribution);
- on fixed-shape forwards (`Engine.use_graphs(capture=False)`, the eager twin of the CUDA graphs) the
  output is the regular path's and the decode steps took that path.

One host sync per step and the emulated capture read the same table (tests/test_syncs_per_step.py,
tests/test_captured_graphs.py). The methods' own behaviour stays in their files (tests/test_lossless_*.py).
"""

from __future__ import annotations

import pytest
import torch

from core.engine import Engine
from core.sampling import Sampler
from core.types import Counts, HarnessError
from decoders.registry import DECODERS as REGISTERED_DECODERS
from decoders.vanilla import Vanilla
from kv_policies.registry import REGISTRY as REGISTERED_POLICIES
from kv_policies.registry import build_policy
from tests.helpers import DECODERS, POLICIES, SAMPLER_KW, tiny, tiny_policy, varied_prompts
from tests.lossless_check import check_lossless, chi_square_pvalue, sample_generations, tiny_sampling_case

pytestmark = pytest.mark.usefixtures("one_thread")
N_NEW = 32
# every registered policy, and the compressed-region layout of each that has one (`backend=sliced`)
LAYOUTS = [(name, "dense") for name in REGISTERED_POLICIES]
LAYOUTS += [(name, "sliced") for name in REGISTERED_POLICIES if name != "full"]


def test_the_tiny_settings_name_registered_methods_only():
    """An entry whose method left the registry would test nothing: each names a registered method, runs
    under a registered policy and samples or says why not."""
    assert set(DECODERS) <= set(REGISTERED_DECODERS)
    assert set(POLICIES) <= set(REGISTERED_POLICIES)
    for name, entry in DECODERS.items():
        assert entry.policy in REGISTERED_POLICIES, name
        assert (entry.sampling is None) != (not entry.unsampled), f"{name}: a sampling setting or why not"


def policy(name: str, backend: str = "dense"):
    if name == "kvpress":
        pytest.importorskip("kvpress")
    return build_policy(name, **tiny_policy(name), **({} if backend == "dense" else {"backend": backend}))


@pytest.fixture(scope="module")
def refs(tiny_lm):
    """Vanilla greedy on four prompts, with the cache it ends with."""
    eng = Engine(tiny_lm.model)
    cases = []
    for prompt in varied_prompts(4, seed=2):  # 57, 90, 21 and 27 tokens
        ref = Vanilla(eng).generate(prompt, N_NEW, set(), Counts())
        n = eng.length
        cases.append((prompt, ref, eng.cache.k[:, :, :n].clone(), eng.cache.v[:, :, :n].clone()))
    return eng, cases


def _cache_is_vanillas(eng: Engine, kv, k_ref: torch.Tensor, v_ref: torch.Tensor) -> None:
    """Vanilla's entries at their positions: in slot order, or where a compressed region moved them (its
    `where`: the slot of each position per layer and KV head). A last block may leave entries after
    vanilla's, which the next generation overwrites."""
    n = k_ref.shape[2]
    assert eng.length >= n, f"the cache holds {eng.length} entries, vanilla's {n}"
    region = kv.slots.region
    if region is None:
        assert torch.equal(eng.cache.slot_pos[:n].cpu(), torch.arange(n))
        where = torch.arange(n, device=eng.device).expand(*k_ref.shape[:2], n)
    else:
        where = region.where[:, :, :n]
    index = where.unsqueeze(-1).expand(*where.shape, k_ref.shape[-1])
    torch.testing.assert_close(eng.cache.k[:, :, : eng.length].gather(2, index), k_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(eng.cache.v[:, :, : eng.length].gather(2, index), v_ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(("kv", "backend"), LAYOUTS, ids=[f"{n}-{b}" for n, b in LAYOUTS])
@pytest.mark.parametrize("name", sorted(REGISTERED_DECODERS))
def test_greedy_equals_vanilla_and_the_cache_ends_as_vanillas(refs, name, kv, backend):
    """The decoder under the policy (every option set of its entry under its own policy): vanilla's
    tokens, one commit per token after the first, and the one KV cache left as vanilla's; drafts are
    accepted somewhere. A decoder that refuses the policy says so in one line; a lossy pair (`lossless`
    False) makes its length."""
    eng, cases = refs
    entry = tiny(name)
    drafted = accepted = 0
    # the option sets under the decoder's own policy; the first (its defaults) under every other layout
    sweep = entry.variants if (kv, backend) == (entry.policy, "dense") else entry.variants[:1]
    for options in sweep:
        for prompt, ref, k_ref, v_ref in cases:
            try:
                dec = entry.make(eng, policy(kv, backend), **options)
            except HarnessError as refusal:
                assert "\n" not in str(refusal) and kv != entry.policy
                return
            counts = Counts()
            got = dec.generate(prompt, N_NEW, set(), counts)
            assert counts.committed == len(got) - 1  # the first token comes from the prefill
            if not dec.lossless:
                assert len(got) == N_NEW
                return
            if check_lossless(eng, prompt, ref, got) is None:
                _cache_is_vanillas(eng, dec.kv, k_ref, v_ref)
            drafted, accepted = drafted + counts.drafted, accepted + counts.accepted
    assert accepted > 0 or not drafted  # acceptance is exercised


@pytest.mark.parametrize("name", sorted(REGISTERED_DECODERS))
def test_stop_token_and_length(refs, name):
    """A stop token ends the output at vanilla's stop (a lossy decoder: at its first stop token); 1, 2, 3
    new tokens are the first of vanilla's."""
    eng, cases = refs
    entry = tiny(name)
    for prompt, ref, _, _ in cases[:2]:
        dec = entry.make(eng, policy(entry.policy))
        stop = {ref[len(ref) // 2]}
        got = dec.generate(prompt, N_NEW, stop, Counts())
        if dec.lossless:
            want = Vanilla(eng).generate(prompt, N_NEW, stop, Counts())
            assert want[-1] in stop
            check_lossless(eng, prompt, want, got)
        else:
            assert (
                [t in stop for t in got].index(True) == len(got) - 1 if got[-1] in stop else len(got) == N_NEW
            )
        for max_new in (1, 2, 3):
            short = dec.generate(prompt, max_new, set(), Counts())
            assert short == ref[:max_new] if dec.lossless else len(short) == max_new


# (a registered decoder without an entry is collected, to fail: KeyError)
SAMPLED = [n for n in sorted(REGISTERED_DECODERS) if tiny(n).sampling is not None]


@pytest.mark.parametrize("name", SAMPLED)
def test_sampling_is_lossless_in_distribution(name):
    """The first sampled tokens (temperature, top-k and top-p all active, a small vocabulary): the
    decoder's empirical joint distribution fits the exact vanilla-sampling one, with drafts accepted.
    The test's power is shown in tests/test_verify.py."""
    setting = tiny(name).sampling
    n = setting.get("tokens", 3)
    eng, prompt, exact = tiny_sampling_case(n, SAMPLER_KW, layers=setting.get("layers", 2))
    kv_name, kv_params = setting.get("kv", ("full", {}))
    dec = tiny(name).make(
        eng, build_policy(kv_name, **kv_params), Sampler(seed=1, **SAMPLER_KW), **setting.get("options", {})
    )
    samples, totals = sample_generations(dec, prompt, n, setting["runs"])
    for field in ("accepted", "accepted_l1"):  # drafts are really accepted under sampling
        assert totals[field] >= setting.get(field, 0), field
    assert chi_square_pvalue(samples, exact) > 1e-3


@pytest.mark.parametrize("name", sorted(REGISTERED_DECODERS))
def test_fixed_shape_forwards_give_the_regular_paths_tokens(refs, name):
    """On the fixed-shape forwards (eager here, captured as CUDA graphs on a GPU) the decoder gives the
    regular path's tokens and counts, and its decode steps took that path (drafting blocks padded)."""
    eng, cases = refs
    entry = tiny(name)
    static = Engine(eng.model)
    static.use_graphs(capture=False)
    for prompt, _, _, _ in cases[:2]:
        want, got = Counts(), Counts()
        ref = entry.make(eng, policy(entry.policy)).generate(prompt, N_NEW, set(), want)
        assert entry.make(static, policy(entry.policy)).generate(prompt, N_NEW, set(), got) == ref
        assert (got.forwards, got.accepted) == (want.forwards, want.accepted)
    assert static.fixed_shape_steps >= got.forwards > 0
    if got.drafted:  # verification blocks took padded fixed-shape forwards too
        assert max(_block_rows(static)) > 1


def _block_rows(eng: Engine) -> list[int]:
    """The padded row counts of every fixed-shape forward the engine made."""
    g = eng.graphs
    keyed = (g.by_rows_selected, g.by_rows_in_forward)
    return [
        *g.by_rows,
        *g.by_rows_observed,
        *g.by_rows_masked,
        *g.by_rows_holed,
        *(k[0] for d in keyed for k in d),
    ]
