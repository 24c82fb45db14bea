"""The claims ledger (analysis.claims): each claim's verdict per setup from the records' intervals, the
evidence a differing claim carries, the lossless count, and the report's summary and verdict lines."""

from __future__ import annotations

import pandas as pd

from analysis.claims import Claim, ledger
from analysis.claims_report import counts, findings, verdict_line
from analysis.claims_table import CLAIMS
from tests.synthetic_runs import rows

STREAM = {"decoder": "fafo", "kv": "streaming"}


def runs(
    fafo_wall: float, fafo_tau: float, spread: float = 0.0, device: str = "cpu: test x2"
) -> pd.DataFrame:
    """Vanilla, FAFO-Stream and Lookahead on MT-Bench, 6 samples; FAFO's tau varies by +-`spread`."""
    out = []
    for run_id, decoder, kv, wall, tau in (
        ("van", "vanilla", "full", 4.0, 1.0),
        ("fafo", "fafo", "streaming", fafo_wall, fafo_tau),
        ("la", "lookahead", "full", 3.0, 1.6),
    ):
        part = rows(decoder, kv, wall, tau, n_samples=6, device_name=device)
        for i, row in enumerate(part):
            wobble = spread if i % 4 < 2 else -spread
            row.update(run_id=f"{run_id}-{device}", committed=row["forwards"] * (tau + wobble),
                       matches_vanilla=decoder != "vanilla", lossless=True, drafted=10, accepted=5,
                       restricted_frac=0.0, scale="cpu", divergence_gap=float("nan"),
                       **{"task.context_length": float("nan")})  # a task parameter no run sets  # fmt: skip
        out += part
    return pd.DataFrame(out)


SPEED = Claim("FAFO", "Table 2", "FAFO is faster than Lookahead", "speed", "order", "speedup", STREAM,
              {"decoder": "lookahead"}, why=("cost curve",))  # fmt: skip
TAU = Claim("FAFO", "Table 2", "FAFO's tau is above Lookahead's", "tau", "order", "tau", STREAM,
            {"decoder": "lookahead"}, why=("policy inactive",))  # fmt: skip
EXACT = Claim("FAFO", "Appendix", "lossless", "exactness", "at_least", "match", {"decoder": "fafo"},
              threshold=157 / 160)  # fmt: skip
NONE = Claim("FAFO", "Table 4", "keeps its speedup when sampling", "speed", "none", untestable="greedy only")


def test_verdicts_rest_on_the_intervals_and_say_why():
    slow = ledger(runs(fafo_wall=20.0, fafo_tau=1.7, spread=0.3), [SPEED, TAU, EXACT, NONE]).set_index(
        "claim"
    )
    speed = slow.loc["FAFO is faster than Lookahead"]
    assert speed["verdict"] == "differs" and speed["why"].startswith("cost curve: tau 1.70 but speedup 0.20")
    assert "margin -1.13" in speed["margin"]
    tau = slow.loc["FAFO's tau is above Lookahead's"]
    assert tau["verdict"] == "within noise" and "intervals overlap" in tau["margin"]  # 1.7 +- 0.3 vs 1.6
    assert (
        slow.loc["lossless", "verdict"] == "holds"
        and "12 of 12 outputs identical" in slow.loc["lossless", "margin"]
    )
    assert (
        slow.loc["keeps its speedup when sampling", ["setup", "verdict", "why"]]
        == ["-", "not testable", "greedy only"]
    ).all()
    fast = ledger(runs(fafo_wall=1.0, fafo_tau=2.5), [SPEED, TAU]).set_index("claim")
    assert (fast["verdict"] == "holds").all() and (fast["why"] == "").all()


def test_a_verdict_per_setup_and_the_summary_counts_them():
    two = pd.concat([runs(20.0, 1.7), runs(1.0, 2.5, device="cuda: NVIDIA H200")], ignore_index=True)
    table = ledger(two, [SPEED, TAU, EXACT, NONE])
    assert len(table[table["claim"] == SPEED.statement]) == 2  # one verdict per setup
    fafo = counts(table).set_index("paper").loc["FAFO"]
    assert (fafo["claims"], fafo["holds"], fafo["differs"], fafo["not testable"]) == (4, 5, 1, 1)
    assert any("cost curve" in f for f in findings(table))
    line = verdict_line(table, "FAFO", "Tables 2 and 8")
    assert line.startswith("**Verdict**") and "F1 holds 1, differs 1" in line and "F4" not in line
    assert "no claim" in verdict_line(table, "FAFO", "Table 13")


def test_the_ledger_holds_at_least_30_claims_with_the_issues_contradictions():
    assert len(CLAIMS) >= 30
    assert {c.paper for c in CLAIMS} == {"FAFO", "TriForce", "SFI", "LongSpec"}
    said = " ".join(c.statement for c in CLAIMS)
    for text in ("FAFO-2forward", "PG-19", "k 6-7", "157 of 160", "gamma2 = 6", "MagicDec", "Anchor-Offset",
                 "temperature", "full attention"):  # fmt: skip
        assert text in said, text
    assert all(c.untestable for c in CLAIMS if c.compare == "none")


def test_a_slowdown_claim_holds_when_the_speedup_interval_lies_at_or_below_one():
    """ "at_most" (FAFO's TriForce claim: 0.21x): holds below the threshold, differs above it."""
    slow = Claim(
        "FAFO", "Table 1", "FAFO slows decoding", "speed", "at_most", "speedup", STREAM, threshold=1.0
    )
    assert ledger(runs(fafo_wall=20.0, fafo_tau=1.7), [slow])["verdict"].iloc[0] == "holds"
    assert ledger(runs(fafo_wall=2.0, fafo_tau=1.7), [slow])["verdict"].iloc[0] == "differs"


def test_fafo_sampling_swift_and_triforce_claims_are_testable():
    """FAFO's TriForce, SWIFT and sampling claims read runs (experiments fafo_triforce, fafo_swift,
    fafo_table4) instead of standing as not testable."""
    by = {c.statement: c for c in CLAIMS}
    for text in ("(TriForce) slows chat", "SWIFT (layer", "when sampling", "AIME24 reasoning"):
        (claim,) = [c for s, c in by.items() if text in s and c.paper == "FAFO"]
        assert claim.compare != "none", claim.statement
    sampled = runs(fafo_wall=20.0, fafo_tau=1.7).assign(sampling='{"temperature": 0.6, "top_p": 0.9}')
    sampled = sampled.assign(**{"decoder.k": 6, "decoder.n": 40})
    (claim,) = [c for s, c in by.items() if "when sampling" in s and c.paper == "FAFO"]
    row = ledger(sampled, [claim]).iloc[0]
    assert row["verdict"] == "differs" and row["why"].startswith("cost curve")
