"""The attention each cached key receives from a set of query rows, summed (H2O's score, "H2O:
Heavy-Hitter Oracle for Efficient Generative Inference of Large Language Models", arXiv 2306.14048)."""

from __future__ import annotations

import torch

from core.attention import softmax_lastdim


def attention_mass(q: torch.Tensor, k: torch.Tensor, scale: float, first_row: int | None) -> torch.Tensor:
    """Attention each key receives, summed over the query rows and the query heads of each KV head:
    q `[H, r, d]`, k `[n_kv_heads, m, d]` -> `[n_kv_heads, m]`. `first_row` (absolute position of
    q's first row, keys at positions 0..m-1) applies the causal mask; None = every key visible."""
    h, r, d = q.shape
    hkv, m, _ = k.shape
    logits = (q.float().reshape(hkv, (h // hkv) * r, d) @ k.float().transpose(1, 2)) * scale
    if first_row is not None:
        rows = (first_row + torch.arange(r, device=k.device)).repeat(h // hkv).view(-1, 1)
        logits = logits.masked_fill(torch.arange(m, device=k.device).view(1, -1) > rows, float("-inf"))
    return softmax_lastdim(logits).sum(1)


def attention_mass_layers(
    q: torch.Tensor, k: torch.Tensor, scale: float, visible: torch.Tensor | None = None
) -> torch.Tensor:
    """`attention_mass` of every layer at once: q `[L, H, r, d]`, k `[L, n_kv_heads, m, d]` ->
    `[L, n_kv_heads, m]`; `visible [L, n_kv_heads, m]` (None: every key) masks keys out of the softmax."""
    n_layers, h, r, d = q.shape
    hkv = k.shape[1]
    logits = (q.float().reshape(n_layers, hkv, (h // hkv) * r, d) @ k.float().transpose(-1, -2)) * scale
    if visible is not None:
        logits.masked_fill_(~visible[:, :, None, :], float("-inf"))
    return softmax_lastdim(logits).sum(2)
