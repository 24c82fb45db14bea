"""Sampling verification with ONE read of the device per step: what a walk needs is gathered first.

The rules are `decoders.verify`'s (lossless in distribution); what changes is where the numbers are
read. A walk that asks the device for one probability at a time waits for it at every candidate token
it tries, and again for the row it draws its last token from. Here every probability the walk could
ask for is gathered on the device into one vector, beside one token drawn in advance for every place
the walk could end (`Sampler.device_draw`, with randomness of its own), and the vector is read in one
transfer (with the decoder's own read where it has one: `read_with`). The walk then runs on host
floats with the sampler's uniforms, in the order the rules draw them, and takes the drawn token of the
place where it ends: that token is drawn from exactly the distribution the rule names there,
independently of the walk, so the output's distribution is the rule's.

- `TreeWalk`: one-hot drafts in a tree (Lookahead's and SpecInfer's rule; Fu et al. 2024, Sec. 3.3):
  at a node (an accepted prefix) its children's tokens are tried in order; token x is accepted with
  probability p(x) / (mass not yet rejected), else removed from p. A walk ends at a node whose children
  were all rejected (a token drawn from its row without them) or at a leaf (from its row): one token
  drawn in advance per node. `TreeCheck` gathers for a tree the host holds; `drafted_values` for one
  drafted on the device (LongSpec's beam tree), read with the tree itself.
- `CandidateCheck`: several one-hot candidates (Lookahead, FAFO, prompt lookup) walked as their prefix
  trie: a node's children are the distinct next tokens of the candidates sharing its prefix, in
  candidate order, and its distribution is the row of the first of them (at most 1 + g k nodes).
- `ChainCheck`: one drafted chain with the drafter's distributions (speculative sampling; Leviathan et
  al. 2023, Chen et al. 2023): p_i(x_i) and q_i(x_i) for every draft, a correction drawn from
  norm(max(0, p_i - q_i)) for every place of a first rejection, and the bonus from the last row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from core.sampling import Sampler
from decoders.verify import Verdict, verify_logits

ProbsOf = Callable[[torch.Tensor], torch.Tensor]  # block rows (long [N] on the device) -> [N, vocab]
Stage = Callable[[Sequence[int]], torch.Tensor]  # host ints -> a long tensor on the device (`Engine.stage`)


def read_with(ints: torch.Tensor, values: torch.Tensor) -> tuple[list[int], list[float]]:
    """Integer ids (a step's argmax) and float values, both on the device, in ONE transfer (float64
    holds every token id and every float32 probability exactly)."""
    both = torch.cat([ints.reshape(-1).double(), values.reshape(-1).double()]).tolist()
    n = ints.numel()
    return [int(x) for x in both[:n]], both[n:]


def residual_draws(sampler: Sampler, rows: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """One token per row from `residual` (unnormalised), or from `rows` where a residual is empty (a walk
    never ends there: the rules accept whatever holds all the mass), drawn on the device."""
    empty = residual.sum(-1, keepdim=True) <= 0
    return sampler.device_draw(torch.where(empty, rows, residual))


class TreeWalk:
    """The host half of a one-hot walk down a tree: `children[i]`, node i's child nodes (node 0 the root),
    `tokens[i]`, the tokens they propose (a token proposed twice at one node is tried once: the first
    child keeps it), `px_at[i]`, where each child's probability at node i's row sits in the values read,
    and node i's drawn token at `drawn_at + i`. `walk(values read)` gives the accepted nodes and the drawn
    token where the walk ends."""

    def __init__(
        self,
        tokens: Sequence[Sequence[int]],
        children: Sequence[Sequence[int]],
        px_at: Sequence[Sequence[int]],
        drawn_at: int,
        sampler: Sampler,
    ) -> None:
        self.sampler, self.drawn_at = sampler, drawn_at
        self.tokens: list[list[int]] = []
        self.children: list[list[int]] = []
        self.px_at: list[list[int]] = []
        for toks, kids, where in zip(tokens, children, px_at, strict=True):
            first: dict[int, tuple[int, int]] = {}
            for tok, kid, at in zip(toks, kids, where, strict=True):
                first.setdefault(int(tok), (kid, at))
            self.tokens.append(list(first))
            self.children.append([kid for kid, _ in first.values()])
            self.px_at.append([at for _, at in first.values()])

    @classmethod
    def of_drafted(
        cls, children: Sequence[Sequence[int]], tokens: Sequence[int], sampler: Sampler
    ) -> TreeWalk:
        """The walk over `drafted_values` read, for the tree whose node i has child rows `children[i]`
        and token `tokens[i]`."""
        return cls(
            [[tokens[c] for c in kids] for kids in children],
            children,
            [[c - 1 for c in kids] for kids in children],
            len(tokens) - 1,
            sampler,
        )

    def walk(self, values: Sequence[float]) -> tuple[list[int], int]:
        """(the accepted nodes, root excluded, in order; the token drawn where the walk ends)."""
        node, path, gen = 0, [], self.sampler.generator
        while self.tokens[node]:
            mass, nxt = 1.0, -1
            for c, at in enumerate(self.px_at[node]):
                px = values[at]
                u = float(torch.rand((), generator=gen))
                if u < px / mass or mass - px <= 0.0:
                    nxt = self.children[node][c]
                    break
                mass -= px
            if nxt < 0:  # every proposed token rejected: the token drawn from this row without them
                break
            path.append(nxt)
            node = nxt
        return path, int(values[self.drawn_at + node])


def children_and_draws(
    sampler: Sampler, probs: torch.Tensor, where: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """The gathered values of a tree check: each child's probability at its node's row (`where`: the
    (row, token) pairs, in value order), then one token per row of `probs` drawn without its children's
    tokens, as float64."""
    picked = probs[where]
    drawn = residual_draws(sampler, probs, probs.index_put(where, torch.zeros_like(picked)))
    return torch.cat([picked.double(), drawn.double()])


def drafted_values(
    tokens: torch.Tensor, parent: torch.Tensor, probs: torch.Tensor, sampler: Sampler
) -> torch.Tensor:
    """A tree drafted on the device, gathered where it is (rows 0..n-1 its nodes, `parent` their parents'
    rows, `probs [n, vocab]` their distributions): node c's probability at its parent's row for
    c = 1..n-1, then a token per node drawn from its row without its children's tokens."""
    n = probs.shape[0]
    return children_and_draws(sampler, probs, (parent[1:n], tokens[1:n]))


