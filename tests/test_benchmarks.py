"""The benchmark scripts' building blocks (their timings are not tested: speed claims are benchmarks)."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.bench_fafo import Tally, custom_fafo, spread
from core.cost_curve import step_seconds
from core.engine import Engine
from decoders.fafo.decoder import FAFO


def test_block_step_leaves_the_cache_as_it_was(tiny_lm):
    eng = Engine(tiny_lm.model)
    eng.reset(64)
    eng.prefill(list(range(3, 23)))
    for rows in (1, 5):
        assert step_seconds(eng, 20, rows, reps=2) > 0
        assert eng.length == 20


def test_custom_fafo_row_parses_types_and_builds_the_decoder(tiny_lm):
    name, spec, group, make = custom_fafo("k=4 n=1 m=2 tree=true kv=quest budget=32")
    assert (name, group) == ("FAFO-quest", "custom")
    dec = make(Engine(tiny_lm.model))
    assert isinstance(dec, FAFO)
    assert (dec.k, dec.n, dec.m, dec.tree) == (4, 1, 2, True)
    assert dec.kv.name == "quest" and dec.kv.budget == 32


def test_custom_fafo_rejects_a_bare_word():
    with pytest.raises(SystemExit, match="key=value"):
        custom_fafo("k=3 tree")


def test_speedup_per_repeat_and_its_spread():
    base, method = Tally("vanilla", "-", "baseline"), Tally("m", "-", "cpu")
    base.rep_decode, method.rep_decode = [4.0, 6.0, 3.0], [2.0, 4.0, 3.0]
    assert method.speedups(base) == [2.0, 1.5, 1.0]
    assert spread(method.speedups(base)) == "1.50 [1.00-2.00]"
    assert spread([1.234]) == "1.23"


def test_benchmark_output_is_written_with_its_environment(tmp_path, monkeypatch, capsys):

    from benchmarks.output import recorded

    monkeypatch.setenv("HARNESS_BENCH_OUT", str(tmp_path))
    monkeypatch.setattr("sys.argv", ["bench_x", "--reps", "3"])
    with recorded("bench_x"):
        print("| B | cost |\n| 1 | 1.00 |")
    assert "| 1 | 1.00 |" in capsys.readouterr().out  # still printed
    md = next(tmp_path.glob("*/bench_x.md")).read_text()
    assert "python -m benchmarks.bench_x --reps 3" in md and "| 1 | 1.00 |" in md and "cpu_flags" in md
    blob = json.loads(next(tmp_path.glob("*/bench_x.json")).read_text())
    assert blob["output"] == ["| B | cost |", "| 1 | 1.00 |"] and blob["environment"]["threads"] >= 1
    with recorded("bench_x-model-b", module="benchmarks.bench_x"):  # an output named apart from its module
        print("y")
    md = next(tmp_path.glob("*/bench_x-model-b.md")).read_text()
    assert "`python -m benchmarks.bench_x --reps 3`" in md
    monkeypatch.setenv("HARNESS_BENCH_OUT", "none")
    with recorded("bench_y"):
        print("x")
    assert not list(tmp_path.glob("*/bench_y.md"))


def test_benchmark_records_the_code_version_it_started_with(tmp_path, monkeypatch):
    """Files edited while a benchmark runs do not change the version its output names."""

    from benchmarks import output
    from runners import provenance

    monkeypatch.setenv("HARNESS_BENCH_OUT", str(tmp_path))
    monkeypatch.setattr(provenance, "git_sha", lambda repo: "v-start")
    with output.recorded("bench_z"):
        monkeypatch.setattr(provenance, "git_sha", lambda repo: "v-later")
        print("x")
    blob = json.loads(next(tmp_path.glob("*/bench_z.json")).read_text())
    assert blob["environment"]["code_version"] == "v-start"


def test_block_cost_curve_is_measured_once_then_cached(tiny_lm, tmp_path, monkeypatch):
    import argparse

    from benchmarks import block_cost
    from core import cost_curve

    monkeypatch.setenv("HARNESS_COST_CACHE", str(tmp_path))
    monkeypatch.setattr(block_cost, "load_model", lambda *a, **k: tiny_lm)
    # the cache is under test, not the clock: steady step times, so a busy test machine (the suite
    # runs on two workers) cannot make the noise check refuse the curve
    monkeypatch.setattr(
        cost_curve, "step_times", lambda eng, ctx, rows, reps: [1e-3 * (1 + rows) + 1e-6 * ctx] * reps
    )
    args = argparse.Namespace(
        model="tiny", dtype="float32", device="cpu", linear="aten", threads=1, rows=[1, 3],
        contexts=[8, 16], reps=1, refresh=False, cuda_graphs=False,
    )  # fmt: skip
    curve, path, cached = block_cost.curve_for(args, "cpu: Test CPU")
    assert not cached and path.parent == tmp_path and path.exists()
    assert len(curve.seconds) == 2 and all(len(line) == 2 and min(line) > 0 for line in curve.seconds)
    from analysis.cost_model import shape_of

    assert shape_of(curve).n_layers == tiny_lm.model.config.num_hidden_layers
    again, _, cached = block_cost.curve_for(args, "cpu: Test CPU")
    assert cached and again == curve
    args.refresh = True
    assert not block_cost.curve_for(args, "cpu: Test CPU")[2]
    args.refresh, args.rows = False, [1, 2, 4]  # another grid is measured, not read from the cache
    assert not block_cost.curve_for(args, "cpu: Test CPU")[2]


def test_bandwidth_share_pairs_each_bandwidth_read_with_its_own_step(tiny_lm, monkeypatch):
    """The share of the bandwidth limit is the median of per-repeat ratios (bandwidth and vanilla step
    measured back to back), for vanilla's own 1-row step over a cache of each size; the cache is
    left at that size."""
    from analysis.cost_model import ModelShape
    from benchmarks import block_cost
    from core.engine import Engine

    reads = iter([10e9, 20e9, 40e9, 10e9, 20e9, 40e9])
    monkeypatch.setattr(block_cost, "read_bandwidth", lambda **k: next(reads))
    steps = iter([0.5, 0.5, 0.5, 0.25, 0.25, 0.25])
    fake_step = lambda eng, ctx, rows, reps: next(steps) if reps == 15 else 1  # noqa: E731 (warm-up: reps 5)
    monkeypatch.setattr(block_cost, "step_seconds", fake_step)
    eng = Engine(tiny_lm.model)
    shape = ModelShape.from_hf_config(tiny_lm.model.config)
    rows = block_cost.bandwidth_share(eng, shape, [8, 16], 4, repeats=3)
    assert [r["cache"] for r in rows] == [8, 16] and eng.length == 16
    for r, step in zip(rows, (0.5, 0.25)):
        need = shape.weight_bytes(4) + r["cache"] * shape.kv_bytes_per_entry(4)
        assert r["share"] == pytest.approx(need / 20e9 / step)
        assert r["share_min"] == pytest.approx(need / 40e9 / step)
        assert r["share_max"] == pytest.approx(need / 10e9 / step)
        assert r["gb_s"] == pytest.approx(20.0) and r["step_ms"] == pytest.approx(step * 1e3)


def test_one_row_step_seconds_leaves_the_cache_as_it_was(tiny_lm):
    from core.engine import Engine

    eng = Engine(tiny_lm.model)
    eng.reset(40)
    eng.prefill(list(range(5, 25)))
    k = eng.cache.k[:, :, :20].clone()
    assert step_seconds(eng, 20, 1, 3) > 0
    assert eng.length == 20 and torch.equal(eng.cache.k[:, :, :20], k)


def test_bench_block_auto_prices_the_blocks_a_method_ran():
    """bench_block_auto's prediction: vanilla's 1-row steps for the committed tokens over the forwards
    run, each priced at its own cache length."""
    from types import SimpleNamespace

    from benchmarks.bench_block_auto import priced

    steps = [SimpleNamespace(block_tokens=4, committed=3), SimpleNamespace(block_tokens=1, committed=1)]
    num, den = priced(steps, 10, lambda rows, ctx: rows * (1 + ctx / 100))
    assert num == pytest.approx(1.10 + 1.11 + 1.12 + 1.13)  # 1-row steps at contexts 10..13
    assert den == pytest.approx(4 * 1.10 + 1.13)


def test_step_clock_records_every_forward_and_returns_its_logits(tiny_lm):
    from benchmarks.timing import StepClock
    from core.types import Counts
    from decoders.vanilla import Vanilla

    eng = Engine(tiny_lm.model)
    ref = Vanilla(Engine(tiny_lm.model)).generate([5, 6, 7], 6, set(), Counts())
    clock = StepClock(eng)
    assert Vanilla(eng).generate([5, 6, 7], 6, set(), Counts()) == ref
    assert [(rows, length) for rows, length, _ in clock.calls] == [(3, 0)] + [(1, 3 + i) for i in range(5)]
    assert all(s > 0 for _, _, s in clock.calls)


def test_longspec_forward_clock_times_decode_forwards_and_restores_the_engine(tiny_lm):
    """bench_longspec: only forwards after the prefill count, the draft's apart from the target's; the
    output is unchanged and the engine's own `step` is back afterwards."""
    from benchmarks.bench_longspec import measure
    from core.types import Counts
    from decoders.longspec.decoder import LongSpec
    from decoders.vanilla import Vanilla

    eng = Engine(tiny_lm.model)
    prompt = list(range(10, 30))
    ref = Vanilla(Engine(tiny_lm.model)).generate(prompt, 12, set(), Counts())
    dec = LongSpec(eng, depth=2, widths=[1, 1], checkpoint="random", window=8)
    out, counts, secs, clock = measure(eng, dec, prompt, 12)
    assert out == ref and secs > 0
    assert clock.target_n == counts.forwards and clock.draft_n == counts.draft_model_forwards > 0
    assert clock.target_s > 0 and clock.draft_s > 0
    assert "step" not in vars(eng)  # the wrapper is gone: Engine.step again


