"""LongSpec's draft tree: `Tree` on the host (what acceptance, lookup chains and block=auto edit and
read) and `DraftedTree` on the device (what the beam search fills and verification reads in place)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class Tree:
    """A draft tree as the target's block: row 0 is the root, rows 1.. the nodes (parents first)."""

    tokens: list[int]
    parent: list[int] = field(default_factory=lambda: [-1])
    depth: list[int] = field(default_factory=lambda: [0])
    score: list[float] = field(default_factory=lambda: [0.0])  # cumulative draft log-prob
    children: list[list[int]] = field(default_factory=lambda: [[]])
    drafted: list[bool] = field(default_factory=lambda: [False])  # proposed by the draft model
    lookup: list[int] = field(default_factory=lambda: [0])  # 1-based place in the lookup chain (0: none)
    lookup_key: int = 0  # the lookup chain's matched n-gram length (0: no chain)

    def add(self, token: int, parent: int, score: float, drafted: bool = True, lookup: int = 0) -> int:
        row = len(self.tokens)
        self.tokens.append(token)
        self.parent.append(parent)
        self.depth.append(self.depth[parent] + 1)
        self.score.append(score)
        self.children.append([])
        self.children[parent].append(row)
        self.drafted.append(drafted)
        self.lookup.append(lookup)
        return row

    def add_chain(self, tokens: Sequence[int], key: int) -> None:
        """A lookup chain from the root: a token a node already has as a child is that child (marked),
        the first one it lacks and every later one are new nodes (`lookup_key` = `key`)."""
        self.lookup_key = key if tokens else 0
        node = 0
        for place, token in enumerate(tokens, 1):
            child = next((c for c in self.children[node] if self.tokens[c] == token), None)
            if child is None:
                child = self.add(token, node, self.score[node], drafted=False, lookup=place)
            else:
                self.lookup[child] = place
            node = child

    def path(self, row: int) -> list[int]:
        """The rows from the root down to `row` (inclusive)."""
        out = []
        while row >= 0:
            out.append(row)
            row = self.parent[row]
        return out[::-1]

    def ancestor_mask(self) -> torch.Tensor:
        """bool `[n, n]`: row i may attend to row j iff j is i or one of its ancestors."""
        n = len(self.tokens)
        if not n:
            return torch.zeros(0, 0, dtype=torch.bool)
        rows = bytearray(n * n)  # built as bytes and wrapped once: a tensor write per row costs an operator
        for i in range(n):
            if i:  # a parent's row comes before its children's
                p = self.parent[i]
                rows[i * n : (i + 1) * n] = rows[p * n : (p + 1) * n]
            rows[i * n + i] = 1
        return torch.frombuffer(rows, dtype=torch.bool).view(n, n)


class DraftedTree:
    """A drafted tree on the device, in buffers reused every step: row 0 the root, then each level's
    beam in rank order (parents first). Verification reads it where it is; `host` reads it back once."""

    def __init__(self, capacity: int, window: int, device: torch.device) -> None:
        self.tokens = torch.zeros(capacity, dtype=torch.long, device=device)
        self.parent = torch.full((capacity,), -1, dtype=torch.long, device=device)
        self.score = torch.zeros(capacity, device=device)  # cumulative draft log-prob (float32)
        self.depths = torch.zeros(capacity, dtype=torch.long, device=device)
        self.ancestors = torch.zeros(capacity, capacity, dtype=torch.bool, device=device)  # i sees j
        self.ancestors[0, 0] = True  # the root's row (itself), score (0) and depth (0) never change
        self.ones = torch.ones(capacity, window, dtype=torch.bool, device=device)  # the draft's window
        self.positions = torch.zeros(capacity, dtype=torch.long, device=device)  # a draft level's
        self.depth: list[int] = [0]  # per row, on the host (the levels' sizes do not depend on the data)

    @property
    def size(self) -> int:
        return len(self.depth)

    def start(self, root: int) -> DraftedTree:
        """A tree of the root alone. Only its token is written: each level rewrites its rows whole
        (`write_level`), so rows past the tree's size are never read and need no clearing."""
        self.tokens[0] = root
        self.depth = [0]
        return self

    def grow(self, tokens: torch.Tensor, parents: torch.Tensor, scores: torch.Tensor, depth: int) -> None:
        """Append one level: `tokens`, their `parents` (rows) and cumulative `scores`, all on the device."""
        self.write_level(self.size, tokens, parents, scores, depth)
        self.depth += [depth] * tokens.numel()

    def write_level(
        self, first: int, tokens: torch.Tensor, parents: torch.Tensor, scores: torch.Tensor, depth: int
    ) -> None:
        """`grow`'s device writes, the level's rows from `first` on (the host's `depth` list apart)."""
        new = slice(first, first + tokens.numel())
        self.tokens[new] = tokens
        self.parent[new] = parents
        self.score[new] = scores
        self.depths[new] = depth
        self.ancestors[new] = self.ancestors.index_select(0, parents)
        self.ancestors[new, new].diagonal().fill_(True)

    def host(self, preds: torch.Tensor | None = None, scores: bool = False) -> tuple[Tree, list | None]:
        """The tree as a host `Tree` and, given values per step on the device (`preds`: the target's argmax
        per row, or a sampled walk's floating-point values), those as a list: one read (two with the
        `scores`, which only block=auto uses)."""
        n = self.size
        parts = [self.tokens[:n], self.parent[:n]] + ([preds] if preds is not None else [])
        if preds is not None and preds.is_floating_point():  # float64 holds every token id exactly
            values = torch.cat([p.double() for p in parts]).tolist()
            values[: 2 * n] = [int(x) for x in values[: 2 * n]]
        else:
            values = torch.cat(parts).tolist()
        tree = Tree(
            values[:n],
            parent=[-1, *values[n + 1 : 2 * n]],
            depth=list(self.depth),
            score=self.score[:n].tolist() if scores else [0.0] * n,
            children=[[] for _ in range(n)],
            drafted=[False] + [True] * (n - 1),
            lookup=[0] * n,
        )
        for row in range(1, n):
            tree.children[tree.parent[row]].append(row)
        return tree, values[2 * n :] if preds is not None else None


