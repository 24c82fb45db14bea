"""Every decoder x KV policy of the paper experiments on captured fixed-shape forwards: CUDA graphs on a
CUDA device (`make test-gpu`), the capture emulated elsewhere (`tests/emulated_graphs.py`): each
forward is recorded once per shape and cache allocation and then replayed with the Python values of
that first run, as a CUDA graph replays it. The replayed steps give the regular path's tokens, counts,
policy activity and the eager twin's cache contents, and none of the recorded runs waits for the device
or takes a host tensor. A host value taken into a captured run where a device buffer belongs passes
the eager twin (`capture=False`) and fails under the emulation."""

from __future__ import annotations

import inspect
import textwrap
from collections.abc import Callable
from typing import Any

import pytest
import torch

from core import decode_graph
from core.engine import Engine
from tests.emulated_graphs import captured, emulated_capture
from tests.graph_cases import CASES, generate, report, same_cache


@pytest.mark.parametrize("case", sorted(CASES))
def test_replayed_forwards_give_the_regular_path(tiny_lm, case):
    """Captured, the forwards the eager twin runs fixed-shape are recorded once per shape and replayed:
    the generation reports what the regular path reports and leaves the twin's cache."""
    if "kvpress" in case:
        pytest.importorskip("kvpress")
    want, _, plain = generate(tiny_lm.model, case, None)
    _, twin, _ = generate(tiny_lm.model, case, False)
    with captured(tiny_lm.device):
        got, eng, dec = generate(tiny_lm.model, case, True)
    assert got == want
    assert same_cache(eng, twin)  # a compressed region's regular path moves entries: the twin's do not
    assert eng.fixed_shape_steps == twin.fixed_shape_steps > 0 and eng.graphs.captures > 0
    draft = getattr(dec, "draft", None)
    if draft is not None and getattr(draft, "engine", None) is not None:  # TriForce's draft model
        assert draft.engine.graphs is not None and draft.engine.graphs.captures > 0
    if case == "longspec":  # its draft's level steps and commits replay their own `Replay`s
        static = dec.draft.static
        assert static is not None and static.captures > 0 and static.levels
    assert want[0][6].restricted_frac > 0 or plain.kv.lossless  # every restricting policy restricts


def _baking_forward() -> Callable:
    """`StaticForward.forward` with the block's slots from the host's cache length (a Python value):
    right in an eager run, frozen at its first value in a captured one."""
    src = textwrap.dedent(inspect.getsource(decode_graph.StaticForward.forward))
    old, new = "slots = self.length + self.row", "slots = cache.length + self.row"
    assert old in src
    scope: dict[str, Any] = {}
    exec(src.replace(old, new), vars(decode_graph), scope)  # noqa: S102 - a mutant of our own source
    return scope["forward"]


@pytest.mark.parametrize("case", ["vanilla", "lookahead"])
def test_a_host_value_in_a_captured_run_fails_here_not_in_the_eager_twin(tiny_lm, case, monkeypatch):
    """The emulation is what catches it: the eager twin still matches the regular path."""
    want, plain, _ = generate(tiny_lm.model, case, None)
    monkeypatch.setattr(decode_graph.StaticForward, "forward", _baking_forward())
    twin_report, twin, _ = generate(tiny_lm.model, case, False)
    assert twin_report == want and same_cache(twin, plain)
    # the block's entries and positions land where the first step's did: the slots' positions, checked
    # after every generation (tests/conftest.py), are out of order
    with emulated_capture(), pytest.raises(AssertionError, match="out of position order"):
        generate(tiny_lm.model, case, True)


def test_a_captured_run_may_not_wait_for_the_device(tiny_lm, monkeypatch):
    """A read of a device value inside a captured run is refused, naming the operator."""
    forward = decode_graph.StaticForward.forward

    def reads_the_length(self):
        int(self.length)
        return forward(self)

    monkeypatch.setattr(decode_graph.StaticForward, "forward", reads_the_length)
    with emulated_capture(), pytest.raises(AssertionError, match="waits for the device.*item"):
        generate(tiny_lm.model, "vanilla", True)


def _experiments() -> list[Any]:
    """(combo, on a PG-19 window): vanilla+full is in both lists, and runs on MT-Bench."""
    from benchmarks.bench_host_overhead import COMBOS, LONG_COMBOS

    name = lambda c: "+".join(c[:2]) + "".join(c[2][:1])  # noqa: E731
    pairs = [(c, False) for c in COMBOS] + [(c, True) for c in LONG_COMBOS if c[0] != "vanilla"]
    return [pytest.param(c, long, id=name(c)) for c, long in pairs]


