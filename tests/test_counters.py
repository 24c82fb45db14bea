"""The host counters of every run record: host syncs per step (a dispatch-level counter that works on a
CPU), the share of decode forwards that take the fixed-shape path, host milliseconds per forward outside
the target's and the draft model's forwards; older records without them still load."""

from __future__ import annotations

import contextlib
import math

import pandas as pd
import pytest
import torch

from analysis.load import HOST_COLUMNS, load_samples
from core.engine import Engine
from core.sampling import Sampler
from core.types import Counts, DeviceReads
from decoders.vanilla import Vanilla
from kv_policies.streaming import StreamingLLM
from runners.forwards import MethodPatch
from runners.host_syncs import HostSyncs, forwards_apart
from runners.runner import Runner
from runners.timing import DraftClock, StepClock, timed_generate
from tests.helpers import make_cfg

pytestmark = pytest.mark.usefixtures("one_thread")


def test_counts_item_calls_and_other_reads_of_device_tensors():
    dev = torch.device("cpu")
    x = torch.arange(8.0, device=dev)  # made before counting: a device tensor
    with HostSyncs(dev) as syncs:
        for i in range(5):
            x[i].item()
    assert syncs.count == 5
    with HostSyncs(dev) as syncs:
        int(x.argmax())  # 1
        bool(x[1] > 0)  # 2
        x.tolist()  # 3
        x[x > 3]  # 4: a boolean mask's output shape is its data
        x.nonzero()  # 5
        x.argmax(-1).cpu().tolist()  # 6: the copy to the host; reading the host copy is free
        torch.tensor([x[0], x[1]])  # 7
        syncs.mark()
        x + 1
        x[torch.tensor([0, 2])]
        torch.where(x > 3, x, 0)
    assert (syncs.count, syncs.since_mark) == (7, 0)


def test_a_host_tensor_indexed_by_a_tensor_made_before_counting_stays_on_the_host():
    """A layout's index tensors are made once and reused (before counting started): indexing a host
    tensor with them still reads host data; indexing a device tensor with them does not."""
    dev = torch.device("cpu")
    rows = torch.tensor([[0, 2], [1, 3]])  # made before counting: the counter cannot tell where it lives
    x = torch.arange(8, device=dev)
    with HostSyncs(dev) as syncs:
        preds = x.argmax(-1, keepdim=True).expand(4).cpu()  # 1: the one read
        picked = preds[rows]
        int(picked[0, 0]), picked.tolist(), int(preds.index_select(0, rows[0])[1])
        assert syncs.count == 1
        int(x[rows][0, 0])  # the device tensor's rows: waits
    assert syncs.count == 2


def test_launches_count_device_operators_outside_the_forwards(tiny_lm):
    """Computing operators on device tensors outside `engine.step` count as launches; views, host
    tensors and everything inside the forward do not. Vanilla launches a handful per step (its argmax
    and the staging of its next token), far fewer than one forward's operators."""
    dev = torch.device("cpu")
    x = torch.arange(8.0, device=dev)
    with HostSyncs(dev) as syncs:
        y = x + 1  # 1
        y.view(2, 4)[0].unsqueeze(0)  # views: no kernel
        x.argmax()  # 2
        torch.arange(4) * 2  # host tensors
        torch.empty(3, device=dev)  # an allocation: no kernel fills it
        torch.zeros(3, device=dev)  # 3: a fill
    assert syncs.launches == 3
    dec = Vanilla(Engine(tiny_lm.model))
    prompt = list(range(3, 20))
    per_step = {}
    for apart in (False, True):
        syncs = HostSyncs(dev)
        counts = Counts(on_prefill_done=syncs.mark, keep_steps=False)
        with syncs, forwards_apart(syncs, dec) if apart else contextlib.nullcontext():
            dec.generate(prompt, 8, set(), counts)
        per_step[apart] = syncs.launches_since_mark / counts.forwards
    assert 0 < per_step[True] <= 8 and per_step[False] > 5 * per_step[True]  # a tiny two-layer model
    assert "step" not in vars(dec.engine)  # unwrapped


