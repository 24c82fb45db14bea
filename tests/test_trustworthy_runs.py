"""Runs that cannot silently mislead: KV policies scoped to one generation, their activity recorded,
failed samples never counted as done, resumes that refuse to mix environments, one writer per run,
warm-ups that leave nothing (compiles, cache growth) to the timed samples."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from core.engine import Engine
from core.types import Counts, HarnessError
from decoders.vanilla import Vanilla
from kv_policies.h2o import H2O
from kv_policies.registry import build_policy
from runners import provenance
from runners.lock import RunLock
from runners.records import RunDir
from runners.report import print_summary
from runners.runner import Runner
from tests.helpers import make_cfg

REPO = Path(__file__).resolve().parents[1]
LOSSY = {
    "streaming": "kv.budget=20",
    "quest": "kv.budget=32 kv.page_size=8 kv.dense_layers=0",
    "snapkv": "kv.budget=20 kv.window=4",
    "h2o": "kv.budget=20",
}


@pytest.fixture(autouse=True)
def restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


# --- 1. policies scoped to one generation ---------------------------------------------------------
@pytest.mark.parametrize("kv", sorted(LOSSY))
def test_policy_with_audit_and_prompt_over_budget_has_no_error_rows(tmp_path, kv):
    """The audit's vanilla reference shares the engine; a policy's prefill hooks must survive it."""
    over_budget = ("+task.pad=8", "run.max_new_tokens=12")  # prompts of ~60 tokens
    runner = Runner(make_cfg(tmp_path, f"kv={kv}", *LOSSY[kv].split(), *over_budget))
    assert runner.audit is not None
    path = runner.run()
    samples = pd.read_parquet(path / "samples.parquet")
    assert samples["error"].isna().all(), samples["error"].dropna().tolist()
    assert (samples["restricted_frac"] > 0).all() and (samples["visible_frac"] < 1).all()
    assert samples["matches_vanilla"].notna().all()


def test_h2o_keeps_prompt_heavy_hitters_when_another_decoder_shares_the_engine(tiny_lm):
    eng = Engine(tiny_lm.model)
    pol = H2O(budget=24, recent=8)
    dec = Vanilla(eng, kv=pol)
    Vanilla(eng)  # e.g. the audit's reference, built after the run's decoder on the same engine
    prompt = torch.randint(0, 256, (60,), generator=torch.Generator().manual_seed(0)).tolist()
    dec.generate(prompt, 4, set(), Counts())
    for layer in range(eng.cache.n_layers):
        alive = pol._A[layer][:, : len(prompt) - pol.recent]
        assert alive.any(), f"layer {layer}: no prompt heavy hitter kept"
        assert pol._S[layer][:, : len(prompt)].sum() > len(prompt) * 0.5  # prefill attention counted


@pytest.mark.parametrize("kv", ["full", *sorted(LOSSY)])
def test_building_a_decoder_changes_nothing_in_the_engine(tiny_lm, kv):
    eng = Engine(tiny_lm.model)
    before = dict(vars(eng))
    params = dict(item.split("=") for item in LOSSY.get(kv, "").replace("kv.", "").split() if item)
    Vanilla(eng, kv=build_policy(kv, **{k: int(v) for k, v in params.items()}))
    after = dict(vars(eng))
    assert before.keys() == after.keys()
    assert all(before[k] is after[k] for k in before), [k for k in before if before[k] is not after[k]]


# --- 1. activity, budgets ---------------------------------------------------------------------------
def test_inactive_policy_is_reported_and_budget_frac_bites(tmp_path, capsys):
    idle = Runner(make_cfg(tmp_path, "kv=streaming")).run()  # budget 760 >> any context here
    samples = pd.read_parquet(idle / "samples.parquet")
    assert (samples["restricted_frac"] == 0).all() and (samples["visible_frac"] == 1).all()
    assert (samples["kv_budget"] == 760).all()
    capsys.readouterr()
    print_summary(idle)
    out = capsys.readouterr().out
    assert "restricted attention in none of the decode forwards" in out and "kv.budget_frac" in out

    lossless = Runner(make_cfg(tmp_path, "decoder=fafo_cpu", "kv=streaming")).run()  # FAFO-Stream, idle
    capsys.readouterr()
    print_summary(lossless)
    assert "kv=streaming restricted attention in none" in capsys.readouterr().out

    active = Runner(make_cfg(tmp_path, "kv=streaming_ctx10")).run()
    samples = pd.read_parquet(active / "samples.parquet")
    context = samples["prompt_tokens"] + 6
    assert (samples["kv_budget"] == (0.1 * context).apply(lambda x: max(5, -(-x // 1)))).all()
    assert (samples["restricted_frac"] > 0).all() and (samples["visible_frac"] < 0.9).all()
    print_summary(active)
    assert "restricted attention in none" not in capsys.readouterr().out


def test_full_kv_records_no_restriction(tmp_path):
    samples = pd.read_parquet(Runner(make_cfg(tmp_path)).run() / "samples.parquet")
    assert (samples["restricted_frac"] == 0).all() and samples["kv_budget"].isna().all()


@pytest.mark.parametrize("name", sorted(LOSSY))
def test_budget_frac_sets_the_budget_per_generation(name):
    pol = build_policy(name, budget_frac=0.1)
    pol.reset(100, 400)
    assert pol.budget == max(40, pol.min_budget())
    pol.reset(10, 20)
    assert pol.budget == pol.min_budget()  # never below the smallest valid budget
    for bad in (0, -0.1, 1.5, "x"):
        with pytest.raises(HarnessError, match="budget_frac"):
            build_policy(name, budget_frac=bad)


def test_budget_over_context_warns_once(caplog):
    pol = build_policy("streaming", budget=500)
    with caplog.at_level(logging.WARNING):
        pol.reset(100, 300)
        pol.reset(120, 320)
    warned = [r for r in caplog.records if "cannot restrict" in r.getMessage()]
    assert len(warned) == 1 and "500" in warned[0].getMessage()


# --- 1. failed samples ----------------------------------------------------------------------------
def _failing(orig, fail_ids: set[str]):
    def gen(self, prompt):
        if self._current in fail_ids:
            raise RuntimeError("boom")
        return orig(self, prompt)

    return gen


@pytest.fixture
def track_sample(monkeypatch):
    orig = Runner._run_sample

    def run_sample(self, sample, bar):
        self._current = sample.sample_id
        return orig(self, sample, bar)

    monkeypatch.setattr(Runner, "_run_sample", run_sample)


def test_failed_samples_are_retried_and_never_complete(tmp_path, monkeypatch, track_sample):
    orig = Runner._generate
    monkeypatch.setattr(Runner, "_generate", _failing(orig, {"s1"}))
    first = Runner(make_cfg(tmp_path))
    with pytest.raises(HarnessError, match="1 of 3 samples"):
        first.run()
    path = first.rundir.path
    assert not (path / "COMPLETE").exists()
    assert len(list((path / "parts").glob("s[02]-*.samples.parquet"))) == 2
    monkeypatch.setattr(Runner, "_generate", orig)
    ran = []
    write = RunDir.write_sample
    monkeypatch.setattr(
        RunDir, "write_sample", lambda self, sid, *rest: ran.append(sid) or write(self, sid, *rest)
    )
    Runner(make_cfg(tmp_path)).run()  # a rerun retries s1 only
    assert (path / "COMPLETE").exists() and ran == ["s1"]
    samples = pd.read_parquet(path / "samples.parquet")
    assert samples["error"].isna().all() and len(samples) == 6


def test_every_sample_failing_exits_non_zero(tmp_path):
    res = subprocess.run(
        [
            sys.executable,
            str(REPO / "run.py"),
            "model=tiny_llama",
            "task._target_=tests.fake_task.FakeTask",
            "+task.n=1",
            "+task.broken=s0",
            "run.limit=null",
            "run.max_new_tokens=4",
            "run.warmup=false",
            f"run.out_dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
    )
    assert res.returncode != 0
    assert "FAILED: 1 sample" in res.stdout
    last = res.stderr.strip().splitlines()[-1]
    assert last.startswith("error: every sample") and "retries" in last
    assert not list(tmp_path.glob("runs/*/COMPLETE"))


# --- 2. identity, resume, references, limits, lock ---------------------------------------------------
def test_identity_and_reference_key_cover_threads_prefill_chunk_and_device(tmp_path):
    base = Runner(make_cfg(tmp_path, "run.threads=1"))
    other_threads = Runner(make_cfg(tmp_path, "run.threads=2"))
    other_chunk = Runner(make_cfg(tmp_path, "run.threads=1", "run.prefill_chunk=16"))
    assert len({base.run_id, other_threads.run_id, other_chunk.run_id}) == 3
    assert len({r._reference_key() for r in (base, other_threads, other_chunk)}) == 3
    assert base.identity["device_name"] == provenance.device_name(torch.device("cpu"))
    path = Runner(make_cfg(tmp_path, "run.threads=1")).run()
    run = pd.read_parquet(path / "runs.parquet").iloc[0]
    assert run["threads"] == 1 and run["prefill_chunk"] == 1024 and len(run["sample_set"]) == 16


def test_default_threads_are_pinned_and_recorded(tmp_path):
    runner = Runner(make_cfg(tmp_path, "run.threads=null"))
    assert runner.threads == torch.get_num_threads() and runner.identity["threads"] == runner.threads


def test_resume_refuses_another_code_version(tmp_path, monkeypatch, track_sample):
    orig = Runner._generate
    monkeypatch.setattr(Runner, "_generate", _failing(orig, {"s2"}))
    with pytest.raises(HarnessError):
        Runner(make_cfg(tmp_path)).run()
    monkeypatch.setattr(Runner, "_generate", orig)
    monkeypatch.setattr(provenance, "git_sha", lambda repo: "0123abcd-dirty-ffff")
    with pytest.raises(HarnessError, match="code version.*resuming would mix"):
        Runner(make_cfg(tmp_path)).run()


def test_resume_checks_who_wrote_the_parts_even_when_the_run_record_is_gone(
    tmp_path, monkeypatch, track_sample
):
    """Deleting a run's records but not its (untracked) parts/ must not let other code finish it."""
    orig = Runner._generate
    monkeypatch.setattr(Runner, "_generate", _failing(orig, {"s2"}))
    with pytest.raises(HarnessError):
        Runner(make_cfg(tmp_path)).run()
    monkeypatch.setattr(Runner, "_generate", orig)
    run_dir = next((tmp_path / "runs").glob("*/parts")).parent
    (run_dir / "runs.parquet").unlink()
    monkeypatch.setattr(provenance, "git_sha", lambda repo: "0123abcd-dirty-ffff")
    with pytest.raises(HarnessError, match="code version.*resuming would mix"):
        Runner(make_cfg(tmp_path)).run()
    (run_dir / "parts" / "provenance.json").unlink()
    with pytest.raises(HarnessError, match="no record of the code that wrote them"):
        Runner(make_cfg(tmp_path)).run()