@pytest.mark.slow
@pytest.mark.parametrize(("combo", "long"), _experiments())
def test_the_experiments_replay_on_smollm2(smollm, combo, long):
    """The paper experiments' decoder x policy pairs as the benchmark builds them from conf/ (SmolLM2,
    MT-Bench turn 1; the long-context ones on a PG-19 window): captured, they report what the regular
    path reports."""
    from benchmarks.bench_host_overhead import make_decoder
    from runners.config import stop_ids_for
    from tasks.mtbench import MTBench
    from tasks.pg19 import PG19

    decoder, kv, extra = combo
    task = PG19(limit=1, context_length=1024) if long else MTBench(limit=1)
    prompts = [task.prompt_ids(s, 0, [], smollm.tokenizer) for s in task.load()]
    stop = stop_ids_for(smollm.tokenizer, smollm.model)
    reports, engines = [], []
    for capture in (None, True):
        eng = Engine(smollm.model)
        if capture:
            eng.use_graphs(capture=True)
        with captured(smollm.device):
            reports.append(report(make_decoder(decoder, kv, extra, smollm, eng), prompts, 16, stop))
        engines.append(eng)
    assert reports[0] == reports[1]
    assert engines[1].fixed_shape_steps > 0 and engines[1].graphs.captures > 0


def test_a_captured_run_may_not_take_host_tensors(tiny_lm, monkeypatch):
    """A tensor made on the host inside a captured run and used with device tensors is refused: by the
    emulation on a CPU, where host and device are one, and by torch itself on a GPU."""
    forward = decode_graph.StaticForward.forward

    def host_rows(self):
        self.row = torch.arange(self.rows)  # no device: a host tensor on a GPU
        return forward(self)

    monkeypatch.setattr(decode_graph.StaticForward, "forward", host_rows)
    refusal, says = (AssertionError, "takes host tensors into.*add")
    if tiny_lm.device.type == "cuda":
        refusal, says = RuntimeError, "same device"
    with emulated_capture(), pytest.raises(refusal, match=says):
        generate(tiny_lm.model, "vanilla", True)


def test_a_run_on_replayed_forwards_records_what_an_eager_run_does(tmp_path):
    """A whole run on graphed forwards (the warm-up over the task's length, the timed generations, the
    untimed rerun that counts syncs): every sample's output, counts and syncs per step are the eager
    run's, and its decode forwards all took the fixed-shape path."""
    import pandas as pd

    from runners.runner import Runner
    from tests.helpers import make_cfg

    columns = ["output_digest", "forwards", "accepted", "tau", "syncs_per_step", "restricted_frac"]
    records = []
    for graphed in (False, True):
        # one decoder and policy: each pair's replay is the per-case test's; this is the runner's part
        settings = ("decoder=fafo", "kv=streaming", "kv.budget=8", "run.warmup=true", "run.max_new_tokens=12")
        settings = (*settings, "model.dtype=float32")
        runner = Runner(make_cfg(tmp_path / str(graphed), *settings))
        with emulated_capture():
            if graphed:
                runner.engine.use_graphs(capture=True)
            samples = pd.read_parquet(runner.run() / "samples.parquet")
        assert samples["error"].isna().all()
        records.append(samples)
    eager, graphed = records
    pd.testing.assert_frame_equal(eager[columns], graphed[columns])
    assert (graphed["static_frac"] == 1.0).all() and runner.engine.graphs.captures > 0


def test_captures_inside_a_timed_decode_are_recorded_and_noted(tmp_path):
    """Without a warm-up the first timed turn captures its block sizes: the records say how many
    captures each turn's decode time holds (not those of the untimed generations: the sync count, the
    vanilla audit), the end-of-run report notes them, and an eager run records none."""
    import pandas as pd

    from runners.report import capture_note
    from runners.runner import Runner
    from tests.helpers import make_cfg

    settings = ("decoder=fafo", "kv=streaming", "kv.budget=8", "run.warmup=false", "run.max_new_tokens=12")
    for graphed in (False, True):
        runner = Runner(make_cfg(tmp_path / str(graphed), *settings, "model.dtype=float32"))
        with emulated_capture():
            if graphed:
                runner.engine.use_graphs(capture=True)
            samples = pd.read_parquet(runner.run() / "samples.parquet")
        captures = samples["graph_captures"]
        if not graphed:
            assert (captures == 0).all() and capture_note(samples) is None
            continue
        assert captures.iloc[0] > 0 and captures.sum() < runner.engine.graphs.captures
        note = capture_note(samples)
        assert note is not None and f"{captures.sum()} CUDA graph capture(s)" in note
