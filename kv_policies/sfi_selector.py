"""SFI (Slow-Fast Inference) selector: which K candidate positions each KV head keeps (SFI paper, Alg. 2).

Pure functions over ONE layer; the caller has already removed the sinks and the recent tokens, so the
M candidates `J` are what is left, listed by ascending absolute position (not necessarily contiguous).
Per KV head h:

1. Evidence `f`: each of the R window rows τ (GQA: the G query heads of the KV head count as extra rows,
   R = G * W) gives a softmax `p_τ` over the candidates; the rows are pooled with a power mean,
   `μ(j) = mean_τ p_τ(j)^α`, and `f(j) = μ(j)^(1/α) / Σ_i μ(i)^(1/α)`. α < 1 rewards a candidate that
   several rows attend to over one that a single row attends to strongly; with one row `f = p`.
2. Prior `r`: small keys and old positions are favoured a priori.
   `π_kn(j) ∝ (‖k_j‖ + eps)^(-γ)`; with `u(j) = (pos_j - min pos) / (max pos - min pos + eps)` in [0, 1],
   `π_pos(j) ∝ exp(-β u^p) (1 - u + eps)^η`; `log r = w_kn log π_kn + w_pos log π_pos`, normalised.
3. Fusion: `s = (1 - λ*) f + λ* r` with `λ* = clip(argmin_λ ‖(1 - λ) f + λ r‖², 0, λ_clip)`, in closed
   form `(‖f‖² - f·r) / ‖f - r‖²`; `λ* = 0` when `f == r` (the objective is then flat in λ).
4. Log score `z = log(s + eps)`.
5. Soft-NMS along the candidate list: `m(j)` = the largest `z` among the candidates whose list index is
   within `nms_window // 2` of j's (clipped at the ends); `z_nms = z - α_soft (m - z)`, so a candidate
   that is not the local maximum is pushed down by its gap to that maximum.
6. Cross-head exclusivity: `r_h(j)` = softmax over the KV heads of `z_nms(j) / T`;
   `z_adj = z_nms + α_cross log(max(r_h(j), eps))`, so heads that score a candidate lower than other
   heads do are discouraged from also keeping it.
7. Selection: the top K of `z_adj` per head (every candidate when K >= M). Ties are broken by
   `torch.topk`, which is deterministic for a given device and input.

Everything is computed in float32 whatever the input dtype, and vectorised over heads and candidates.
Leading batch dimensions (e.g. the layers of one step, `[n_layers, H_kv, ...]`) select for each batch
entry independently, exactly as separate calls would; one batched call saves the per-call overhead.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from core.types import HarnessError

# ‖f - r‖² at or below this means f == r up to rounding: the fusion objective is flat and λ* = 0.
_FLAT_DENOMINATOR = 1e-30


@dataclass(frozen=True)
class SelectorConfig:
    """Hyper-parameters of the selector; invalid values raise `HarnessError` on construction.

    lambda_clip: largest weight λ* the prior may get in the fusion, in [0, 1].
    alpha_soft: strength of the soft-NMS penalty, >= 0 (0 disables it).
    alpha_cross: strength of the cross-head exclusivity term, >= 0 (0 disables it).
    power_alpha: exponent α of the power mean that pools the window rows, in (0, 1] (1 = plain mean).
    gamma: exponent of the key-norm prior `(‖k‖ + eps)^(-gamma)`.
    beta, p: decay `exp(-beta u^p)` of the position prior over the normalised position u.
    eta: exponent of the end factor `(1 - u + eps)^eta` of the position prior.
    prior_w_kn, prior_w_pos: weights of the key-norm and position priors in `log r`.
    nms_window: width of the soft-NMS neighbourhood (half-width `nms_window // 2`), >= 1.
    cross_temp: temperature T of the cross-head softmax, > 0.
    eps: floor inside logs and denominators.
    """

    lambda_clip: float = 0.02
    alpha_soft: float = 0.5
    alpha_cross: float = 0.35
    power_alpha: float = 0.5
    gamma: float = 0.5
    beta: float = 0.5676  # -ln(0.6) / 0.9
    p: float = 1.8
    eta: float = 0.4
    prior_w_kn: float = 1.0
    prior_w_pos: float = 0.7
    nms_window: int = 32
    cross_temp: float = 2.0
    eps: float = 1e-8

    def __post_init__(self) -> None:
        def bad(field: str, valid: str) -> HarnessError:
            return HarnessError(f"sfi selector: {field} must be {valid}, got {getattr(self, field)!r}")

        if not 0.0 <= self.lambda_clip <= 1.0:
            raise bad("lambda_clip", "in [0, 1]")
        if not self.alpha_soft >= 0.0:
            raise bad("alpha_soft", ">= 0")
        if not self.alpha_cross >= 0.0:
            raise bad("alpha_cross", ">= 0")
        if not 0.0 < self.power_alpha <= 1.0:
            raise bad("power_alpha", "in (0, 1]")
        if isinstance(self.nms_window, bool) or not isinstance(self.nms_window, int) or self.nms_window < 1:
            raise bad("nms_window", "an integer >= 1")
        if not self.cross_temp > 0.0:
            raise bad("cross_temp", "> 0")
        if not self.eps > 0.0:
            raise bad("eps", "> 0")


# The paper's fusion / NMS / exclusivity strengths; the values the paper does not give are the repo's.
PAPER = SelectorConfig()
# The reference repository's values.
REPO = SelectorConfig(lambda_clip=0.25, alpha_soft=1.0, alpha_cross=0.85, eps=1e-12)


@dataclass
class SelectorResult:
    """What `sfi_select` chose for one layer.

    selected: long `[..., H_kv, min(k, M)]`, indices into the candidate list, ascending per head.
    lambda_star: float32 `[..., H_kv]`, the prior's weight λ* in the fusion of each head.
    scores: float32 `[..., H_kv, M]`, the final scores `z_adj` the top-k was taken over.
    (`...`: the batch dimensions of the input, none for one layer.)
    """

    selected: torch.Tensor
    lambda_star: torch.Tensor
    scores: torch.Tensor


def evidence(logits: torch.Tensor, power_alpha: float) -> torch.Tensor:
    """Evidence `f [..., H_kv, M]`: the power mean (exponent `power_alpha`) over the R rows of the
    softmaxes of `logits [..., H_kv, R, M]` over the candidates, renormalised to sum to 1 per head."""
    probs = logits.float().softmax(-1)
    if logits.shape[-2] == 1:  # one row: the power mean is the row itself
        pooled = probs[..., 0, :]
    else:
        pooled = probs.pow(power_alpha).mean(-2).pow(1.0 / power_alpha)
    return pooled / pooled.sum(-1, keepdim=True)


def prior(key_norm: torch.Tensor, positions: torch.Tensor, cfg: SelectorConfig) -> torch.Tensor:
    """Prior `r [..., H_kv, M]` (sums to 1 per head) from the key norms `[..., H_kv, M]` and the
    candidates' absolute positions `[M]`: small keys and early positions weigh more (module docstring,
    step 2)."""
    log_kn = -cfg.gamma * torch.log(key_norm.float() + cfg.eps)
    log_kn = log_kn - log_kn.logsumexp(-1, keepdim=True)
    # The position prior is one [M] vector shared by the heads; it is computed in float64 because
    # `1 - u + eps` at the last candidate is about eps, below float32's resolution around u = 1.
    pos = positions.to(device=key_norm.device, dtype=torch.float64)
    u = (pos - pos.min()) / (pos.max() - pos.min() + cfg.eps)
    log_pos = -cfg.beta * u.pow(cfg.p) + cfg.eta * torch.log(1.0 - u + cfg.eps)
    log_pos = (log_pos - log_pos.logsumexp(-1, keepdim=True)).float()
    log_r = cfg.prior_w_kn * log_kn + cfg.prior_w_pos * log_pos
    return log_r.softmax(-1)


def fuse(f: torch.Tensor, r: torch.Tensor, lambda_clip: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused distribution `s [..., H_kv, M]` and weight `λ* [..., H_kv]`: λ* minimises
    `‖(1 - λ) f + λ r‖²` over λ in [0, lambda_clip] (closed form, clipped); 0 where `f == r`."""
    f, r = f.float(), r.float()
    num = (f * f).sum(-1) - (f * r).sum(-1)
    den = (f - r).pow(2).sum(-1)
    flat = den <= _FLAT_DENOMINATOR
    lam = torch.where(flat, torch.zeros_like(num), num / torch.where(flat, torch.ones_like(den), den))
    lam = lam.clamp(0.0, lambda_clip)
    return (1.0 - lam)[..., None] * f + lam[..., None] * r, lam