GATHER_ON_CPU = False  # True: a CPU's tree checks gather as a GPU's do (the sync-counting tests, benchmarks)


def gathers(device: torch.device) -> bool:
    """Whether a tree check on `device` gathers every value its walk could read before it walks: on a GPU,
    where each read waits for the device. A CPU's reads wait for nothing, and its checks compute only the
    rows the walk visits: a gather computes every node's distribution (a top-p sort of the vocabulary
    each), which on a CPU costs more than the forward of a large tree."""
    return device.type != "cpu" or GATHER_ON_CPU


class TreeCheck(TreeWalk):
    """`TreeWalk` over a tree the host holds: `rows[i]`, the row (of what `probs_of` is given) of node
    i's distribution. Where it `gathers`, `values` is the device vector to read; elsewhere the values
    are computed as the walk reads them (`OnDemand`). `read(ints)`: a decoder's own ids (the step's
    argmax) and the values, in one transfer where they are gathered."""

    def __init__(
        self,
        rows: Sequence[int],
        tokens: Sequence[Sequence[int]],
        children: Sequence[Sequence[int]],
        probs_of: ProbsOf,
        sampler: Sampler,
        stage: Stage,
        device: torch.device,
    ) -> None:
        # values: every child's probability at its node's row (node by node), then one token per node
        px_at, at, owner, child_tokens = [], 0, [], []
        for node, toks in enumerate(tokens):
            px_at.append(list(range(at, at + len(toks))))
            at += len(toks)
            owner += [node] * len(toks)
            child_tokens += [int(t) for t in toks]
        super().__init__(tokens, children, px_at, at, sampler)
        self.values: torch.Tensor | None = None
        if not gathers(device):
            self.on_demand = OnDemand(probs_of, stage, sampler, list(rows), owner, child_tokens)
            return
        n = len(rows)
        index = stage([*rows, *owner, *child_tokens])  # one copy to the device
        self.values = children_and_draws(sampler, probs_of(index[:n]), (index[n : n + at], index[n + at :]))

    def read(self, ints: torch.Tensor | None = None) -> tuple[list[int], Sequence[float]]:
        if self.values is None:
            return (ints.tolist() if ints is not None else []), self.on_demand
        if ints is None:
            return [], self.values.tolist()
        return read_with(ints, self.values)


class OnDemand:
    """A tree check's values computed as a walk reads them (index as in the gathered vector): a child's
    probability from its node's distribution, made once per node, and a node's drawn token from that
    distribution without its children's tokens."""

    def __init__(
        self,
        probs_of: ProbsOf,
        stage: Stage,
        sampler: Sampler,
        rows: list[int],
        owner: list[int],
        tokens: list[int],
    ) -> None:
        self.probs_of, self.stage, self.sampler = probs_of, stage, sampler
        self.rows, self.owner, self.tokens = rows, owner, tokens
        self.made: dict[int, torch.Tensor] = {}

    def _row(self, node: int) -> torch.Tensor:
        if node not in self.made:
            self.made[node] = self.probs_of(self.stage([self.rows[node]]))[0]
        return self.made[node]

    def __getitem__(self, i: int) -> float:
        if i < len(self.owner):
            return float(self._row(self.owner[i])[self.tokens[i]])
        node = i - len(self.owner)
        p = self._row(node)
        children = [t for t, o in zip(self.tokens, self.owner, strict=True) if o == node]
        residual = p.index_fill(0, self.stage(children), 0.0) if children else p
        return float(residual_draws(self.sampler, p[None], residual[None])[0])