def test_block_auto_repeat_runs_each_method_over_all_prompts_rotating_the_first(tiny_lm):
    """bench_block_auto: a repeat runs one method over every prompt before the next (the runner's
    order), starts at method `rotation`, and counts outputs equal to vanilla's (the first method)."""
    from benchmarks.bench_block_auto import run_repeat
    from decoders.pld import PromptLookup
    from decoders.vanilla import Vanilla

    eng = Engine(tiny_lm.model)
    order: list[str] = []

    def logged(name, dec):
        inner = dec.generate

        def generate(*args, **kwargs):
            order.append(name)
            return inner(*args, **kwargs)

        dec.generate = generate
        return name, dec

    decoders = [logged("vanilla", Vanilla(eng)), logged("pld", PromptLookup(eng))]
    prompts = [("a", list(range(5, 25))), ("b", list(range(30, 44)) * 2)]
    cells = run_repeat(eng, decoders, prompts, 10, set(), lambda rows, ctx: float(rows), rotation=1)
    assert order == ["pld", "pld", "vanilla", "vanilla"]
    assert cells["pld"].exact == cells["vanilla"].exact == 2 and cells["pld"].runs == 2
    assert cells["vanilla"].pred_num == cells["vanilla"].pred_den > 0


def test_forward_prices_orders_time_the_same_forwards(tiny_lm):
    """forward_prices: the grouped and interleaved orders run the same (method, prompt) pairs, so each
    method's decode forwards are the same (rows, cache length) pairs in both."""
    from benchmarks.forward_prices import run_order
    from benchmarks.timing import StepClock
    from decoders.pld import PromptLookup
    from decoders.vanilla import Vanilla

    eng = Engine(tiny_lm.model)
    decoders = [("vanilla", Vanilla(eng)), ("pld", PromptLookup(eng))]
    prompts = [list(range(5, 25)), list(range(30, 44)) * 2]
    clock = StepClock(eng)
    grouped = run_order("grouped", decoders, prompts, 8, set(), clock)
    interleaved = run_order("interleaved", decoders, prompts, 8, set(), clock)
    for name in ("vanilla", "pld"):
        assert [c[:2] for c in grouped[name].steps] == [c[:2] for c in interleaved[name].steps]
        assert grouped[name].decode > 0 and interleaved[name].decode > 0
    assert len(grouped["vanilla"].steps) == 2 * 7  # 8 tokens: 7 decode forwards per prompt


