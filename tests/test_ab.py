"""`benchmarks.ab`'s statistics and its refusals (its timings are benchmarks, not tests)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from benchmarks.ab import Pairs, main, median_interval
from core.types import HarnessError


def test_ratios_are_head_speed_over_base_speed_pair_by_pair_grouped_by_session():
    p = Pairs(base=[10.0, 20.0, 10.0], head=[11.0, 18.0, 10.0], session=[0, 0, 1])
    assert p.ratios() == pytest.approx([1.1, 0.9, 1.0])
    assert p.by_session() == [pytest.approx([1.1, 0.9]), [1.0]]


def test_interval_of_the_median_covers_it_and_narrows_with_more_pairs():
    rng = random.Random(1)
    few = [1.0 + rng.gauss(0, 0.1) for _ in range(10)]
    many = [1.0 + rng.gauss(0, 0.1) for _ in range(400)]
    for values in (few, many):
        med, lo, hi = median_interval([values])
        assert lo <= med <= hi
    (_, lo_few, hi_few), (_, lo_many, hi_many) = median_interval([few]), median_interval([many])
    assert hi_many - lo_many < (hi_few - lo_few) / 2
    assert median_interval([[1.0] * 5]) == (1.0, 1.0, 1.0)


def test_sessions_that_disagree_widen_the_interval():
    # two processes per session whose memory makes one side 18% faster for the whole session (seen on
    # identical trees): tight within each session, so only resampling the sessions shows the doubt
    rng = random.Random(3)
    sessions = [
        [level * (1 + rng.uniform(-0.02, 0.02)) for _ in range(20)] for level in (1.18, 0.85, 1.0, 0.9)
    ]
    _, lo, hi = median_interval(sessions)
    _, lo_pooled, hi_pooled = median_interval([[v for g in sessions for v in g]])
    assert hi - lo > 2 * (hi_pooled - lo_pooled)


def test_a_planted_five_percent_slowdown_falls_outside_the_interval():
    # pairs whose ratio jitters by +-10% around 0.95: a 5% slowdown must not look like noise
    rng = random.Random(2)
    _, lo, hi = median_interval([[0.95 * (1 + rng.uniform(-0.1, 0.1)) for _ in range(15)] for _ in range(4)])
    assert hi < 1.0 and lo > 0.9


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--base", "HEAD", "--decoders", "nope"], "--decoders"),
        (["--base", "HEAD", "--rounds", "0"], "must be positive"),
        (["--base", "HEAD", "--sessions", "0"], "must be positive"),
        (["--base", "no-such-revision-xyz", "--decoders", "vanilla"], "no-such-revision-xyz"),
    ],
)
def test_bad_arguments_are_refused_before_anything_runs(argv, message, tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_BENCH_OUT", str(tmp_path))
    with pytest.raises(HarnessError, match=message):
        main(argv)
    assert not any(tmp_path.iterdir())


def test_each_worker_of_a_session_gets_a_runs_folder_of_its_own(tmp_path, monkeypatch):
    """Both workers of a session load at once: had they shared one runs folder, both would create it and
    an older tree's settings check refuses the one that loses ("File exists")."""
    import benchmarks.ab as ab

    sent: list[str] = []

    class FakeWorker:
        def __init__(self, tree, log) -> None:
            pass

        def send(self, **req) -> None:
            sent.append(req["out_dir"])

        def receive(self) -> None:
            pass

        def close(self) -> None:
            pass

    monkeypatch.setattr(ab, "Worker", FakeWorker)
    monkeypatch.setattr(ab, "measure", lambda *a, **k: None)
    args = type("Args", (), {"override": [], "threads": 1})()
    sides = [(tmp_path, []), (tmp_path, [])]
    for session in range(2):
        ab.run_session(sides, session, ["forward"], [[1]], args, {}, None, tmp_path)
    assert len(set(sent)) == 4 and not any(Path(p).exists() for p in sent)
