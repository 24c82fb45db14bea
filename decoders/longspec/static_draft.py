"""LongSpec's draft forwards with fixed shapes, replayed as CUDA graphs while the target has its own
(`run.cuda_graphs=true`, `Engine.use_graphs`).

A LongSpec decode step runs the draft once per tree level and once to commit the accepted tokens. Each
is a one-block forward of a few dozen operators, so on a GPU its cost is their launches. Here each of
them reads its inputs from device buffers and has shapes that do not depend on the data:
- a beam-search level (`TreeDraft.expand`: the step, the beam's reading of it, the tree's growth)
  and a bare level step attend over the whole window buffer and the whole staged-block buffer under a staged
  visibility (window slots past `cached` and block slots past the staged rows hidden), and over the
  target cache's whole allocation with the slots from `target_len` on hidden; its rows' K/V go to the
  block slots after the staged ones, a fixed range per (rows, staged rows);
- a commit writes the tokens' K/V into the window through a device index while the window fills, and
  once it is full shifts it by the number of tokens (one forward per count); the one commit that both
  fills and shifts takes the regular path.
The keys the masks hide change the order of the attention's sums, not what it sees: drafts match the
regular path's up to rounding (the target verifies every token, so outputs are exact either way).

`StaticDraftForwards(draft, capture=False)` runs them eagerly: the CPU tests check them against the
regular path, and `make test-gpu` checks the captured graphs.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from core.replay import Replay
from decoders.longspec.tree import best_children, top_tokens


def commit_fits(window: int, m: int, drop: int) -> bool:
    """Whether a commit of `m` tokens that drops `drop` window entries has a fixed-shape forward: at most
    a window of tokens that only fill the window or only shift it."""
    return 0 < m <= window and drop in (0, m)


class StaticDraftForwards:
    """The fixed-shape forwards of a `LongSpecDraft`: `step` per (rows, staged rows), `commit` per
    (tokens, whether the window shifts). The draft decides when they apply (a step with a target entry
    to read, a commit that `commit_fits`) and keeps `cached`/`staged` on the host."""

    def __init__(self, draft, capture: bool) -> None:
        self.draft, self.capture = draft, capture
        self.steps: dict[tuple[int, int], StaticStep] = {}
        self.levels: dict[tuple, StaticLevel] = {}
        self.commits: dict[tuple[int, bool], StaticCommit] = {}
        self.lengths = LevelLengths(draft.engine.device)  # every level's inputs that a step holds fixed

    @property
    def captures(self) -> int:
        every = [*self.steps.values(), *self.levels.values(), *self.commits.values()]
        return sum(f.replay.captures for f in every)

    def expand(self, tree, lo: int, hi: int, length: int, depth: int, width: int, temperature: float) -> None:
        """`TreeDraft.expand` (the block buffers hold room for rows `0..hi-1`)."""
        key = (id(tree), tree.tokens.data_ptr(), lo, hi, depth, width, temperature)
        fwd = self.levels.get(key)
        if fwd is None:
            fwd = self.levels[key] = StaticLevel(
                self.draft, tree, lo, hi, depth, width, temperature, self.capture, self.lengths
            )
        self.lengths.stage(length, self.draft.cached)
        fwd()

    def step(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        visible: torch.Tensor,
        target_len: int,
        staged: int,
    ) -> torch.Tensor:
        """`LongSpecDraft.step` for rows staged after `staged` others (the block buffers hold room)."""
        n = tokens.numel()
        fwd = self.steps.get((n, staged))
        if fwd is None:
            fwd = self.steps[(n, staged)] = StaticStep(self.draft, n, staged, self.capture)
        return fwd(tokens, positions, visible, target_len)

    def commit(self, tokens: Sequence[int], first_position: int) -> None:
        m = len(tokens)
        shifts = self.draft.cached + m > self.draft.window
        fwd = self.commits.get((m, shifts))
        if fwd is None:
            fwd = self.commits[(m, shifts)] = StaticCommit(self.draft, m, shifts, self.capture)
        fwd(tokens, first_position)


class StaticStep:
    """One tree level's draft step of `rows` rows after `staged` staged ones, through device buffers."""

    def __init__(self, draft, rows: int, staged: int, capture: bool) -> None:
        self.draft, self.rows, self.staged = draft, rows, staged
        dev = draft.engine.device
        self.token = torch.zeros(rows, dtype=torch.long, device=dev)
        self.position = torch.zeros(rows, dtype=torch.long, device=dev)
        self.target_len = torch.zeros(1, dtype=torch.long, device=dev)
        self.visible = torch.zeros(0, dtype=torch.bool, device=dev)  # [rows, window + block slots]
        self.slots = torch.zeros(0, dtype=torch.long, device=dev)  # the target allocation's slots
        self.replay = Replay(self.forward, capture, dev)

    def __call__(
        self, tokens: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor, target_len: int
    ) -> torch.Tensor:
        d, n = self.draft, self.rows
        cache = d.engine.cache
        window, block = d.win_k.shape[1], d.block_k.shape[1]
        if self.visible.shape != (n, window + block):
            self.visible = torch.zeros(n, window + block, dtype=torch.bool, device=d.engine.device)
        if self.slots.numel() != cache.capacity:
            self.slots = torch.arange(cache.capacity, device=d.engine.device)
        self.token.copy_(tokens.reshape(n))
        self.position.copy_(positions.reshape(n))
        self.target_len.fill_(target_len)
        cached, end = d.cached, window + self.staged + n
        self.visible.zero_()
        self.visible[:, :cached] = visible[:, :cached]
        self.visible[:, window:end] = visible[:, cached:]
        key = (d.win_k.data_ptr(), d.block_k.data_ptr(), cache.k.data_ptr(), cache.capacity)
        return self.replay(key).clone()

    def forward(self) -> torch.Tensor:
        return block_forward(
            self.draft, self.staged, self.token, self.position, self.visible, self.target_len, self.slots
        )


