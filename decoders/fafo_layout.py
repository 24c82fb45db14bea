"""FAFO's block layout for one forward (FAFO v000 §4.4, App. E, Fig. 4; seed-specs 1.3).

Block rows, in order:
- row 0: the root x_last (the last committed token, its KV not cached yet), position p;
- the Find-Out candidates (verification): candidate token t of a k-gram at position p + 1 + t,
  seeing the root, the earlier tokens of its candidate and the FULL cache. Two layouts:
  * `flat` (the paper's, Fig. 4): candidate j token t at row 1 + j*k + t, causal within its candidate;
  * `tree` [H, ours]: candidates sharing a prefix share its rows (a prefix trie, SpecInfer-style);
    every row sees its ancestors. Each row's context is exactly its candidate prefix, so the logits are
    the same as in the flat layout and verification is unchanged (lossless), with fewer rows;
- n fumble streams of k tokens in Lookahead's column-wise layout (App. E): token r of stream i at
  row s0 + r*n + i (s0 = first stream row), position base + 1 + r; it sees the earlier tokens of its
  own stream, the root when `fumble_sees_last` ([H], Fig. 4 suggests yes) and only the COMPRESSED
  region of the cache (the KV policy's selection): these are the restricted rows.

Logits are computed only for the rows that are read (the LM head is the largest GEMM of a small
model): the root and every candidate row (verification; logits row == block row there), and the LAST
row of each stream (its next token, Eq. 1). `cand_rows[j, t]` maps candidate j token t to its row.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class FafoLayout:
    block_mask: torch.Tensor  # bool [N, N] visibility inside the block
    offsets: torch.Tensor  # long [N] position of each row: root/candidates relative to p, streams to base
    is_stream: torch.Tensor  # bool [N] fumble rows (restricted to the compressed region)
    logits_rows: torch.Tensor  # long: rows 0..s0-1 (root + candidates), then each stream's last row
    cand_rows: torch.Tensor  # long [g, k] (cpu): block row of candidate j's token t
    cand_tokens: torch.Tensor  # long [s0 - 1] (cpu): token of each candidate row
    k: int
    n: int  # streams in the block (0 for a verification-only forward)

    @property
    def size(self) -> int:
        return self.block_mask.shape[0]

    @property
    def stream_row(self) -> int:
        """First block row of the fumble streams (= rows of the verification part)."""
        return self.size - self.n * self.k


def _assemble(
    k: int,
    n: int,
    cand_mask: torch.Tensor,
    cand_depth: torch.Tensor,
    cand_rows: torch.Tensor,
    cand_tokens: torch.Tensor,
    sees_last: bool,
    device: torch.device | str,
) -> FafoLayout:
    """Root + candidate part (`cand_mask [c, c]` over the candidate rows) + the stream part."""
    c = cand_mask.shape[0]
    s0 = 1 + c
    size = s0 + n * k
    mask = torch.zeros(size, size, dtype=torch.bool)
    mask[:s0, 0] = True
    mask[1:s0, 1:s0] = cand_mask
    if n:
        tril = torch.ones(k, k, dtype=torch.long).tril()
        # row (r, i) = s0 + r*n + i sees (r', i) for r' <= r: same column, earlier rows
        mask[s0:, s0:] = torch.kron(tril, torch.eye(n, dtype=torch.long)).bool()
        mask[s0:, 0] = sees_last
    offsets = torch.cat(
        [torch.zeros(1, dtype=torch.long), cand_depth, torch.arange(1, k + 1).repeat_interleave(n)]
    )
    is_stream = torch.zeros(size, dtype=torch.bool)
    is_stream[s0:] = True
    rows = torch.cat([torch.arange(s0), s0 + (k - 1) * n + torch.arange(n)])
    return FafoLayout(
        mask.to(device),
        offsets.to(device),
        is_stream.to(device),
        rows.to(device),
        cand_rows,
        cand_tokens,
        k,
        n,
    )


def build_layout(
    k: int, g: int, n: int, fumble_sees_last: bool = True, device: torch.device | str = "cpu"
) -> FafoLayout:
    """Flat layout with `g` candidates and `n` streams (either may be 0; FAFO-2forward uses one each).
    `cand_tokens` is left empty: the caller supplies the candidates' tokens in row order."""
    tril = torch.ones(k, k, dtype=torch.long).tril()
    cand_mask = torch.kron(torch.eye(g, dtype=torch.long), tril).bool()
    depth = torch.arange(1, k + 1).repeat(g)
    cand_rows = 1 + torch.arange(g * k).view(g, k)
    return _assemble(
        k, n, cand_mask, depth, cand_rows, torch.zeros(0, dtype=torch.long), fumble_sees_last, device
    )


def build_tree_layout(
    cands: torch.Tensor, n: int, fumble_sees_last: bool = True, device: torch.device | str = "cpu"
) -> FafoLayout:
    """Prefix-trie layout of `cands [g, k]`: one row per distinct candidate prefix."""
    g, k = cands.shape
    index: dict[tuple[int, ...], int] = {}
    parent: list[int] = []  # candidate-region index of each node's parent (-1: the root)
    tokens: list[int] = []
    depth: list[int] = []
    rows = [[0] * k for _ in range(g)]
    for j, cand in enumerate(cands.tolist()):
        up = -1
        for t in range(k):
            key = tuple(cand[: t + 1])
            node = index.get(key)
            if node is None:
                node = index[key] = len(parent)
                parent.append(up)
                tokens.append(cand[t])
                depth.append(t + 1)
            rows[j][t] = 1 + node
            up = node
    c = len(parent)
    cand_mask = torch.zeros(c, c, dtype=torch.bool)
    for node, up in enumerate(parent):  # parents come first: ancestors = parent's ancestors + self
        if up >= 0:
            cand_mask[node] = cand_mask[up]
        cand_mask[node, node] = True
    return _assemble(
        k,
        n,
        cand_mask,
        torch.tensor(depth, dtype=torch.long),
        torch.tensor(rows, dtype=torch.long).view(g, k),
        torch.tensor(tokens, dtype=torch.long),
        fumble_sees_last,
        device,
    )


class LayoutCache:
    """Flat layouts by (g, n), built once and reused; tree layouts are built per step."""

    def __init__(
        self, k: int, fumble_sees_last: bool, device: torch.device | str, tree: bool = False
    ) -> None:
        self.k, self.fumble_sees_last, self.device, self.tree = k, fumble_sees_last, device, tree
        self._cache: dict[tuple[int, int], FafoLayout] = {}

    def get(self, cands: torch.Tensor, n: int) -> FafoLayout:
        """Layout for the block candidates `cands [g, k]` and `n` streams, with `cand_tokens` set."""
        if self.tree and cands.shape[0]:
            return build_tree_layout(cands, n, self.fumble_sees_last, self.device)
        g = cands.shape[0]
        lay = self._cache.get((g, n))
        if lay is None:
            lay = self._cache[(g, n)] = build_layout(self.k, g, n, self.fumble_sees_last, self.device)
        return FafoLayout(
            lay.block_mask,
            lay.offsets,
            lay.is_stream,
            lay.logits_rows,
            lay.cand_rows,
            cands.reshape(-1),
            lay.k,
            lay.n,
        )
