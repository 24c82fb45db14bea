"""FAFO's block layout for one forward (FAFO §4.4, App. E, Fig. 4).

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
  own stream, the root when `fumble_sees_last` (ours; Fig. 4 suggests yes) and only the COMPRESSED
  region of the cache (the KV policy's selection): these are the restricted rows.

With `align` (the flex backend), dummy rows (the root token, seeing only themselves, never read) pad
the verification part and the whole block to multiples of `align`, the FlexAttention query-tile size:
every tile is then purely verification (reads the whole cache) or purely fumble (reads only the
compressed region), and no tile is partial (torch 2.13's CPU flex template also fails to compile
when the block is not a multiple of its query tile).

Logits are computed only for the rows that are read (the LM head is the largest GEMM of a small
model): the root and every candidate row (verification; logits row == block row there), and the LAST
row of each stream (its next token, Eq. 1). `cand_rows[j, t]` maps candidate j token t to its row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from decoders.verify import candidate_slices

Candidates = torch.Tensor | Sequence[Sequence[int]]  # [g, k]: a host tensor or the pool's tuples


def _table(cands: Candidates) -> Sequence[Sequence[int]]:
    return cands.tolist() if isinstance(cands, torch.Tensor) else cands


@dataclass
class FafoLayout:
    block_mask: torch.Tensor  # bool [N, N] visibility inside the block
    offsets: torch.Tensor  # long [N] position of each row: root/candidates relative to p, streams to base
    is_stream: torch.Tensor  # bool [N] fumble rows (restricted to the compressed region)
    logits_rows: torch.Tensor  # long: rows 0..s0-1 (root + candidates), then each stream's last row
    cand_rows: torch.Tensor  # long [g, k] (cpu): block row of candidate j's token t
    cand_tokens: list[int]  # token of each candidate row (rows 1..c)
    k: int
    n: int  # streams in the block (0 for a verification-only forward)
    stream_row: int  # first block row of the fumble streams (after any padding rows)
    cand_row_ids: list[list[int]] | None = None  # `cand_rows` as Python ints (commits read no tensor)
    size: int = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        if self.cand_row_ids is None:
            self.cand_row_ids = self.cand_rows.tolist()
        self.size = self.block_mask.shape[0]  # rows; a plain int, read several times a step

    def flat_first(self, g: int) -> int | None:
        """The first candidate row when the first `g` candidates sit at rows `first + j*k + t` (a flat
        layout; with no candidates, any row), else None (a tree)."""
        rows = self.cand_row_ids
        assert rows is not None
        if not g:
            return 1
        first = rows[0][0]
        return first if rows[g - 1][-1] == first + g * self.k - 1 else None

    def candidate_rows(self, values: list, g: int) -> list[list]:
        """`values[cand_rows[j, t]]` for the first `g` candidates (slices where the rows are consecutive,
        as in a flat layout)."""
        first = self.flat_first(g)
        if first is not None:
            return candidate_slices(values, first, g, self.k)
        assert self.cand_row_ids is not None
        return [[values[r] for r in row] for row in self.cand_row_ids[:g]]

    def tokens(self, root: int, streams: list[int] | None) -> list[int]:
        """Block tokens: root, candidates, padding (root), streams column-wise, padding."""
        c = len(self.cand_tokens)
        mid = self.stream_row - 1 - c
        tail = self.size - self.stream_row - self.n * self.k
        out = [root, *self.cand_tokens, *[root] * mid]
        if self.n:
            assert streams is not None
            out += streams
        return out + [root] * tail


def _round_up(x: int, align: int) -> int:
    return -(-x // align) * align if align > 1 else x


def _assemble(
    k: int,
    n: int,
    cand_mask: torch.Tensor,
    cand_depth: torch.Tensor,
    cand_rows: torch.Tensor,
    cand_tokens: list[int],
    sees_last: bool,
    device: torch.device | str,
    align: int = 0,
) -> FafoLayout:
    """Root + candidate part (`cand_mask [c, c]` over the candidate rows) + the stream part."""
    v = 1 + cand_mask.shape[0]  # verification rows
    s0 = _round_up(v, align) if n else v
    end = s0 + n * k
    size = _round_up(end, align)
    mask = torch.zeros(size, size, dtype=torch.bool)
    mask[:v, 0] = True
    mask[1:v, 1:v] = cand_mask
    if n:
        tril = torch.ones(k, k, dtype=torch.long).tril()
        # row (r, i) = s0 + r*n + i sees (r', i) for r' <= r: same column, earlier rows
        mask[s0:end, s0:end] = torch.kron(tril, torch.eye(n, dtype=torch.long)).bool()
        mask[s0:end, 0] = sees_last
    pads = torch.cat([torch.arange(v, s0), torch.arange(end, size)])
    mask[pads, pads] = True  # padding rows see only themselves
    offsets = torch.zeros(size, dtype=torch.long)
    offsets[1:v] = cand_depth
    offsets[s0:end] = torch.arange(1, k + 1).repeat_interleave(n)
    is_stream = torch.zeros(size, dtype=torch.bool)
    is_stream[s0:] = True
    rows = torch.cat([torch.arange(v), s0 + (k - 1) * n + torch.arange(n)])
    # made once per shape; a non-blocking copy does not synchronise the stream
    dev = [t.to(device, non_blocking=True) for t in (mask, offsets, is_stream, rows)]
    return FafoLayout(*dev, cand_rows, cand_tokens, k, n, s0)


def build_layout(
    k: int, g: int, n: int, fumble_sees_last: bool = True, device: torch.device | str = "cpu", align: int = 0
) -> FafoLayout:
    """Flat layout with `g` candidates and `n` streams (either may be 0; FAFO-2forward uses one each).
    `cand_tokens` is left empty: the caller supplies the candidates' tokens in row order."""
    tril = torch.ones(k, k, dtype=torch.long).tril()
    cand_mask = torch.kron(torch.eye(g, dtype=torch.long), tril).bool()
    depth = torch.arange(1, k + 1).repeat(g)
    cand_rows = 1 + torch.arange(g * k).view(g, k)
    return _assemble(k, n, cand_mask, depth, cand_rows, [], fumble_sees_last, device, align)