def block_forward(
    d,
    at: int,
    token: torch.Tensor,
    position: torch.Tensor,
    visible: torch.Tensor,
    target_len: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """Draft `d`'s step of rows `token` at `position`, staged at block slots `at..`: self-attention over
    the whole window and block buffers under `visible` `[n, window + block slots]`, cross-attention
    over the target's whole allocation (`slots`) up to the device length `target_len`. Float logits."""
    n, eng = token.numel(), d.engine
    cos, sin = d._rope(position)
    h0 = eng.w.embed(token)
    k, v = d._self_kv(h0, cos, sin)
    d.block_k[:, at : at + n] = k
    d.block_v[:, at : at + n] = v
    keys = torch.cat([d.win_k, d.block_k], dim=1)
    values = torch.cat([d.win_v, d.block_v], dim=1)
    cross = (eng.cache.k[d.target_layer], eng.cache.v[d.target_layer])
    cross_mask = (slots < target_len)[None, :].expand(n, -1)
    h3 = d._hidden(h0, cos, sin, keys, values, visible, cross, cross_mask)
    return d.logits_of(h3)


class LevelLengths:
    """The target's cache length and the draft window's entry count on the device, which every level of a
    step's tree reads: one buffer pair shared by the levels, written only when a value changes (once per
    step at most, not once per level)."""

    def __init__(self, device: torch.device) -> None:
        self.length = torch.zeros(1, dtype=torch.long, device=device)
        self.cached = torch.zeros(1, dtype=torch.long, device=device)
        self.staged: tuple[int, int] | None = None  # (length, cached) the buffers hold

    def stage(self, length: int, cached: int) -> None:
        staged = self.staged or (None, None)
        if staged[0] != length:
            self.length.fill_(length)
        if staged[1] != cached:
            self.cached.fill_(cached)
        self.staged = (length, cached)


class StaticLevel:
    """One beam-search level (`TreeDraft.expand`) in one fixed-shape forward: the beam's visibility
    (the window's cached slots, its ancestors in the block) and positions made on the device, the
    step, the beam's reading of it and the tree's growth. One per (rows lo..hi-1, depth, width,
    temperature) of a tree's buffers; `lengths` (staged by the caller) are the step's shared inputs."""

    def __init__(
        self,
        draft,
        tree,
        lo: int,
        hi: int,
        depth: int,
        width: int,
        temperature: float,
        capture: bool,
        lengths: LevelLengths,
    ):
        self.draft, self.tree, self.lo, self.hi = draft, tree, lo, hi
        self.depth, self.width, self.temperature = depth, width, temperature
        dev = draft.engine.device
        self.length, self.cached = lengths.length, lengths.cached
        self.window_slots = torch.arange(draft.win_k.shape[1], device=dev)
        self.slots = torch.zeros(0, dtype=torch.long, device=dev)
        vocab = draft.config.vocab_size if draft.vocab_ids is None else draft.vocab_ids.numel()
        self.children = min(width, (hi - lo) * min(width, vocab))  # the level's rows
        self.replay = Replay(self.forward, capture, dev)

    def __call__(self) -> None:
        d, tree = self.draft, self.tree
        cache = d.engine.cache
        if self.slots.numel() != cache.capacity:
            self.slots = torch.arange(cache.capacity, device=d.engine.device)
        self.replay((d.win_k.data_ptr(), d.block_k.data_ptr(), cache.k.data_ptr(), cache.capacity))
        tree.depth += [self.depth] * self.children

    def forward(self) -> None:
        d, tree, lo, hi = self.draft, self.tree, self.lo, self.hi
        n, dev = hi - lo, d.engine.device
        seen = (self.window_slots < self.cached)[None, :].expand(n, -1)
        rest = torch.zeros(n, d.block_k.shape[1] - hi, dtype=torch.bool, device=dev)
        visible = torch.cat([seen, tree.ancestors[lo:hi, :hi], rest], dim=1)
        position = (self.length + (self.depth - 1)).expand(n)
        logits = block_forward(d, lo, tree.tokens[lo:hi], position, visible, self.length, self.slots)
        top = top_tokens(logits, self.width, self.temperature, d.vocab_ids)
        tree.write_level(hi, *best_children(*top, tree.score[lo:hi], lo, self.width), self.depth)


class StaticCommit:
    """The K/V of `m` committed tokens into the window: written after the cached ones while it fills,
    or (`shifts`, the window full) the oldest `m` dropped and the tokens written at its end."""

    def __init__(self, draft, m: int, shifts: bool, capture: bool) -> None:
        self.draft, self.m, self.shifts = draft, m, shifts
        dev = draft.engine.device
        self.token = torch.zeros(m, dtype=torch.long, device=dev)
        self.position = torch.zeros(m, dtype=torch.long, device=dev)
        self.slot = torch.zeros(m, dtype=torch.long, device=dev)
        self.count = torch.arange(m, device=dev)
        self.replay = Replay(self.forward, capture, dev, state=(draft.win_k, draft.win_v) if shifts else ())

    def __call__(self, tokens: Sequence[int], first_position: int) -> None:
        d = self.draft
        self.token.copy_(d.engine.stage(tokens))
        torch.add(self.count, first_position, out=self.position)
        torch.add(self.count, d.cached, out=self.slot)
        self.replay((d.win_k.data_ptr(),))

    def forward(self) -> None:
        d, m = self.draft, self.m
        cos, sin = d._rope(self.position)
        k, v = d._self_kv(d.engine.w.embed(self.token), cos, sin)
        for win, new in ((d.win_k, k), (d.win_v, v)):
            if self.shifts:
                win[:, : d.window - m] = win[:, m:].clone()
                win[:, d.window - m :] = new
            else:
                win.index_copy_(1, self.slot, new)
