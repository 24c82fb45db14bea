"""The host work a GPU would wait for (runners/critical_path.py): the gaps between forwards split at the
step's read of the device."""

from __future__ import annotations

import time

import pytest
import torch

from core.attention import CausalView
from core.engine import Engine
from core.types import Counts
from decoders.base import BaseDecoder
from decoders.vanilla import Vanilla
from runners.critical_path import READS, ReadStamps, critical_host_s
from runners.timing import DecodeClocks, StepClock, timed_generate

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_gap_waits_from_its_first_read_to_the_next_forward() -> None:
    forwards = [(1.0, 2.0), (5.0, 6.0), (7.0, 8.0), (10.0, 11.0)]
    reads = [
        (1.5, 1.6),  # inside a forward: not a gap's read
        (3.0, 3.5),  # gap 2-5: waits 3.5-5
        (4.0, 4.2),  # a later read of the same gap: already waiting
        (10.5, 10.6),  # inside the last forward
        (11.5, 12.0),  # the tail 11-13: waits 12-13
    ]
    # the first gap (0.5-1, after the prefill's synchronisation) waits whole; gaps 6-7 and 8-10 read nothing
    assert critical_host_s(forwards, reads, 0.5, 13.0) == pytest.approx(0.5 + 1.5 + 1.0)
    assert critical_host_s([], reads, 0.5, 13.0) == pytest.approx(12.5)  # no forward: all after the prefill
    assert critical_host_s(forwards, [], 0.5, 13.0) == pytest.approx(0.5)
    assert critical_host_s([(0.0, 0.4), *forwards], reads, 0.5, 13.0) == pytest.approx(
        3.0
    )  # the prefill's own


def test_read_stamps_see_every_read_form_and_put_the_methods_back() -> None:
    t = torch.tensor([2, 3])
    before = {name: vars(torch.Tensor).get(name) for name in READS}
    with ReadStamps() as stamps:
        t.tolist(), t[0].item(), int(t[0]), float(t[1]), bool(t[0]), [0, 1, 2][t[0]], t.numpy(), t.cpu()
    assert len(stamps.spans) == 8 and all(a <= b for a, b in stamps.spans)
    int(t[0])
    assert len(stamps.spans) == 8
    assert {name: vars(torch.Tensor).get(name) for name in READS} == before


class SleepyDecoder(BaseDecoder):
    """Each step: a forward, `overlapped` seconds of host work before reading its result, `critical`
    seconds after."""

    name = "sleepy"
    lossless = True
    overlapped, critical = 0.02, 0.01

    def _decode(self, prompt, out, max_new_tokens, stop_ids, counts) -> None:
        eng = self.engine
        while len(out) < max_new_tokens:
            tok = torch.tensor([out[-1]], dtype=torch.long)
            view = CausalView(eng.scale)
            _, ids = eng.step(tok, eng.positions(eng.length, 1), view, argmax=True, with_logits=False)
            eng.commit([0])
            time.sleep(self.overlapped)
            out.append(int(ids[0]))
            counts.step(1, 0, 0, 1, eng.length)
            time.sleep(self.critical)


def test_host_work_before_the_read_is_not_waited_for(tiny_lm) -> None:
    eng = Engine(tiny_lm.model)
    dec = SleepyDecoder(eng)
    with DecodeClocks(dec) as clocks:
        timed = timed_generate(dec, list(range(3, 20)), 6, on_prefill_done=clocks.mark)
    steps = clocks.forwards.forwards_since_mark
    assert steps == 5
    assert steps * dec.critical <= clocks.critical_s(timed) < steps * (dec.critical + dec.overlapped / 2)
    assert all(vars(torch.Tensor).get(name) is None for name in ("tolist", "item"))  # put back


def test_the_critical_time_is_part_of_the_host_time_over_the_generations_own_window(tiny_lm) -> None:
    """Work after the generation's clock stopped (here a read and a sleep still inside the block) is in
    neither: the decode window is the clock's, not the block's."""
    eng = Engine(tiny_lm.model)
    dec = Vanilla(eng)
    with DecodeClocks(dec) as clocks:
        timed = timed_generate(dec, list(range(3, 20)), 6, on_prefill_done=clocks.mark)
        torch.zeros(1).tolist()
        time.sleep(0.05)
    assert 0 < clocks.critical_s(timed) <= clocks.host_s(timed) < 0.05


class FakeEvent:
    """A CUDA event stand-in: `record` notes a time; `synchronize` is the one wait, counted."""

    waits = 0

    def __init__(self, enable_timing: bool) -> None:
        assert enable_timing
        self.t = None

    def record(self) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        FakeEvent.waits += 1

    def elapsed_time(self, end: FakeEvent) -> float:
        return 1e3 * (end.t - self.t) + 1.0  # milliseconds, plus a device-only millisecond


def test_forward_times_on_cuda_use_events_and_wait_once_when_read(tiny_lm) -> None:
    """On CUDA a forward is timed by events around it: the host does not wait for the device per forward
    (that would serialise work a GPU overlaps), and the seconds are resolved with one wait when read."""
    eng = Engine(tiny_lm.model)
    with StepClock(eng) as clock:
        clock.times.event = FakeEvent
        FakeEvent.waits = 0
        Vanilla(eng).generate(list(range(3, 20)), 5, set(), Counts(on_prefill_done=clock.mark))
        assert FakeEvent.waits == 0 and len(clock.spans) == 5
        seconds = [s for _, _, s in clock.calls]
        assert FakeEvent.waits == 1 and len(seconds) == 5
        assert all(s > 1e-3 for s in seconds)  # the events' time, not the host's stamps
        assert clock.seconds_since_mark == pytest.approx(sum(seconds[1:])) and FakeEvent.waits == 1