def test_host_tensors_read_for_free_on_a_cpu():
    """What a GPU run keeps on the host (no `device` named, or `.cpu()`'s copy) never waits there."""
    dev = torch.device("cpu")
    with HostSyncs(dev) as syncs:
        keep = torch.as_tensor([0, 1, 2])
        keep.min().item()
        torch.equal(keep, torch.arange(3))
        (torch.arange(5) > 2).nonzero().tolist()
        mask = torch.zeros(3, 3, dtype=torch.bool)
        mask[1] = mask[0]
        mask[1, 1] = True  # the Python value becomes a host tensor: no copy from the device
        assert syncs.count == 0
        torch.tensor([3, 4]).to(dev)[0].item()  # a blocking copy to the device (1), then read: waits (2)
        torch.arange(4, device=dev).sum().item()  # 3
    assert syncs.count == 3


def test_blocking_copies_to_the_device_count_and_staged_ones_do_not():
    """On CUDA a copy of host data to the device without `non_blocking` synchronises the stream; a
    Python value written into a device tensor, and `Engine.stage`'s copy, do not."""
    dev = torch.device("cpu")
    buffer = torch.zeros(4, dtype=torch.long, device=dev)
    engine = Engine.__new__(Engine)
    engine.device = dev
    with HostSyncs(dev, trace=True) as syncs:
        torch.tensor([1, 2], device=dev)  # 1
        torch.as_tensor([1, 2], dtype=torch.long, device=dev)  # 2
        buffer[:2].copy_(torch.tensor([5, 6]))  # 3
        buffer[0] = 7  # a Python value: a fill, no copy
        torch.tensor([1, 2]).to(dev, non_blocking=True)
        staged = engine.stage([3, 4])
        buffer[2:].copy_(staged)
        assert syncs.count == 3
        staged.sum().item()  # staged is a device tensor: reading it waits
    assert syncs.count == 4 and torch.equal(buffer, torch.tensor([7, 6, 3, 4]))


def test_static_frac_is_one_for_vanilla_and_the_staged_policies_and_less_where_a_region_moves_entries(
    tiny_lm,
):
    from kv_policies.registry import build_policy

    eng = Engine(tiny_lm.model)
    prompt = list(range(3, 40))

    def static_frac(dec: Vanilla) -> float:
        with StepClock(eng) as clock:
            timed_generate(dec, prompt, 24, on_prefill_done=clock.mark)
        assert clock.forwards_since_mark == 23
        return clock.static_frac_since_mark

    assert static_frac(Vanilla(eng)) == 1.0
    streaming = StreamingLLM(budget=16, sinks=4)  # the cache outgrows it at once: one fixed selection
    assert static_frac(Vanilla(eng, kv=streaming)) == 1.0
    quest = build_policy("quest", budget=16, page_size=8, dense_layers=0)  # chosen inside the forward
    assert static_frac(Vanilla(eng, kv=quest)) == 1.0
    topk = build_policy("topk", budget=16)  # exact top-k of this forward's scores: inside it too
    assert static_frac(Vanilla(eng, kv=topk)) == 1.0
    region = build_policy("streaming", budget=16, sinks=4, backend="sliced")  # gathered under graphs
    assert static_frac(Vanilla(eng, kv=region)) == 1.0
    region = build_policy("quest", budget=16, page_size=8, dense_layers=0, backend="sliced")  # moves
    assert static_frac(Vanilla(eng, kv=region)) < 1.0
    assert eng.graphs is None  # counted without graphs, nothing changed in what ran


def test_draft_clock_times_the_draft_forwards_after_the_mark_and_unwraps():
    class Draft:
        FORWARDS = ("step",)

        def step(self, n: int) -> int:
            return self.inner(n) if n > 1 else n

        def inner(self, n: int) -> int:
            return self.step(n - 1)  # nested: timed once, by the outer call

    class Decoder:
        draft = Draft()

    dec = Decoder()
    with DraftClock(dec, torch.device("cpu")) as clock:
        dec.draft.step(1)
        clock.mark()
        assert dec.draft.step(3) == 1
    assert len(clock.seconds_each) == 2 and clock.seconds_since_mark == clock.seconds_each[1] > 0
    assert "step" not in vars(dec.draft)
    with DraftClock(object(), torch.device("cpu")) as none:  # no draft model: nothing to time
        assert none.seconds_since_mark == 0


