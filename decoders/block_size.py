"""Block sizes chosen by cost (`decoder.block=auto`): each step runs the block that maximises expected
committed tokens per second of forward, from the environment's cost curve t(rows, ctx)
(`core.cost_curve`, handed over by the runner) and acceptance statistics gathered during the
generation. Only the size of a block changes, never verification: lossless decoders stay lossless.

Acceptance model: a draft (a PLD continuation, a pool candidate) is accepted token by token; the
chance that its token i is accepted given tokens 1..i-1 were is a running rate per (key, i) with a
Beta prior (`prior_mean`, `prior_weight` pseudo-drafts). The key says where a draft comes from (PLD:
the matched n-gram length; pool decoders: the candidate's rank). Every verified draft updates the
positions it reached. Expected accepted tokens of one draft of length k = sum over i <= k of the
survival P(tokens 1..i accepted); of several drafts verified together, the expected longest accepted
prefix, with drafts treated as independent (an optimistic estimate where candidates share prefixes).
The statistics live for one generation, like a KV policy's state.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence

from core.checks import choice
from core.cost_curve import CostFn  # (rows, attended context) -> seconds

BLOCK_MODES = ("fixed", "auto")


def check_block_mode(block: str) -> str:
    return choice("decoder.block", block, BLOCK_MODES)


class AcceptanceStats:
    """Running per-position acceptance rates of drafts, per key (one generation)."""

    def __init__(self, prior_mean: float = 0.5, prior_weight: float = 2.0) -> None:
        if not 0.0 < prior_mean < 1.0 or prior_weight <= 0:
            raise ValueError("acceptance prior: mean in (0, 1) and a positive weight")
        self.prior_mean, self.prior_weight = prior_mean, prior_weight
        self.reached: dict[Hashable, list[int]] = defaultdict(list)  # drafts that reached position i
        self.passed: dict[Hashable, list[int]] = defaultdict(list)  # ... and had token i accepted

    def update(self, key: Hashable, drafted: int, accepted: int) -> None:
        """One verified draft of `drafted` tokens whose first `accepted` tokens were accepted."""
        reached, passed = self.reached[key], self.passed[key]
        while len(reached) < drafted:
            reached.append(0)
            passed.append(0)
        for i in range(min(accepted + 1, drafted)):
            reached[i] += 1
            passed[i] += i < accepted

    def rate(self, key: Hashable, i: int) -> float:
        """P(token i accepted | tokens before it accepted), 0-based position."""
        reached, passed = self.reached.get(key, []), self.passed.get(key, [])
        n, a = (reached[i], passed[i]) if i < len(reached) else (0, 0)
        return (a + self.prior_mean * self.prior_weight) / (n + self.prior_weight)

    def survival(self, key: Hashable, k: int) -> list[float]:
        """[P(tokens 1..i all accepted) for i = 1..k]."""
        out, s = [], 1.0
        for i in range(k):
            s *= self.rate(key, i)
            out.append(s)
        return out


def expected_longest(survivals: Sequence[Sequence[float]]) -> float:
    """E[longest accepted prefix] over independent drafts with the given survival curves."""
    depth = max((len(s) for s in survivals), default=0)
    total = 0.0
    for i in range(depth):
        miss = 1.0
        for s in survivals:
            if i < len(s):
                miss *= 1.0 - s[i]
        total += 1.0 - miss
    return total


class PrefixGain:
    """Observed gain of verifying the g-th ranked draft of a step too: how much it lengthened the
    longest accepted prefix of drafts 1..g-1, per g (one generation). Candidates of one step are
    correlated (a trie shares prefixes; two guesses rarely both match), so the independent-drafts
    model's gain is blended with the observed one: (observed sum + weight * model) / (observations +
    weight). Gains are never negative: verifying more never shortens the accepted prefix."""

    def __init__(self, weight: float = 2.0) -> None:
        self.weight = weight
        self.total: list[float] = []
        self.count: list[int] = []

    def update(self, lengths: Sequence[int]) -> None:
        """Accepted lengths of the drafts verified in one step, in rank order."""
        best = 0
        for g, n in enumerate(lengths):
            if g == len(self.total):
                self.total.append(0.0)
                self.count.append(0)
            self.total[g] += max(n - best, 0)
            self.count[g] += 1
            best = max(best, n)

    def blend(self, g: int, model_gain: float) -> float:
        """Expected gain of the g-th draft (1-based)."""
        i = g - 1
        total, count = (self.total[i], self.count[i]) if i < len(self.total) else (0.0, 0)
        return (total + self.weight * model_gain) / (count + self.weight)


def best_prefix(
    survivals: Sequence[Sequence[float]],
    rows: Sequence[int],
    cost: CostFn,
    ctx: float,
    observed: PrefixGain | None = None,
) -> int:
    """How many of the ranked drafts to verify: g in 0..len(survivals) maximising
    (1 + E[longest accepted prefix of drafts 1..g]) / cost(rows[g]); `rows[g]` = block rows with g
    drafts; each draft's gain from the independent-drafts model, blended with `observed` gains when
    given. Incremental: one pass over the drafts' positions."""
    depth = max((len(s) for s in survivals), default=0)
    miss = [1.0] * depth
    options = [(rows[0], 1.0)]
    tokens, model_before = 1.0, 0.0
    for g, s in enumerate(survivals, start=1):
        for i, p in enumerate(s):
            miss[i] *= 1.0 - p
        model = sum(1.0 - m for m in miss)
        gain = model - model_before
        tokens += observed.blend(g, gain) if observed else gain
        model_before = model
        options.append((rows[g], tokens))
    return best_option(options, cost, ctx)


def best_option(options: Sequence[tuple[int, float]], cost: CostFn, ctx: float) -> int:
    """Index of the (rows, expected committed tokens) option with the most tokens per second; ties go
    to the smaller block (listed first)."""
    best, best_rate = 0, -1.0
    for i, (rows, tokens) in enumerate(options):
        rate = tokens / max(cost(rows, ctx), 1e-12)
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = i, rate
    return best


def generator_plan(
    sizes: Sequence[int], rows_of: Callable[[int], int], cost: CostFn, ctx: float, share: float
) -> tuple[int, int]:
    """(size, period) for the rows that produce guesses rather than verify them (Lookahead's window,
    FAFO's streams): their payoff comes in later steps, so instead of an expected-token estimate they
    get a fixed `share` of a 1-row step's cost, on average. The largest size whose rows
    (`rows_of(size)`, besides the root) add at most that share, run every step; when even the smallest
    adds more, the smallest run every `period`-th step so that its cost averaged over steps does."""
    if share <= 0:
        raise ValueError(f"generator share must be positive, got {share}")
    one = max(cost(1, ctx), 1e-12)  # a cost function priced at 0 must not divide by zero

    def extra(s: int) -> float:
        return max(cost(1 + rows_of(s), ctx) / one - 1.0, 0.0)

    fits = [s for s in sizes if extra(s) <= share]
    if fits:
        return max(fits), 1
    small = min(sizes)
    return small, max(math.ceil(extra(small) / share - 1e-9), 1)