def test_timed_generate_splits_at_the_last_prefill_mark_and_always_finishes(tiny_lm):
    """benchmarks.timing: prefill seconds end at the decoder's last prefill mark, decode seconds run from
    there; the hooks run (on_finish also when generation raises); a decoder that never marks its
    prefill is refused instead of timed wrong."""
    from benchmarks.timing import timed_generate
    from core.types import Counts
    from decoders.vanilla import Vanilla

    eng = Engine(tiny_lm.model)
    ref = Vanilla(Engine(tiny_lm.model)).generate([5, 6, 7], 6, set(), Counts())
    events: list[str] = []
    timed = timed_generate(
        Vanilla(eng), [5, 6, 7], 6, on_prefill_done=lambda: events.append("prefill"),
        on_finish=lambda: events.append("finish"),
    )  # fmt: skip
    assert timed.output == ref and timed.counts.forwards == 5 and events == ["prefill", "finish"]
    assert timed.prefill_s > 0 and timed.decode_s > 0
    assert timed.wall_s == pytest.approx(timed.prefill_s + timed.decode_s)

    class Unmarked(Vanilla):
        def generate(self, prompt, new, stop, counts):
            return list(prompt)

    with pytest.raises(RuntimeError, match="never reported the end of its prefill"):
        timed_generate(Unmarked(eng), [5, 6], 2)

    class Failing(Vanilla):
        def generate(self, prompt, new, stop, counts):
            counts.prefill_done(len(prompt))
            raise ValueError("boom")

    events.clear()
    with pytest.raises(ValueError, match="boom"):
        timed_generate(Failing(eng), [5, 6], 2, on_finish=lambda: events.append("finish"))
    assert events == ["finish"]