def test_method_patches_nest_and_undo_to_what_was_there():
    """A patch over another (a counter around a clock) undoes to the clock's wrapper, then to the class's
    method; both wrap the call they replaced."""

    class Model:
        def step(self, x: int) -> int:
            return x + 1

    m, calls = Model(), []

    def tag(name):
        def wrap(fn):
            def wrapped(x):
                calls.append(name)
                return fn(x)

            return wrapped

        return wrap

    clock = MethodPatch([(m, "step")], tag("clock"))
    counter = MethodPatch([(m, "step")], tag("counter"))
    assert m.step(1) == 2 and calls == ["counter", "clock"]
    counter.undo()
    assert m.step(1) == 2 and calls == ["counter", "clock", "clock"]
    clock.undo()
    assert "step" not in vars(m) and m.step(1) == 2 and len(calls) == 3


def test_draft_clock_times_every_forward_of_triforce_draft_model(tiny_lm):
    """Greedy or sampling, every forward of TriForce's draft model is timed as the draft's, once."""
    from decoders.draft_model import DraftModel
    from decoders.triforce import TriForce
    from kv_policies.registry import build_policy

    prompt = list(range(3, 40))
    for sampler in (Sampler(), Sampler(temperature=0.8, seed=1)):
        eng = Engine(tiny_lm.model)
        draft = DraftModel(eng.truncated(1), "self-1", eng.w.vocab_size, budget=24, sinks=4, room=12)
        dec = TriForce(eng, kv=build_policy("streaming", budget=24), sampler=sampler, draft=draft)
        counts = Counts()
        with DraftClock(dec, eng.device) as clock:
            dec.generate(prompt, 16, set(), counts)
        assert len(clock.seconds_each) == counts.draft_model_forwards > 0


def test_run_records_the_host_counters(tmp_path):
    path = Runner(make_cfg(tmp_path)).run()
    samples = pd.read_parquet(path / "samples.parquet")
    assert (samples["static_frac"] == 1.0).all() and (samples["syncs_per_step"] == 1.0).all()
    assert (samples["draft_forward_s"] == 0).all() and samples["draft_static_frac"].isna().all()
    host = samples["host_ms_per_forward"]
    assert host.map(math.isfinite).all() and (host >= 0).all()
    expected = (samples["decode_s"] - samples["forward_s"]) / samples["forwards"] * 1e3
    assert host.to_numpy() == pytest.approx(expected.to_numpy())
    critical = samples["critical_ms_per_forward"]  # the part after each step's read
    assert critical.map(math.isfinite).all() and (critical > 0).all() and (critical <= host).all()


def test_triforce_run_times_its_draft_model_and_can_skip_the_sync_count(tmp_path):
    overrides = ("decoder=triforce", "draft=tiny", "kv=streaming", "kv.budget=8", "run.count_syncs=0")
    cfg = make_cfg(tmp_path, *overrides)
    samples = pd.read_parquet(Runner(cfg).run() / "samples.parquet")
    assert (samples["draft_forward_s"] > 0).all() and samples["syncs_per_step"].isna().all()
    # the verification and the streaming middle level take the fixed-shape forward, the draft model's
    # steps their own
    assert (samples["static_frac"] == 1).all() and (samples["host_ms_per_forward"] >= 0).all()
    assert (samples["draft_static_frac"] == 1).all()
    assert (samples["draft_forward_s"] + samples["forward_s"] < samples["decode_s"]).all()


def test_records_without_the_host_counters_still_load(tmp_path):
    path = Runner(make_cfg(tmp_path, "run.count_syncs=0")).run()
    old = pd.read_parquet(path / "samples.parquet").drop(columns=list(HOST_COLUMNS))
    old.to_parquet(path / "samples.parquet", index=False)
    samples = load_samples(tmp_path)
    assert len(samples) == len(old) and samples[list(HOST_COLUMNS)].isna().all().all()


