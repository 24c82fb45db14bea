"""The benchmark scripts' building blocks (their timings are not tested: speed claims are benchmarks)."""

from __future__ import annotations

import pytest

from benchmarks.bench_block_cost import step_seconds
from benchmarks.bench_fafo import Tally, custom_fafo, spread
from core.engine import Engine
from decoders.fafo import FAFO


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