def test_reference_key_follows_the_reference_code(tmp_path, monkeypatch):
    import runners.audit as audit

    runner = Runner(make_cfg(tmp_path))
    key = runner._reference_key()
    monkeypatch.setattr(audit, "REFERENCE_CODE", (*audit.REFERENCE_CODE, "README.md"))
    assert runner._reference_key() != key


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("run.limit=-1", "run.limit must be an integer >= 1"),
        ("run.limit=0", "run.limit must be an integer >= 1"),
        ("+task.limit=-2", "task.limit must be an integer >= 1"),
        ("run.threads=0", "run.threads must be an integer >= 1 and <="),
        ("run.prefill_chunk=0", "run.prefill_chunk must be an integer >= 1"),
    ],
)
def test_bad_limits_are_one_clear_error(tmp_path, override, message):
    with pytest.raises(HarnessError, match=message):
        Runner(make_cfg(tmp_path, override))


def test_second_writer_on_the_same_run_is_refused(tmp_path):
    runner = Runner(make_cfg(tmp_path))
    with RunLock(runner.rundir.path), pytest.raises(HarnessError, match="is being written by pid"):
        runner.run()
    assert runner.run().exists()  # the lock is gone with its holder


# --- 5. warm-up ------------------------------------------------------------------------------------
def test_no_compile_and_no_cache_growth_inside_timed_samples(tmp_path, monkeypatch):
    """Flex attention compiles per shape and the cache grows with the longest context: the warm-up and
    the run's one reservation must leave neither to a timed sample (turn 2 is the longest context)."""
    from torch._dynamo.utils import counters

    seen: list[tuple[int, int]] = []
    orig = Runner._generate

    def timed(self, prompt):
        before = (counters["frames"]["total"], self.engine.cache.allocations)
        out = orig(self, prompt)
        seen.append((counters["frames"]["total"] - before[0], self.engine.cache.allocations - before[1]))
        return out

    monkeypatch.setattr(Runner, "_generate", timed)
    cfg = make_cfg(tmp_path, "kv=streaming_ctx10", "kv.backend=flex", "run.warmup=true", "+task.n=2")
    path = Runner(cfg).run()
    samples = pd.read_parquet(path / "samples.parquet")
    assert (samples["restricted_frac"] > 0).all()  # the flex path really ran
    assert len(seen) == 4 and all(s == (0, 0) for s in seen), seen