def test_the_counting_generation_reproduces_the_timed_one(tiny_lm):
    """The untimed counting pass runs the same decode (same tokens) as the timed generation."""
    dec = Vanilla(Engine(tiny_lm.model))
    prompt = list(range(3, 20))
    timed = dec.generate(prompt, 10, set(), Counts())
    with HostSyncs(dec.engine.device):
        counted = dec.generate(prompt, 10, set(), Counts())
    assert counted == timed


def test_host_overhead_benchmark_names_existing_configs():
    from benchmarks.bench_host_overhead import COMBOS, LONG_COMBOS, REPO, Method, backend_of

    for combos in (COMBOS, LONG_COMBOS):
        assert combos[0][:2] == ("vanilla", "full")  # the ratios' reference runs first
        for decoder, kv, _ in combos:
            assert (REPO / "conf" / "decoder" / f"{decoder}.yaml").exists(), decoder
            assert (REPO / "conf" / "kv" / f"{kv}.yaml").exists(), kv
        names = [Method(d, k, None, backend=backend_of(extra)).name for d, k, extra in combos]
        assert len(set(names)) == len(names)  # the timing tables are keyed by name


def test_draft_clock_times_a_longspec_draft_and_leaves_the_output_alone(tiny_lm):
    from decoders.longspec.decoder import LongSpec

    prompt = list(range(10, 30))
    ref = Vanilla(Engine(tiny_lm.model)).generate(prompt, 12, set(), Counts())
    eng = Engine(tiny_lm.model)
    dec = LongSpec(eng, depth=2, widths=[1, 1], checkpoint="random", window=8)
    with StepClock(eng) as forwards, DraftClock(dec, eng.device) as drafts:
        timed = timed_generate(dec, prompt, 12, on_prefill_done=lambda: (forwards.mark(), drafts.mark()))
    assert timed.output == ref and drafts.seconds_since_mark > 0
    assert forwards.seconds_since_mark + drafts.seconds_since_mark < timed.decode_s
    assert not {"step", "commit"} & set(vars(dec.draft))  # the draft's own methods again


def test_deferred_reads_are_each_the_rounded_mean_of_their_layers():
    """A view's KV read stays on the device per layer; when the generation ends `Counts` takes each
    one's rounded mean (ints and 0-d tensors as they are), in the order the steps came."""
    counts = Counts()
    reads = [torch.tensor(5), torch.tensor([3, 4]), 7, torch.tensor([1, 2, 3]), torch.tensor([[10, 13]])]
    for r in reads[:3]:
        counts.step(1, 0, 0, 1, r)
    for r in reads[3:]:
        counts.draft_step(r)
    counts.resolve()
    assert [s.kv_attended for s in counts.steps] == [5, 4, 7, 2, 12]  # round half to even: 3.5 -> 4
    assert counts.kv_attended == 30 and not counts._deferred


def test_device_reads_add_the_tail_before_rounding():
    """A draft row's read is its layers' mean plus the tail every layer reads (`DeviceReads`): added
    before the rounding, so the read is the one a tensor with the tail added in would give."""
    counts = Counts()
    per_layer = torch.tensor([2, 3])  # mean 2.5
    for plus in (0, 1, 2):
        counts.draft_step(DeviceReads(per_layer, plus))
        counts.draft_step(per_layer + plus)  # the same read as one tensor
    counts.resolve()
    reads = [s.kv_attended for s in counts.steps]
    assert reads == [2, 2, 4, 4, 4, 4]  # half to even: 2.5 -> 2, 3.5 -> 4, 4.5 -> 4
    assert counts.kv_attended == sum(reads)


def test_a_drafts_rounds_reuse_the_policys_selection(tiny_lm):
    """Self-speculation's draft steps of one verification select over the same entries: the stacked
    selections of a query-free policy and StreamingLLM's window are made once, not once per round."""
    from kv_policies.registry import build_policy

    eng = Engine(tiny_lm.model)
    eng.reset(80)
    eng.prefill(list(range(3, 63)))
    retrieval = build_policy("retrieval", budget=24, chunk=4)
    retrieval.attach(eng)
    keep = {0: torch.ones(eng.cache.n_kv_heads, 40, dtype=torch.bool, device=eng.device)}
    first = retrieval.keep_stack.select(keep, 50)
    assert (
        retrieval.keep_stack.select(keep, 50) is first and retrieval.keep_stack.select(keep, 51) is not first
    )
    retrieval.keep_stack.forget()
    assert retrieval.keep_stack.select(keep, 51) is not first
    window = StreamingLLM(budget=16, sinks=4)
    window.attach(eng)
    sel, kept = window.fixed_selection(50)
    assert window.fixed_selection(50)[0] is sel and kept == 16 and int(sel.sum()) == 16
    assert window.fixed_selection(51)[0] is not sel