@dataclass(frozen=True)
class Trie:
    """Prefix trie of `g` candidates of `k` tokens: one node per distinct candidate prefix, parents
    first. `parent[node]` (-1: the root x_last) fixes the layout's structure; `tokens` and `rows`
    (block row of candidate j's token t) fill it in."""

    parent: tuple[int, ...]
    tokens: list[int]
    rows: list[list[int]]

    @classmethod
    def of(cls, cands: Candidates) -> Trie:
        table = _table(cands)
        k = len(table[0]) if len(table) else 0
        index: dict[tuple[int, ...], int] = {}
        parent: list[int] = []
        tokens: list[int] = []
        rows = [[0] * k for _ in range(len(table))]
        for j, cand in enumerate(table):
            up = -1
            for t in range(k):
                key = tuple(cand[: t + 1])
                node = index.get(key)
                if node is None:
                    node = index[key] = len(parent)
                    parent.append(up)
                    tokens.append(cand[t])
                rows[j][t] = 1 + node
                up = node
        return cls(tuple(parent), tokens, rows)

    def fill(self, lay: FafoLayout) -> FafoLayout:
        """`lay` (this trie's structure) with this trie's candidate tokens and rows."""
        cand_rows = torch.tensor(self.rows, dtype=torch.long).view(len(self.rows), lay.k)
        return dataclasses.replace(lay, cand_rows=cand_rows, cand_tokens=self.tokens, cand_row_ids=self.rows)


def _tree_structure(
    parent: tuple[int, ...], k: int, n: int, fumble_sees_last: bool, device: torch.device | str
) -> FafoLayout:
    """The layout of a trie with these parents (candidate rows and tokens left empty)."""
    c = len(parent)
    cand_mask = torch.zeros(c, c, dtype=torch.bool)
    depth = [0] * c
    for node, up in enumerate(parent):  # parents come first: ancestors = parent's ancestors + self
        if up >= 0:
            cand_mask[node] = cand_mask[up]
            depth[node] = depth[up]
        cand_mask[node, node] = True
        depth[node] += 1
    depths = torch.tensor(depth, dtype=torch.long)
    empty = torch.zeros(0, k, dtype=torch.long)
    return _assemble(k, n, cand_mask, depths, empty, [], fumble_sees_last, device)


def build_tree_layout(
    cands: Candidates, n: int, fumble_sees_last: bool = True, device: torch.device | str = "cpu"
) -> FafoLayout:
    """Prefix-trie layout of `cands [g, k]`: one row per distinct candidate prefix."""
    trie = Trie.of(cands)
    k = len(trie.rows[0]) if trie.rows else 0
    return trie.fill(_tree_structure(trie.parent, k, n, fumble_sees_last, device))


MAX_TREE_LAYOUTS = 64  # trie structures kept: small presets repeat a few dozen; k 6 m 40 ones (~0.25 MB
# of mask each) rarely repeat, so the bound keeps their cost under ~16 MB


class LayoutCache:
    """Layouts built once and reused: flat ones by (g, n), tree ones by (trie structure, n); each
    step only fills in its candidates' tokens (and, for a tree, their rows)."""

    def __init__(
        self, k: int, fumble_sees_last: bool, device: torch.device | str, tree: bool = False, align: int = 0
    ) -> None:
        self.k, self.fumble_sees_last, self.device, self.tree = k, fumble_sees_last, device, tree
        self.align = align
        self._cache: dict[tuple[int, int], FafoLayout] = {}
        self._trees: dict[tuple[tuple[int, ...], int], FafoLayout] = {}

    def get(self, cands: Candidates, n: int) -> FafoLayout:
        """Layout for the block candidates `cands [g, k]` and `n` streams, with `cand_tokens` set."""
        if self.tree and len(cands):
            trie = Trie.of(cands)
            lay = self._trees.get((trie.parent, n))
            if lay is None:
                lay = _tree_structure(trie.parent, self.k, n, self.fumble_sees_last, self.device)
                if len(self._trees) >= MAX_TREE_LAYOUTS:  # bounded: drop the oldest structure
                    del self._trees[next(iter(self._trees))]
                self._trees[(trie.parent, n)] = lay
            return trie.fill(lay)
        g = len(cands)
        lay = self._cache.get((g, n))
        if lay is None:
            lay = build_layout(self.k, g, n, self.fumble_sees_last, self.device, self.align)
            self._cache[(g, n)] = lay
        # a shallow copy by hand: dataclasses.replace reruns __post_init__, copy.copy goes through pickling
        filled = object.__new__(FafoLayout)
        filled.__dict__.update(lay.__dict__)
        filled.cand_tokens = [t for cand in _table(cands) for t in cand]
        return filled
