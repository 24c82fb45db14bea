"""FAFO's block layout for one forward (FAFO v000 §4.4, App. E, Fig. 4; seed-specs 1.3).

Block rows, in order:
- row 0: the root x_last (the last committed token, its KV not cached yet), position p;
- g candidate k-grams from the Find-Out pool, candidate j token t at row 1 + j*k + t, position
  p + 1 + t; causal within its own candidate, sees the root and the FULL cache (verification);
- n fumble streams of k tokens in Lookahead's column-wise layout (App. E): token r of stream i at
  row s0 + r*n + i (s0 = 1 + g*k), position base + 1 + r; it sees the earlier tokens of its own
  stream, the root when `fumble_sees_last` ([H], Fig. 4 suggests yes) and only the COMPRESSED
  region of the cache (the KV policy's selection): these are the restricted rows.

Logits are computed only for the rows that are read (cf. cpu-lab.md §3: the LM head is the largest
GEMM of a small model): the root and every candidate row (verification), and the LAST row of each
stream (its next token, Eq. 1). Layouts are cached per (g, streams) since g varies step to step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class FafoLayout:
    block_mask: torch.Tensor  # bool [N, N] visibility inside the block
    offsets: torch.Tensor  # long [N] position of each row: root/candidates relative to p, streams to base
    is_stream: torch.Tensor  # bool [N] fumble rows (restricted to the compressed region)
    logits_rows: torch.Tensor  # long: root + candidate rows, then each stream's last row
    g: int  # candidates
    k: int
    n: int  # streams in the block (0 for a verification-only forward)

    @property
    def size(self) -> int:
        return self.block_mask.shape[0]

    @property
    def stream_row(self) -> int:
        """First block row of the fumble streams."""
        return 1 + self.g * self.k

    @property
    def n_verify(self) -> int:
        """Logits rows (and block rows) of the verification part: the root and the candidates."""
        return 1 + self.g * self.k


def build_layout(
    k: int, g: int, n: int, fumble_sees_last: bool = True, device: torch.device | str = "cpu"
) -> FafoLayout:
    """Layout with `g` candidates and `n` streams (either may be 0; FAFO-2forward uses one each)."""
    s0 = 1 + g * k
    size = s0 + n * k
    tril = torch.ones(k, k, dtype=torch.long).tril()
    mask = torch.zeros(size, size, dtype=torch.bool)
    mask[:s0, 0] = True
    if g:
        mask[1:s0, 1:s0] = torch.kron(torch.eye(g, dtype=torch.long), tril).bool()
    if n:
        # row (r, i) = s0 + r*n + i sees (r', i) for r' <= r: same column, earlier rows
        mask[s0:, s0:] = torch.kron(tril, torch.eye(n, dtype=torch.long)).bool()
        mask[s0:, 0] = fumble_sees_last
    steps = torch.arange(1, k + 1)
    offsets = torch.cat([torch.zeros(1, dtype=torch.long), steps.repeat(g), steps.repeat_interleave(n)])
    is_stream = torch.zeros(size, dtype=torch.bool)
    is_stream[s0:] = True
    rows = torch.cat([torch.arange(s0), s0 + (k - 1) * n + torch.arange(n)])
    return FafoLayout(mask.to(device), offsets.to(device), is_stream.to(device), rows.to(device), g, k, n)


class LayoutCache:
    """Layouts by (g, n): built once, reused every step with the same shape."""

    def __init__(self, k: int, fumble_sees_last: bool, device: torch.device | str) -> None:
        self.k, self.fumble_sees_last, self.device = k, fumble_sees_last, device
        self._cache: dict[tuple[int, int], FafoLayout] = {}

    def get(self, g: int, n: int) -> FafoLayout:
        lay = self._cache.get((g, n))
        if lay is None:
            lay = self._cache[(g, n)] = build_layout(self.k, g, n, self.fumble_sees_last, self.device)
        return lay