def test_block_auto_share_ablation_builds_fafo_at_each_share_and_is_written_apart(tiny_lm, capsys):
    from benchmarks.bench_block_auto import Cell, output_name, report, share_methods

    eng = Engine(tiny_lm.model)
    made = [(name, make(eng)) for name, make in share_methods([0.01, 0.3])]
    assert [n for n, _ in made][:2] == ["vanilla", "pld auto"]
    assert [d.generator_share for _, d in made[2:]] == [0.01, 0.3]
    assert all(d.block == "auto" for _, d in made[1:])
    assert output_name(["--fafo-shares", "0.01"]) == "bench_block_auto-shares"
    assert output_name(["--fafo-shares=0.01"]) == "bench_block_auto-shares"
    assert output_name(["--repeats", "3"]) == "bench_block_auto"
    cell = Cell(decode=2.0, committed=10, forwards=5, rows=5, exact=1, runs=1)
    report("t", [{"vanilla": cell, "pld auto": Cell(decode=1.0, committed=10, forwards=5, rows=5)}])
    assert "vs pld auto" in capsys.readouterr().out


@pytest.mark.parametrize("fixed_shape", [False, True])
def test_profile_decoder_splits_step_time_and_restores_the_engine(tiny_lm, capsys, fixed_shape):
    """The operator table and the Python table of the decode loop, whose model body (an eager step, or a
    fixed-shape forward's graph) is left out of the Python one; the engine is left as it was."""
    from benchmarks.profile_decoder import profile_one
    from core.decode_graph import StaticForward, StaticForwards

    eng = Engine(tiny_lm.model)
    if fixed_shape:
        eng.use_graphs(capture=False)
    classes = StaticForwards.__call__, StaticForward.forward
    prompt = list(range(10, 40)) * 2
    profile_one("lookahead", eng, [prompt[:20], prompt], 12, set(), top=40)
    out = capsys.readouterr().out
    assert "#### lookahead:" in out and "% inside Engine.step" in out and "aten::" in out
    python = out.split("Python and C calls")[1]
    assert "decoders/lookahead.py" in python and "| all |" in python
    assert ("decode_graph.py" in python) == fixed_shape  # the staging of a fixed-shape step
    body = ("layers_forward", "lm_logits", "_nn.linear", "scaled_dot_product_attention", "rms_norm")
    assert not [name for name in body if name in python]
    assert "step" not in vars(eng)  # the clock and the switch are gone
    assert (StaticForwards.__call__, StaticForward.forward) == classes