def top_tokens(
    logits: torch.Tensor, width: int, temperature: float, vocab_ids: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's `width` most likely next tokens under a draft's `logits` `[n, vocab]` at
    `temperature`: (log-probabilities, token ids), both `[n, width]`; `vocab_ids` maps a restricted
    vocabulary's positions to token ids."""
    if temperature != 1.0:
        logits = logits / temperature
    top_logp, top_ids = torch.log_softmax(logits, dim=-1).topk(min(width, logits.shape[-1]), dim=-1)
    if vocab_ids is not None:
        top_ids = vocab_ids[top_ids]
    return top_logp, top_ids


def best_children(
    top_logp: torch.Tensor, top_ids: torch.Tensor, scores: torch.Tensor, lo: int, width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A beam-search level's choice: of the candidates `top_tokens` read for the beam (tree rows
    `lo..`, cumulative `scores`), the `width` with the largest cumulative log-probability, in rank
    order: (tokens, parent rows, cumulative scores)."""
    total = (top_logp + scores[:, None]).flatten()
    best_total, best = total.topk(min(width, total.numel()))
    return top_ids.flatten()[best], lo + best // top_logp.shape[1], best_total


class TreeDraft:
    """What LongSpec asks of a draft model: `start(prompt)` (fill its window), `begin_block()`,
    `step(tokens, positions, visible, target_len)` -> float logits `[n, vocab]` (over `vocab_ids` when
    that is set), `commit(tokens, first_position)`, and `cached` and `vocab_ids` attributes (committed
    tokens in its window; the restricted vocabulary or None). `top_logprobs`, the beam search's reading
    of a step, and `expand`, one level of the beam search, come with it."""

    # what the runner times as the draft's forwards (runners.timing.DraftClock): a beam-search level
    # (its step, the reading of it and the tree's growth), its block steps and the K/V of committed
    # tokens entering its window
    FORWARDS = ("expand", "step", "top_logprobs", "commit")
    vocab_ids: torch.Tensor | None
    cached: int

    @torch.inference_mode()
    def expand(
        self, tree: DraftedTree, lo: int, hi: int, length: int, depth: int, width: int, temperature: float
    ) -> None:
        """One level of the beam search, kept on the device: the beam (tree rows `lo..hi-1`, staged after
        rows `0..lo-1`) steps at position `length + depth - 1`, each row seeing the window and its
        ancestors; the `width` children with the largest cumulative log-probability join `tree` as
        level `depth` (a contiguous run of rows, so nothing is read back to choose the next beam)."""
        beam, window = hi - lo, self.cached
        visible = torch.cat([tree.ones[:beam, :window], tree.ancestors[lo:hi, :hi]], dim=1)
        positions = tree.positions[:beam].fill_(length + depth - 1)
        top_logp, top_ids = self.top_logprobs(
            tree.tokens[lo:hi], positions, visible, length, width, temperature
        )
        tree.grow(*best_children(top_logp, top_ids, tree.score[lo:hi], lo, width), depth)

    @torch.inference_mode()
    def top_logprobs(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        visible: torch.Tensor,
        target_len: int,
        width: int,
        temperature: float = 1.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`step`, then each row's `width` most likely next tokens under the draft at `temperature`:
        (log-probabilities, token ids), both `[n, width]`. The beam search's view of the draft's
        output, computed with its forward on the device, so the search never touches the vocabulary."""
        return top_tokens(
            self.step(tokens, positions, visible, target_len), width, temperature, self.vocab_ids
        )
