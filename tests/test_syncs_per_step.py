"""Host syncs per decode step (`runners.host_syncs.syncs_per_step`): every registered decoder reads the
device once a step (or as its entry in tests/helpers.py says), greedy or sampled, with no blocking copy;
reads made once per generation are not per step; runs whose attention compiles record no count."""

from __future__ import annotations

import math

import pytest
import torch

from core.engine import Engine
from core.sampling import Sampler
from core.types import Counts
from decoders.registry import DECODERS as REGISTERED
from decoders.vanilla import Vanilla
from kv_policies.streaming import StreamingLLM
from runners.host_syncs import HostSyncs, syncs_per_step
from tests.helpers import tiny as tiny_of
from tests.helpers import tiny_policy

pytestmark = pytest.mark.usefixtures("one_thread")


def test_vanilla_greedy_syncs_once_per_step(tiny_lm):
    """Vanilla's one read per step is the token it picks."""
    dec = Vanilla(Engine(tiny_lm.model))
    assert syncs_per_step(dec, list(range(3, 20)), 12, set()) == 1.0


@pytest.mark.parametrize("sampled", [False, True], ids=["greedy", "sampled"])
@pytest.mark.parametrize("fixed_shape", [False, True], ids=["eager", "fixed-shape"])
@pytest.mark.parametrize("name", [n for n in sorted(REGISTERED) if tiny_of(n).syncs is not None])
def test_every_decoder_reads_once_per_step_and_makes_no_blocking_copy(
    tiny_lm, name, fixed_shape, sampled, monkeypatch
):
    """Every registered decoder (its tiny settings, `tests/helpers.py`, under its own policy) reads the
    device as many times a step as its entry says: once (the step's read; FAFO-2forward's two forwards
    once each). A block's ids (and a tree's mask built on the host) reach the device through
    `Engine.stage`; a plain copy of host data to the device (a stream synchronisation on CUDA) would
    count here, also where a fixed-shape forward copies it into its buffers. Sampling reads the same
    (`decoders.sampled_verify`: the walk's probabilities and its last token drawn in advance, read with
    LongSpec's drafted tree; a self-draft's tokens drawn on the device), the checks gathering as on a
    GPU (`sampled_verify.gathers`)."""
    from decoders import sampled_verify
    from kv_policies.registry import build_policy

    eng = Engine(tiny_lm.model)
    if fixed_shape:
        eng.use_graphs(capture=False)
    sampler = Sampler(temperature=1.0, top_p=0.9, seed=0) if sampled else Sampler()
    monkeypatch.setattr(sampled_verify, "GATHER_ON_CPU", True)
    tiny = tiny_of(name)
    dec = tiny.make(eng, build_policy(tiny.policy, **tiny_policy(tiny.policy)), sampler)
    assert syncs_per_step(dec, [5, 6, 7, 8] * 10, 12, set()) == tiny.syncs


def test_sampled_checks_read_the_device_once(monkeypatch):
    """The sampling verifications gather before they walk, as on a GPU: one read for a check (none after)."""
    from decoders import sampled_verify
    from decoders.sampled_verify import CandidateCheck, ChainCheck

    monkeypatch.setattr(sampled_verify, "GATHER_ON_CPU", True)
    dev = torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(9, 12, generator=g), -1)
    sampler = Sampler(temperature=1.0, seed=2)
    cands = [[1, 2], [1, 3], [4, 5], [1, 2]]
    for _ in range(20):
        with HostSyncs(dev) as syncs:
            stage = lambda v: torch.tensor(v)  # noqa: E731
            CandidateCheck(cands, lambda j, t: 1 + 2 * j + t, lambda r: probs[r], sampler, stage, dev).run()
        assert syncs.count == 1
        with HostSyncs(dev) as syncs:
            drafts = sampler.device_draw(probs[1:4])
            ChainCheck(drafts, probs[1:4], probs[4:8], sampler).run()
        assert syncs.count == 1


def test_reads_once_per_generation_after_the_decode_loop_are_not_per_step(tiny_lm):
    """A restricting policy's deferred reads (KV read per step, how much it restricted) happen once, after
    the decode loop: counted apart, so the decode loop's one read per step is what `syncs_per_step` says."""
    dev = torch.device("cpu")
    x = torch.arange(4.0, device=dev)
    with HostSyncs(dev) as syncs:
        x.sum().item()
        syncs.stop()
        x.max().item()
    assert (syncs.count, syncs.after_stop) == (1, 1)
    dec = Vanilla(Engine(tiny_lm.model), kv=StreamingLLM(budget=8, sinks=2))
    events: list[str] = []
    counts = Counts(on_decode_done=lambda: events.append("decode done"), keep_steps=False)
    resolve = counts.resolve
    counts.resolve = lambda: (events.append("resolve"), resolve())  # type: ignore[method-assign]
    dec.generate(list(range(3, 30)), 6, set(), counts)
    assert events == ["decode done", "resolve"] and counts.kv_activity.restricted_frac > 0
    assert syncs_per_step(dec, list(range(3, 30)), 12, set()) == 1.0


def test_no_sync_count_where_attention_compiles(tiny_lm):
    """torch.compile does not run under the counter's dispatch modes: such runs record no count."""
    from kv_policies.registry import build_policy

    dec = Vanilla(Engine(tiny_lm.model), kv=build_policy("streaming", budget=16, backend="flex"))
    assert math.isnan(syncs_per_step(dec, list(range(3, 40)), 8, set()))