def test_forward_kernels_profiles_fixed_shape_forwards_at_each_block_size(tiny_lm):
    """One column per block size, every profiled step on the fixed-shape path, the cache left at the
    context after each (nothing of the profiled blocks is kept)."""
    from benchmarks.forward_kernels import table

    eng = Engine(tiny_lm.model)
    eng.use_graphs(capture=False)
    text = table(eng, [1, 4], context=12, reps=2, top=3)
    lines = text.splitlines()
    assert lines[0] == "| kernel | 1 rows | 4 rows |" and len(lines) == 2 + 3 + 2
    total = lines[-2].split("|")[2:4]
    assert lines[-2].startswith("| all kernels |") and all(float(t) > 0 for t in total)
    assert eng.fixed_shape_steps == 2 * (3 + 2) and sorted(eng.graphs.by_rows) == [1, 4]
    assert eng.length == 12


def test_block_attention_variants_compute_the_forwards_own_attention():
    """Every variant the benchmark times is the same attention as the fixed-shape forward's call (what
    it runs where a backend takes the inputs), and the table has one line per variant."""
    from benchmarks.bench_block_attention import inputs, table, variants

    for rows in (1, 3):
        calls = variants(inputs(rows, 600, torch.float32, torch.device("cpu")))  # prefix: 512 of 600
        ref = next(iter(calls.values()))()
        ran = 0
        for fn in calls.values():
            try:
                out = fn()
            except RuntimeError:  # a backend that refuses these inputs (cuDNN off CUDA)
                continue
            ran += 1
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        assert ran >= 6
    # block sizes whose used prefixes differ (512 and all 600 slots) share the table's lines
    lines = table([1, 400], 600, torch.float32, torch.device("cpu"), reps=1).splitlines()
    assert lines[0] == "| variant | 1 rows | 400 rows |" and len(lines) == 2 + len(calls)
    assert lines[2].startswith("| as run") and "n/a" not in lines[2]


def test_warm_host_playback_takes_the_recorded_steps_without_the_model(tiny_lm):
    """A generation on the fixed-shape forwards, recorded, plays back to the same tokens through the same
    forwards (none of them run: the tape hands back what they returned); a playback that takes other
    forwards fails; the Replay class is left as it was."""
    from benchmarks.bench_warm_host import ForwardTape, PlaybackDiverged
    from core.replay import Replay
    from core.types import Counts
    from decoders.fafo.decoder import FAFO
    from decoders.vanilla import Vanilla

    eng = Engine(tiny_lm.model)
    eng.use_graphs(capture=False)
    prompt = list(range(10, 40)) * 2
    run = Replay.__call__
    for dec in (Vanilla(eng), FAFO(eng, k=3, n=4, m=3)):
        tape = ForwardTape()
        with tape.recording():
            recorded = dec.generate(prompt, 12, set(), Counts())
        assert len(tape.outputs) >= 4 and Replay.__call__ is run
        ran = eng.fixed_shape_steps
        with tape.playing():
            played = dec.generate(prompt, 12, set(), Counts())
        assert played == recorded and tape.at == len(tape.outputs)
        assert eng.fixed_shape_steps == ran + tape.at  # staged as before, the bodies not run
        with pytest.raises(PlaybackDiverged, match="not the recording's"), tape.playing():
            dec.generate(prompt, 40, set(), Counts())  # steps past the recording's
        assert Replay.__call__ is run
    with pytest.raises(PlaybackDiverged, match="forward 1 is not"), tape.playing():
        Vanilla(eng).generate(prompt, 12, set(), Counts())  # another forward in FAFO's block's place