def test_end_of_run_table_compares_with_vanilla_of_the_same_environment(tmp_path, capsys):
    Runner(make_cfg(tmp_path, "decoder=pld")).run()
    assert "no vanilla kv=full run of this environment yet" in capsys.readouterr().out
    Runner(make_cfg(tmp_path, "run.max_new_tokens=5")).run()  # a vanilla run of another configuration
    path = Runner(make_cfg(tmp_path, "decoder=pld")).run()  # complete: prints its table again
    assert "no vanilla kv=full run of this environment yet" in capsys.readouterr().out
    Runner(make_cfg(tmp_path)).run()
    capsys.readouterr()
    print_summary(path)
    out = capsys.readouterr().out
    assert "vs vanilla (fake-vanilla-full-" in out and "same environment, 6 turns): speedup" in out


def test_code_version_from_the_environment_wins_where_git_cannot_tell(monkeypatch, tmp_path):
    """A tree that travelled without .git (a GPU lease) names its commit through HARNESS_CODE_VERSION;
    without it, a folder that is no git checkout has the version 'unknown'."""
    monkeypatch.delenv("HARNESS_CODE_VERSION", raising=False)
    assert provenance.git_sha(tmp_path) == "unknown"
    monkeypatch.setenv("HARNESS_CODE_VERSION", "348522d")
    assert provenance.git_sha(tmp_path) == "348522d"