class CandidateCheck(TreeCheck):
    """Multi-candidate verification of one-hot drafts `cands [g][k]` under sampling, over their prefix
    trie. `row_of(j, t)` is the row (of what `probs_of` is given) of candidate j's token t, `root_row`
    the root's; `verdict(values read)` is the walk's `Verdict` (the winning candidate: the first with
    the accepted prefix, whose rows are kept)."""

    def __init__(
        self,
        cands: Sequence[Sequence[int]],
        row_of: Callable[[int, int], int],
        probs_of: ProbsOf,
        sampler: Sampler,
        stage: Stage,
        device: torch.device,
        root_row: int = 0,
    ) -> None:
        k = len(cands[0]) if len(cands) else 0
        # per trie node: its row, the first candidate with its prefix (the root: none), its children
        rows, self.first, self.token = [root_row], [-1], [-1]  # ... and the token that leads to it
        tokens: list[list[int]] = [[]]
        children: list[list[int]] = [[]]
        level = [(0, list(range(len(cands))))]
        for depth in range(k):
            deeper = []
            for node, alive in level:
                groups: dict[int, list[int]] = {}
                for j in alive:
                    groups.setdefault(int(cands[j][depth]), []).append(j)
                for tok, group in groups.items():
                    tokens[node].append(tok)
                    children[node].append(len(rows))
                    deeper.append((len(rows), group))
                    rows.append(row_of(group[0], depth))
                    self.first.append(group[0])
                    self.token.append(tok)
                    tokens.append([])
                    children.append([])
            level = deeper
        super().__init__(rows, tokens, children, probs_of, sampler, stage, device)

    def run(self) -> Verdict:
        """Read the values alone, then walk (a decoder with no read of its own)."""
        return self.verdict(self.read()[1])

    def verdict(self, values: Sequence[float]) -> Verdict:
        path, last = self.walk(values)
        accepted = [self.token[node] for node in path]
        return Verdict(self.first[path[-1]] if path else -1, len(path), [*accepted, last])


class ChainCheck:
    """Speculative sampling of one drafted chain: `drafts [n]` (long, on the device), the drafter's
    distributions `q [n, vocab]` at them and the target's `target [n + 1, vocab]` (row i: after the
    root and the first i drafts). `values` holds the drafts, p_i(x_i), q_i(x_i), a correction drawn
    from norm(max(0, p_i - q_i)) for each i and the bonus drawn from the last row; `verdict(values
    read)` accepts x_i with probability min(1, p_i(x_i) / q_i(x_i)) and ends with the correction at the
    first rejection, or with the bonus."""

    def __init__(self, drafts: torch.Tensor, q: torch.Tensor | None, target: torch.Tensor, sampler: Sampler):
        self.n, self.sampler = drafts.numel(), sampler
        self.drafts: list[int] = []  # their host values, once read
        bonus = sampler.device_draw(target[self.n :])
        if not self.n:
            self.values = bonus.double()
            return
        assert q is not None
        q, rows = q.to(target.device), torch.arange(self.n, device=target.device)
        p = target[: self.n].float()
        fixes = residual_draws(sampler, p, (p - q.float()).clamp(min=0))
        parts = (drafts, target[rows, drafts], q[rows, drafts], fixes, bonus)
        self.values = torch.cat([t.reshape(-1).double() for t in parts])

    def run(self) -> Verdict:
        """Read the values alone, then accept."""
        return self.verdict(self.values.tolist())

    def verdict(self, values: Sequence[float]) -> Verdict:
        n, gen = self.n, self.sampler.generator
        self.drafts = [int(x) for x in values[:n]]
        px, qx, drawn = values[n : 2 * n], values[2 * n : 3 * n], values[3 * n :]
        accepted: list[int] = []
        for i, x in enumerate(self.drafts):
            u = float(torch.rand((), generator=gen))
            if not (qx[i] > 0 and u < min(1.0, px[i] / qx[i])):
                break
            accepted.append(x)
        last = int(drawn[len(accepted)])  # the correction at the first rejection, or the bonus
        return Verdict(0 if accepted else -1, len(accepted), [*accepted, last])


def flat_check(sampler: Sampler, eng, logits: torch.Tensor, cands: Sequence[Sequence[int]], first: int):
    """`CandidateCheck` over the usual layout: the root at row 0 of `logits`, candidate j's token t at
    row `first + j*k + t`."""
    k = len(cands[0]) if len(cands) else 0
    return CandidateCheck(
        cands,
        lambda j, t: first + j * k + t,
        lambda rows: sampler.probs(logits[rows]),
        sampler,
        eng.stage,
        eng.device,
    )


def verify_flat(
    sampler: Sampler,
    eng,
    logits: torch.Tensor | None,
    cands: torch.Tensor | Sequence[Sequence[int]],
    first: int,
    preds: torch.Tensor | None = None,
) -> Verdict:
    """Verification of `cands [g, k]` (a host tensor or nested lists) in the usual layout, one read either
    way: greedy from the step's argmax `preds` (`decoders.verify.verify_logits`), sampling from `logits`
    (`flat_check`)."""
    if sampler.greedy:
        return verify_logits(logits, cands, first, preds)
    assert logits is not None
    table = cands.tolist() if isinstance(cands, torch.Tensor) else cands
    return flat_check(sampler, eng, logits, table, first).run()