def soft_nms(z: torch.Tensor, nms_window: int, alpha_soft: float) -> torch.Tensor:
    """Soft-NMS of the scores `z [..., H_kv, M]` along the candidate list: `z - alpha_soft (m - z)` where
    `m(j)` is the largest z within `nms_window // 2` list entries of j (the window is clipped at the
    ends)."""
    m_len = z.shape[-1]
    half = min(nms_window // 2, max(m_len - 1, 0))  # a wider window sees nothing more
    padded = F.pad(z.reshape(-1, 1, m_len), (half, half), value=float("-inf"))
    local_max = F.max_pool1d(padded, kernel_size=2 * half + 1, stride=1).view(z.shape)
    return z - alpha_soft * (local_max - z).clamp_min(0.0)


def cross_head(z_nms: torch.Tensor, alpha_cross: float, cross_temp: float, eps: float) -> torch.Tensor:
    """Cross-head exclusivity: `z_nms + alpha_cross log(max(r_h, eps))` where `r_h(j)` is the softmax over
    the KV heads (dim -2 of `z_nms [..., H_kv, M]`) of `z_nms(j) / cross_temp`."""
    log_share = torch.log_softmax(z_nms / cross_temp, dim=-2).clamp_min(math.log(eps))
    return z_nms + alpha_cross * log_share


def sfi_select(
    logits: torch.Tensor,
    key_norm: torch.Tensor,
    positions: torch.Tensor,
    k: int,
    cfg: SelectorConfig = PAPER,
) -> SelectorResult:
    """Choose `min(k, M)` candidates per KV head for one layer (SFI Alg. 2; module docstring), or for
    each entry of leading batch dimensions `...` (e.g. every layer of a step) in one call.

    logits: `[..., H_kv, R, M]` attention logits `q·k_j / sqrt(d)` of the R window rows over the M
      candidates.
    key_norm: `[..., H_kv, M]` the candidates' key norms `‖k_j‖₂`.
    positions: long `[M]` the candidates' absolute positions, ascending (shared by the batch).
    k: how many candidates each head keeps (every candidate when k >= M).
    """
    try:
        k_int = operator.index(k)  # any integer type (Python, NumPy), not a float or a bool
    except TypeError:
        k_int = None
    if isinstance(k, bool) or k_int is None or k_int <= 0:
        raise HarnessError(f"sfi selector: k must be an integer >= 1, got {k!r}")
    k = k_int
    if logits.dim() < 3 or key_norm.dim() != logits.dim() - 1 or positions.dim() != 1:
        raise HarnessError(
            "sfi selector: expected logits [..., H_kv, R, M], key_norm [..., H_kv, M], positions [M], "
            f"got {tuple(logits.shape)}, {tuple(key_norm.shape)}, {tuple(positions.shape)}"
        )
    heads, m_len = logits.shape[:-2], logits.shape[-1]
    if key_norm.shape != (*heads, m_len) or positions.shape[0] != m_len:
        raise HarnessError(
            "sfi selector: shapes disagree: logits "
            f"{tuple(logits.shape)}, key_norm {tuple(key_norm.shape)}, positions {tuple(positions.shape)}"
        )
    device = logits.device
    if m_len == 0:
        empty = torch.zeros(*heads, 0, device=device)
        return SelectorResult(empty.long(), torch.zeros(heads, device=device), empty)

    f = evidence(logits, cfg.power_alpha)
    r = prior(key_norm.to(device), positions, cfg)
    s, lam = fuse(f, r, cfg.lambda_clip)
    z = torch.log(s + cfg.eps)
    z_nms = soft_nms(z, cfg.nms_window, cfg.alpha_soft)
    scores = cross_head(z_nms, cfg.alpha_cross, cfg.cross_temp, cfg.eps)
    if k >= m_len:
        selected = torch.arange(m_len, device=device).expand(*heads, m_len).clone()
    else:
        # the top k in ascending index order: sorting the k indices has a fixed output size, so the
        # host never waits for it (a mask's `nonzero` would), and it is the faster of the two here
        selected = scores.topk(k, dim=-1, sorted=False).indices.sort(dim=-1).values
    return SelectorResult(selected, lam, scores)


def selected_positions(result: SelectorResult, positions: torch.Tensor) -> torch.Tensor:
    """Absolute positions `[H_kv, min(k, M)]` of the selected candidates (ascending per head)."""
    return positions.to(result.selected.device)[result.selected]
