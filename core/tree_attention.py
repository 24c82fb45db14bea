"""LongSpec's Hybrid Tree Attention (LongSpec Sec. 3.3, App. C): a tree block attends to the cached
prefix and to itself separately, and the two halves are merged exactly through their log-sum-exps.

With scores s over the cache (no mask: every tree node sees the whole committed prefix) and over the
block (the tree's ancestor mask), per query row:
    (O_c, LSE_c) = attention over the cache,  (O_s, LSE_s) = masked attention over the block,
    LSE = logaddexp(LSE_c, LSE_s),  O = O_c * exp(LSE_c - LSE) + O_s * exp(LSE_s - LSE)
which equals one softmax over [cache | block] (softmax is a ratio of sums of exponentials; the two
halves are partial sums). The cache half needs no mask at all, which is what lets a GPU serve it with
an unmasked kernel; here both halves are plain fp32 matmuls (the CPU reference), cast back at the end.

`HybridTreeView` has the two-method shape of every attention view (`core.attention`): `attend(layer, q,
k, v)` with q `[1, H, n, d]` and k/v `[1, H_kv, L + n, d]` (cache slots then the block), and
`kv_read(cache_len)`. `backend="hybrid"` is the paper's split (two partial attentions merged through
their LSEs); `backend="masked"` is the same function as one SDPA over [cache | block] with the mask
(cache columns all visible): several times faster on CPU, where no unmasked kernel is gained by the
split; a small float32 block over a long CPU cache takes `core.attention.few_rows_attention` instead of
SDPA (the same function, its GQA heads grouped). GQA: the H query heads are grouped over the H_kv
key/value heads (query head h reads KV head h // (H / H_kv), as `repeat_interleave` of the KV heads
would give, without the copy).
"""

from __future__ import annotations

import torch

from core.attention import ViewKind, few_rows_applies, few_rows_attention, one_row_attention, sdpa

BACKENDS = ("hybrid", "masked")


def attention_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 attention of q `[H, n, d]` over k/v `[H_kv, m, d]` (GQA grouped) with an optional boolean
    mask `[n, m]` (True = visible). Returns the output `[H, n, d]` and the log-sum-exp of the scaled
    scores `[H, n]` (-inf for a row that sees nothing; its output is then 0)."""
    h, n, d = q.shape
    hkv = k.shape[0]
    g = h // hkv
    qg = q.float().reshape(hkv, g * n, d)
    scores = torch.matmul(qg, k.float().transpose(1, 2)) * scale  # [H_kv, g*n, m]
    if mask is not None:
        visible = mask.to(scores.device).repeat(g, 1)  # rows are (group member, query) pairs
        scores = scores.masked_fill(~visible, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1, keepdim=True)  # [H_kv, g*n, 1]
    probs = torch.exp(scores - lse.masked_fill(torch.isinf(lse), 0.0))
    out = torch.matmul(probs, v.float())  # [H_kv, g*n, d]
    return out.reshape(h, n, d), lse.reshape(h, n)


def merge_attention(
    o_c: torch.Tensor, lse_c: torch.Tensor, o_s: torch.Tensor, lse_s: torch.Tensor
) -> torch.Tensor:
    """Exact merge of two partial attentions over disjoint key sets (outputs `[H, n, d]`, LSEs `[H, n]`)."""
    lse = torch.logaddexp(lse_c, lse_s)
    w_c = torch.exp(lse_c - lse).unsqueeze(-1)
    w_s = torch.exp(lse_s - lse).unsqueeze(-1)
    return o_c * w_c + o_s * w_s


class HybridTreeView:
    """Attention view for a tree block: the whole cache visible, `tree_mask` `[n, n]` (True = may attend;
    every node must see itself) over the block; the two halves merged through their log-sum-exps."""

    def __init__(
        self, tree_mask: torch.Tensor, scale: float, backend: str = "hybrid", check_diagonal: bool = True
    ) -> None:
        """`check_diagonal=False`: the caller built the mask with a True diagonal (the check reads the
        mask back to the host: a device sync per step)."""
        if backend not in BACKENDS:
            raise ValueError(f"tree attention backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
        self.backend = backend
        self._full_mask: torch.Tensor | None = None
        if tree_mask.dim() != 2 or tree_mask.shape[0] != tree_mask.shape[1]:
            raise ValueError(f"tree_mask must be a square [n, n] matrix, got shape {tuple(tree_mask.shape)}")
        if check_diagonal and not bool(tree_mask.to(torch.bool).diagonal().all()):
            raise ValueError("tree_mask must let every node see itself (a True diagonal)")
        self.tree_mask = tree_mask.to(torch.bool)
        self.scale = scale

    @property
    def kind(self) -> ViewKind:
        """The masked backend is `BlockView`'s attention (whole cache, `block_mask` inside the block), so
        `run.cuda_graphs` can replay it; the hybrid split stays on the regular forward."""
        return ViewKind.WHOLE_CACHE_BLOCK if self.backend == "masked" else ViewKind.REGULAR

    @property
    def block_mask(self) -> torch.Tensor:
        return self.tree_mask

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        n = q.shape[2]
        cache_len = k.shape[2] - n
        if self.tree_mask.shape[0] != n:
            raise ValueError(f"tree mask is for {self.tree_mask.shape[0]} nodes, the block has {n}")
        if self.backend == "masked":
            if n == 1:  # the root alone sees the whole cache and itself: a decode step's attention
                return one_row_attention(q, k, v, self.scale)
            if few_rows_applies(q, k):  # CPU float32, a small tree over a long cache
                return few_rows_attention(q, k, v, self.tree_mask, self.scale)
            if self._full_mask is None or self._full_mask.shape[1] != cache_len + n:
                mask = torch.ones(n, cache_len + n, dtype=torch.bool, device=q.device)
                mask[:, cache_len:] = self.tree_mask.to(q.device)
                self._full_mask = mask
            return sdpa(q, k, v, self._full_mask, self.scale)
        q0, k0, v0 = q[0], k[0], v[0]
        o_s, lse_s = attention_lse(q0, k0[:, cache_len:], v0[:, cache_len:], self.scale, self.tree_mask)
        if cache_len == 0:
            return o_s.to(q.dtype).unsqueeze(0)
        o_c, lse_c = attention_lse(q0, k0[:, :cache_len], v0[:, :cache_len], self.scale)
        return merge_attention(o_c, lse_c, o_s, lse_s).to(q.dtype).unsqueeze(0)

    def kv_read(self, cache_len: int) -> int:
        return cache_len
