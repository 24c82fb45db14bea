"""SFI selector (kv_policies/sfi_selector.py) against a brute-force pure-Python reference written here from
the paper's Alg. 2: the closed-form fusion weight, the power-mean evidence, the prior, soft-NMS,
cross-head exclusivity, the full top-k selection (ties, k >= M, non-contiguous positions) and bad configs."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from core.types import HarnessError
from kv_policies.sfi_selector import (
    PAPER,
    REPO,
    SelectorConfig,
    cross_head,
    evidence,
    fuse,
    prior,
    selected_positions,
    sfi_select,
    soft_nms,
)

# ---------------------------------------------------------------------------------------------------
# Brute-force reference: plain Python floats (double precision), loops over heads and candidates.
# ---------------------------------------------------------------------------------------------------


def ref_softmax(xs: list[float]) -> list[float]:
    top = max(xs)
    es = [math.exp(x - top) for x in xs]
    total = sum(es)
    return [e / total for e in es]


def ref_evidence(logits: list[list[list[float]]], alpha: float) -> list[list[float]]:
    out = []
    for rows in logits:
        probs = [ref_softmax(row) for row in rows]
        m_len = len(rows[0])
        mu = [sum(p[j] ** alpha for p in probs) / len(probs) for j in range(m_len)]
        pooled = [v ** (1.0 / alpha) for v in mu]
        total = sum(pooled)
        out.append([v / total for v in pooled])
    return out


def ref_prior(key_norm: list[list[float]], positions: list[int], cfg: SelectorConfig) -> list[list[float]]:
    lo, hi = min(positions), max(positions)
    us = [(x - lo) / (hi - lo + cfg.eps) for x in positions]
    pos_w = [math.exp(-cfg.beta * u**cfg.p) * (1.0 - u + cfg.eps) ** cfg.eta for u in us]
    pos_total = sum(pos_w)
    out = []
    for norms in key_norm:
        kn_w = [(n + cfg.eps) ** (-cfg.gamma) for n in norms]
        kn_total = sum(kn_w)
        raw = [
            (kn_w[j] / kn_total) ** cfg.prior_w_kn * (pos_w[j] / pos_total) ** cfg.prior_w_pos
            for j in range(len(norms))
        ]
        total = sum(raw)
        out.append([v / total for v in raw])
    return out


def ref_lambda(f: list[float], r: list[float], clip: float) -> float:
    ff = sum(a * a for a in f)
    fr = sum(a * b for a, b in zip(f, r))
    rr = sum(b * b for b in r)
    den = ff - 2 * fr + rr
    if abs(den) < 1e-18:
        return 0.0
    return min(max((ff - fr) / den, 0.0), clip)


def ref_nms(z: list[list[float]], window: int, alpha_soft: float) -> list[list[float]]:
    half = window // 2
    out = []
    for row in z:
        new = []
        for j in range(len(row)):
            m = max(row[i] for i in range(len(row)) if abs(i - j) <= half)
            new.append(row[j] - alpha_soft * max(m - row[j], 0.0))
        out.append(new)
    return out


def ref_cross(z: list[list[float]], alpha_cross: float, temp: float, eps: float) -> list[list[float]]:
    hkv, m_len = len(z), len(z[0])
    out = [[0.0] * m_len for _ in range(hkv)]
    for j in range(m_len):
        share = ref_softmax([z[h][j] / temp for h in range(hkv)])
        for h in range(hkv):
            out[h][j] = z[h][j] + alpha_cross * math.log(max(share[h], eps))
    return out


def ref_scores(logits, key_norm, positions, cfg: SelectorConfig) -> tuple[list[list[float]], list[float]]:
    f = ref_evidence(logits, cfg.power_alpha)
    r = ref_prior(key_norm, positions, cfg)
    lams, z = [], []
    for fh, rh in zip(f, r):
        lam = ref_lambda(fh, rh, cfg.lambda_clip)
        lams.append(lam)
        z.append([math.log((1 - lam) * a + lam * b + cfg.eps) for a, b in zip(fh, rh)])
    z = ref_nms(z, cfg.nms_window, cfg.alpha_soft)
    return ref_cross(z, cfg.alpha_cross, cfg.cross_temp, cfg.eps), lams


# ---------------------------------------------------------------------------------------------------


def f64(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


def rand_dist(gen: torch.Generator, h: int, m: int, sharp: float = 3.0) -> torch.Tensor:
    return (torch.randn(h, m, generator=gen, dtype=torch.float64) * sharp).softmax(-1)


def rand_inputs(seed: int, hkv: int, r: int, m: int, contiguous: bool = True):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(hkv, r, m, generator=gen) * 3.0
    key_norm = torch.rand(hkv, m, generator=gen) * 10.0 + 0.5
    if contiguous:
        positions = torch.arange(4, 4 + m)
    else:
        positions = torch.randperm(10 * m + 50, generator=gen)[:m].sort().values
    return logits, key_norm, positions


def check_topk(selected: torch.Tensor, ref: list[list[float]], k: int, tol: float = 1e-4) -> None:
    """`selected` is a valid top-min(k, M) set of every head's reference scores: distinct, ascending, and
    no unselected candidate beats a selected one by more than `tol` (only near-ties may differ)."""
    m_len = len(ref[0])
    assert selected.dtype == torch.long
    assert selected.shape == (len(ref), min(k, m_len))
    for h, row in enumerate(ref):
        sel = selected[h].tolist()
        assert sel == sorted(set(sel))
        assert all(0 <= i < m_len for i in sel)
        rest = [row[i] for i in range(m_len) if i not in sel]
        if rest:
            assert min(row[i] for i in sel) >= max(rest) - tol


# ---------------------------------------------------------------------------------------------------
# λ*: closed form, grid argmin, clipping, f == r.
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("clip", [0.02, 0.25, 0.6, 1.0])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lambda_closed_form_matches_grid_argmin(clip: float, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    h, m = 6, 17
    f = rand_dist(gen, h, m, sharp=float(torch.rand(1, generator=gen)) * 4)
    r = rand_dist(gen, h, m, sharp=float(torch.rand(1, generator=gen)) * 4)
    s, lam = fuse(f, r, clip)
    assert lam.dtype == torch.float32 and lam.shape == (h,)
    steps = 4001
    grid = torch.linspace(0.0, clip, steps, dtype=torch.float64)
    for i in range(h):
        obj = (((1 - grid)[:, None] * f[i] + grid[:, None] * r[i]) ** 2).sum(-1)
        best = float(grid[obj.argmin()])
        assert abs(float(lam[i]) - best) <= clip / (steps - 1) + 1e-6
        assert float(lam[i]) == pytest.approx(ref_lambda(f[i].tolist(), r[i].tolist(), clip), abs=1e-5)
        expect = (1 - lam[i].double()) * f[i] + lam[i].double() * r[i]
        torch.testing.assert_close(s[i].double(), expect, atol=1e-6, rtol=1e-5)


def test_lambda_clipped_above_and_below() -> None:
    # f peaked, r uniform: the unclipped optimum is 1, so λ* = lambda_clip.
    f = torch.tensor([[0.7, 0.1, 0.1, 0.1]])
    r = torch.full((1, 4), 0.25)
    for clip in (0.02, 0.25, 0.9):
        _, lam = fuse(f, r, clip)
        assert float(lam[0]) == pytest.approx(clip)
    _, lam = fuse(f, r, 1.0)
    assert float(lam[0]) == pytest.approx(1.0, abs=1e-5)
    # f·f < f·r: the unclipped optimum is negative, so λ* = 0.
    f = torch.tensor([[0.6, 0.4]])
    r = torch.tensor([[1.0, 0.0]])
    assert ref_lambda(f[0].tolist(), r[0].tolist(), 1.0) == 0.0
    s, lam = fuse(f, r, 0.25)
    assert float(lam[0]) == 0.0
    torch.testing.assert_close(s, f)


def test_lambda_f_equals_r_is_zero_without_nan() -> None:
    f = torch.tensor([[0.2, 0.3, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    s, lam = fuse(f, f.clone(), 0.25)
    assert torch.equal(lam, torch.zeros(2))
    assert not torch.isnan(s).any()
    torch.testing.assert_close(s, f)


# ---------------------------------------------------------------------------------------------------
# Evidence, prior.
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("alpha", [0.25, 0.5, 1.0])
def test_evidence_one_row_is_softmax(alpha: float) -> None:
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(3, 1, 9, generator=gen) * 4
    f = evidence(logits, alpha)
    assert f.dtype == torch.float32
    for h in range(3):
        torch.testing.assert_close(
            f[h].double(), f64(ref_softmax(logits[h, 0].tolist())), rtol=1e-5, atol=1e-7
        )


@pytest.mark.parametrize("alpha", [0.2, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("rows", [2, 4, 7])
def test_evidence_rows_is_power_mean(alpha: float, rows: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    logits = torch.randn(2, rows, 11, generator=gen) * 3
    f = evidence(logits, alpha)
    torch.testing.assert_close(f.double(), f64(ref_evidence(logits.tolist(), alpha)), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(f.sum(-1), torch.ones(2))


def test_evidence_alpha_one_is_mean_of_softmaxes() -> None:
    logits = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(9))
    torch.testing.assert_close(evidence(logits, 1.0), logits.softmax(-1).mean(1))


@pytest.mark.parametrize("cfg", [PAPER, REPO, SelectorConfig(gamma=1.3, beta=2.0, p=1.0, eta=0.0)])
@pytest.mark.parametrize("m", [1, 2, 13])
def test_prior_matches_reference(cfg: SelectorConfig, m: int) -> None:
    gen = torch.Generator().manual_seed(m)
    key_norm = torch.rand(3, m, generator=gen) * 5 + 0.1
    positions = torch.randperm(1000, generator=gen)[:m].sort().values
    r = prior(key_norm, positions, cfg)
    ref = f64(ref_prior(key_norm.tolist(), positions.tolist(), cfg))
    torch.testing.assert_close(r.double(), ref, rtol=1e-5, atol=1e-7)


def test_prior_prefers_small_keys_and_early_positions() -> None:
    positions = torch.arange(10)
    r = prior(torch.ones(1, 10), positions, PAPER)
    assert (r[0, 1:] < r[0, :-1]).all()
    r = prior(torch.linspace(1, 5, 10)[None].flip(-1), torch.zeros(10, dtype=torch.long), PAPER)
    assert (r[0, 1:] > r[0, :-1]).all()


# ---------------------------------------------------------------------------------------------------
# Soft-NMS, cross-head exclusivity.
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("window", [1, 2, 3, 4, 7, 32, 200])
@pytest.mark.parametrize("m", [1, 2, 5, 40])
@pytest.mark.parametrize("alpha_soft", [0.0, 0.5, 1.0])
def test_soft_nms_matches_brute_force(window: int, m: int, alpha_soft: float) -> None:
    z = torch.randn(3, m, generator=torch.Generator().manual_seed(m * 100 + window)) * 5 - 10
    out = soft_nms(z, window, alpha_soft)
    torch.testing.assert_close(
        out.double(), f64(ref_nms(z.tolist(), window, alpha_soft)), rtol=1e-6, atol=1e-5
    )
    assert (out <= z + 1e-6).all()  # never raises a score


def test_soft_nms_window_covers_the_list_ends() -> None:
    z = torch.tensor([[0.0, -1.0, -2.0, -3.0, -4.0, -5.0]])
    # Half-width 2: local maxima [0, 0, 0, -1, -2, -3] (z[0] reaches index 2, not 3), so z - (m - z).
    out = soft_nms(z, 4, 1.0)
    assert out.tolist() == [[0.0, -2.0, -4.0, -5.0, -6.0, -7.0]]
    assert soft_nms(z, 1, 1.0).tolist() == z.tolist()  # half-width 0: every candidate is its own max


@pytest.mark.parametrize("hkv", [1, 2, 4])
@pytest.mark.parametrize("cfg", [PAPER, REPO, SelectorConfig(alpha_cross=2.0, cross_temp=0.05, eps=0.05)])
def test_cross_head_matches_brute_force(hkv: int, cfg: SelectorConfig) -> None:
    z = torch.randn(hkv, 12, generator=torch.Generator().manual_seed(hkv)) * 4 - 8
    out = cross_head(z, cfg.alpha_cross, cfg.cross_temp, cfg.eps)
    ref = ref_cross(z.tolist(), cfg.alpha_cross, cfg.cross_temp, cfg.eps)
    torch.testing.assert_close(out.double(), f64(ref), rtol=1e-5, atol=1e-5)
    if hkv == 1:
        torch.testing.assert_close(out, z)


# ---------------------------------------------------------------------------------------------------
# Full pipeline.
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cfg", [PAPER, REPO], ids=["paper", "repo"])
@pytest.mark.parametrize("r", [1, 4])
@pytest.mark.parametrize("m", [1, 5, 64])
@pytest.mark.parametrize("hkv", [1, 3])
def test_pipeline_matches_reference(cfg: SelectorConfig, r: int, m: int, hkv: int) -> None:
    for seed in range(3):
        logits, key_norm, positions = rand_inputs(seed, hkv, r, m, contiguous=seed != 1)
        ref, ref_lams = ref_scores(logits.tolist(), key_norm.tolist(), positions.tolist(), cfg)
        for k in (1, 3, 16, m, m + 2):
            res = sfi_select(logits, key_norm, positions, k, cfg)
            assert res.scores.dtype == torch.float32 and res.scores.shape == (hkv, m)
            assert res.lambda_star.dtype == torch.float32 and res.lambda_star.shape == (hkv,)
            torch.testing.assert_close(res.scores.double(), f64(ref), rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(res.lambda_star.double(), f64(ref_lams), atol=1e-5, rtol=1e-4)
            check_topk(res.selected, ref, k)
            if k >= m:
                assert torch.equal(res.selected, torch.arange(m).expand(hkv, m))


def test_pipeline_fusion_weight_reaches_the_clip_or_zero() -> None:
    # One-hot evidence: the unclipped λ* is close to 1, so it is clipped to lambda_clip.
    _, key_norm, positions = rand_inputs(0, 2, 4, 30)
    logits = torch.zeros(2, 4, 30)
    logits[:, :, 17] = 60.0
    for cfg in (PAPER, REPO):
        assert torch.equal(
            sfi_select(logits, key_norm, positions, 5, cfg).lambda_star, torch.full((2,), cfg.lambda_clip)
        )
    # Uniform evidence: f·f == f·r == 1/M for any prior, so λ* = 0.
    res = sfi_select(torch.zeros(2, 4, 30), key_norm, positions, 5, REPO)
    torch.testing.assert_close(res.lambda_star, torch.zeros(2), atol=1e-5, rtol=0)


@pytest.mark.parametrize("m", [1, 4, 20])
@pytest.mark.parametrize("k", [1, 3, 20, 50])
def test_all_ties_give_distinct_sorted_indices(m: int, k: int) -> None:
    # No prior weights and equal logits: f == r == uniform, so every score of a head is equal.
    cfg = SelectorConfig(prior_w_kn=0.0, prior_w_pos=0.0)
    logits, key_norm, positions = torch.zeros(3, 2, m), torch.ones(3, m), torch.arange(m)
    res = sfi_select(logits, key_norm, positions, k, cfg)
    assert torch.equal(res.lambda_star, torch.zeros(3))
    assert torch.all(res.scores == res.scores[0, 0])
    assert res.selected.shape == (3, min(k, m))
    for row in res.selected.tolist():
        assert row == sorted(set(row)) and all(0 <= i < m for i in row)
    again = sfi_select(logits, key_norm, positions, k, cfg)
    assert torch.equal(res.selected, again.selected)  # deterministic


def test_equal_logits_and_norms_default_config() -> None:
    m, k = 40, 7
    res = sfi_select(torch.zeros(2, 3, m), torch.ones(2, m), torch.arange(m), k, PAPER)
    ref, _ = ref_scores(torch.zeros(2, 3, m).tolist(), torch.ones(2, m).tolist(), list(range(m)), PAPER)
    check_topk(res.selected, ref, k)


def test_non_contiguous_positions_and_selected_positions() -> None:
    logits, key_norm, _ = rand_inputs(5, 3, 4, 24)
    positions = torch.tensor([0, 3, 4, 9, 10, 11, 40, 41, 100, 250, 251, 252, 300, 301, 302, 303, 500, 501,
                              502, 800, 900, 901, 902, 1000])  # fmt: skip
    res = sfi_select(logits, key_norm, positions, 6, PAPER)
    ref, _ = ref_scores(logits.tolist(), key_norm.tolist(), positions.tolist(), PAPER)
    check_topk(res.selected, ref, 6)
    pos = selected_positions(res, positions)
    assert pos.shape == (3, 6) and pos.dtype == torch.long
    for h in range(3):
        assert pos[h].tolist() == [int(positions[i]) for i in res.selected[h].tolist()]
        assert pos[h].tolist() == sorted(pos[h].tolist())
    # The prior sees the absolute positions: shifting them all leaves the result unchanged, but moving
    # one candidate far away changes the prior.
    shifted = sfi_select(logits, key_norm, positions + 7777, 6, PAPER)
    torch.testing.assert_close(shifted.scores, res.scores)
    stretched = positions.clone()
    stretched[-1] = 100_000
    assert not torch.allclose(prior(key_norm, stretched, PAPER), prior(key_norm, positions, PAPER))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_any_input_dtype_computes_in_float32(dtype: torch.dtype) -> None:
    logits, key_norm, positions = rand_inputs(2, 3, 4, 20)
    logits, key_norm = logits.to(dtype), key_norm.to(dtype)
    res = sfi_select(logits, key_norm, positions, 5, REPO)
    base = sfi_select(logits.float(), key_norm.float(), positions, 5, REPO)
    assert res.scores.dtype == torch.float32 and res.lambda_star.dtype == torch.float32
    torch.testing.assert_close(res.scores, base.scores)
    assert torch.equal(res.selected, base.selected)


def test_no_candidates() -> None:
    res = sfi_select(torch.zeros(2, 3, 0), torch.zeros(2, 0), torch.zeros(0, dtype=torch.long), 4)
    assert res.selected.shape == (2, 0) and res.selected.dtype == torch.long
    assert res.scores.shape == (2, 0)


# ---------------------------------------------------------------------------------------------------
# Configs and bad input.
# ---------------------------------------------------------------------------------------------------


def test_presets() -> None:
    assert (PAPER.lambda_clip, PAPER.alpha_soft, PAPER.alpha_cross, PAPER.eps) == (0.02, 0.5, 0.35, 1e-8)
    assert (REPO.lambda_clip, REPO.alpha_soft, REPO.alpha_cross, REPO.eps) == (0.25, 1.0, 0.85, 1e-12)
    for field in ("power_alpha", "gamma", "beta", "p", "eta", "prior_w_kn", "prior_w_pos", "nms_window",
                  "cross_temp"):  # fmt: skip
        assert getattr(PAPER, field) == getattr(REPO, field)
    assert PAPER.beta == pytest.approx(-math.log(0.6) / 0.9, abs=1e-4)


@pytest.mark.parametrize(
    ("field", "value", "valid"),
    [
        ("lambda_clip", -0.01, "[0, 1]"),
        ("lambda_clip", 1.5, "[0, 1]"),
        ("lambda_clip", float("nan"), "[0, 1]"),
        ("alpha_soft", -0.5, ">= 0"),
        ("alpha_cross", -0.1, ">= 0"),
        ("power_alpha", 0.0, "(0, 1]"),
        ("power_alpha", -1.0, "(0, 1]"),
        ("power_alpha", 1.01, "(0, 1]"),
        ("nms_window", 0, ">= 1"),
        ("nms_window", -3, ">= 1"),
        ("nms_window", 2.5, ">= 1"),
        ("cross_temp", 0.0, "> 0"),
        ("cross_temp", -2.0, "> 0"),
    ],
)
def test_bad_config_raises(field: str, value: float, valid: str) -> None:
    with pytest.raises(HarnessError, match=field) as err:
        SelectorConfig(**{field: value})
    assert valid in str(err.value)
    with pytest.raises(HarnessError, match=field):
        dataclasses.replace(REPO, **{field: value})


@pytest.mark.parametrize("k", [0, -1, 2.0, True])
def test_bad_k_raises(k: int) -> None:
    logits, key_norm, positions = rand_inputs(0, 2, 2, 8)
    with pytest.raises(HarnessError, match=r"k must be an integer >= 1"):
        sfi_select(logits, key_norm, positions, k)


def test_mismatched_shapes_raise() -> None:
    logits, key_norm, positions = rand_inputs(0, 2, 2, 8)
    with pytest.raises(HarnessError, match="shapes disagree"):
        sfi_select(logits, key_norm[:, :5], positions, 3)
    with pytest.raises(HarnessError, match="expected logits"):
        sfi_select(logits[0], key_norm, positions, 3)


@pytest.mark.parametrize("k", [1, 7, 40, 64])
def test_a_batched_call_selects_as_one_call_per_layer(k):
    """Leading batch dimensions (the layers of one step) select exactly as separate calls would."""
    gen = torch.Generator().manual_seed(k)
    layers, hkv, rows, m = 4, 3, 5, 50
    logits = torch.randn(layers, hkv, rows, m, generator=gen) * 3
    logits[1, :, :, 10:14] = 2.0  # ties inside one layer
    norms = torch.rand(layers, hkv, m, generator=gen) + 0.5
    positions = torch.arange(m) * 2 + 4
    batched = sfi_select(logits, norms, positions, k, REPO)
    assert batched.selected.shape == (layers, hkv, min(k, m))
    for layer in range(layers):
        one = sfi_select(logits[layer], norms[layer], positions, k, REPO)
        assert torch.equal(batched.selected[layer], one.selected)
        torch.testing.assert_close(batched.scores[layer], one.scores, rtol=0, atol=1e-6)
        torch.testing.assert_close(batched.lambda_star[layer], one.lambda_star, rtol=0, atol=1e-7)
    empty = sfi_select(logits[..., :0], norms[..., :0], positions[:0], k)
    assert empty.selected.shape == (layers, hkv, 0) and empty.lambda_star.shape == (layers, hkv)