@pytest.mark.parametrize("layers", [(2, 3, 4, 5), (1, 3), (0, 2, 5)])
def test_keep_masks_stack_in_one_copy_and_as_layer_by_layer(layers):
    """`stack_masks`: each layer's mask over its first positions and True elsewhere, whether the masks
    are copied in one operator (one width on consecutive layers) or layer by layer (widths 5 and 7, or
    gaps between the layers)."""
    from kv_policies.stacking import stack_masks

    gen = torch.Generator().manual_seed(len(layers))
    widths = {layer: 7 if layers == (1, 3) and layer == 3 else 5 for layer in layers}
    keep = {layer: torch.rand(2, widths[layer], generator=gen) > 0.5 for layer in layers}
    syncs = HostSyncs("cpu")
    with syncs:
        got = stack_masks(keep, (6, 2, 9), torch.device("cpu"))  # as the cache names its device
    want = torch.ones(6, 2, 9, dtype=torch.bool)
    for layer, mask in keep.items():
        want[layer, :, : mask.shape[1]] = mask
    assert torch.equal(got, want)
    assert syncs.launches == (3 if layers == (2, 3, 4, 5) else 1 + len(layers))


def test_a_forward_noted_for_every_layer_at_once_sums_like_per_layer_notes():
    """`note_layers` (one forward, every layer alike) is `note` for each layer in turn, also between
    per-layer forwards."""
    from kv_policies.activity import SelectionActivity

    per_layer, at_once = SelectionActivity(), SelectionActivity()
    for visible, cache_len in [(10, 40), (40, 40), (7, 50)]:
        for layer in range(3):
            per_layer.note(layer, visible, cache_len)
        at_once.note_layers(3, visible, cache_len)
        per_layer.note(0, 5, 10)  # a forward noted layer by layer between them
        at_once.note(0, 5, 10)
    want, got = per_layer.summary(8), at_once.summary(8)
    assert got.restricted_frac == want.restricted_frac == 5 / 8
    assert got.visible_frac == pytest.approx(want.visible_frac)


@pytest.mark.parametrize("policy", ["streaming", "retrieval"])
def test_a_drafts_rows_after_its_first_launch_nothing_of_their_own(tiny_lm, policy):
    """Self-speculation's draft rows share one selection, report their reads without an operator
    (`DeviceReads`) and feed each other's argmax tensor itself: between two one-row draft forwards the
    decoder launches nothing, so its launches per step do not grow with gamma."""
    from decoders.selfspec import SelfSpeculative
    from kv_policies.registry import build_policy

    eng = Engine(tiny_lm.model)
    extra = {"chunk": 4} if policy == "retrieval" else {"sinks": 4}
    dec = SelfSpeculative(eng, kv=build_policy(policy, budget=24, **extra), gamma=5)
    syncs = HostSyncs(eng.device)
    between: list[int] = []  # launches from the end of one draft row's forward to the next one's start
    with syncs, forwards_apart(syncs, dec):
        inner, last = eng.step, None

        def step(tokens, *args, **kwargs):
            nonlocal last
            if tokens.numel() == 1 and last is not None:
                between.append(syncs.launches - last)
            out = inner(tokens, *args, **kwargs)
            last = syncs.launches if tokens.numel() == 1 else None
            return out

        eng.step = step
        try:
            counts = Counts(keep_steps=False)
            dec.generate(list(range(3, 63)), 16, set(), counts)
        finally:
            eng.step = inner
    assert counts.kv_activity.restricted_frac > 0  # the policy restricted the drafts
    assert len(between) >= 8 and set(between) == {0}
