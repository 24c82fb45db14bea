"""LongSpec with blocks sized by cost (`decoder.block=auto`; ours, not the paper's): each step verifies
only the drafted nodes worth their rows on this hardware, and drafting stops early once one more level
cannot pay for its draft forward. Verification is unchanged, so the decoder stays lossless.

Acceptance model. Given its parent was accepted, a drafted node is accepted with a probability read off
the draft's own probability q of the node's token (`DraftCalibration`: per bin of q, a running rate
with a Beta prior at the bin's centre, updated with every verified node whose parent the target
accepted; it lives for one generation). A node's survival is the product of the rates along its root
path. At most one child of a node can match the target, so a block's expected committed tokens are
1 (the bonus) + the sum of its nodes' survivals.

Block. The root + the N nodes of highest survival (a subtree: a child never survives its parent), N
maximising expected tokens / (t(N + 1 rows, ctx) + the step's draft seconds), where t is the
environment's cost curve (`core.cost_curve`) and the draft seconds are measured once before anything
is timed (`draft_step_seconds`). Drafting goes one level deeper only while a level whose nodes keep
the calibration's rate of extension (how often a node the target accepted had a child accepted)
would raise that ratio.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence

import torch

from core.cost_curve import CostFn, fill_cache, synchronize


class DraftCalibration:
    """P(a drafted node is accepted | its parent was) per bin of the draft's probability q of its token."""

    def __init__(self, bins: int = 10, prior_weight: float = 2.0) -> None:
        if bins < 1 or prior_weight <= 0:
            raise ValueError("draft calibration: at least one bin and a positive prior weight")
        self.bins, self.prior_weight = bins, prior_weight
        self.reached = [0] * bins
        self.passed = [0] * bins
        self.parents = 0  # accepted nodes (or roots) whose children were verified
        self.extended = 0  # ... and one of them was accepted

    def _bin(self, q: float) -> int:
        return min(max(int(q * self.bins), 0), self.bins - 1)

    def rate(self, q: float) -> float:
        b = self._bin(q)
        centre = (b + 0.5) / self.bins
        return (self.passed[b] + self.prior_weight * centre) / (self.reached[b] + self.prior_weight)

    def extension_rate(self) -> float:
        """P(one of an accepted node's children is accepted) (prior 1/2): what a level not drafted
        yet is expected to add below each node."""
        return (self.extended + self.prior_weight * 0.5) / (self.parents + self.prior_weight)

    def update(self, q: float, accepted: bool) -> None:
        """One verified node whose parent was accepted."""
        b = self._bin(q)
        self.reached[b] += 1
        self.passed[b] += bool(accepted)

    def update_parent(self, extended: bool) -> None:
        """One accepted node (or root) with verified children; `extended`: one of them was accepted."""
        self.parents += 1
        self.extended += bool(extended)


def node_probability(score: Sequence[float], parent: Sequence[int], row: int) -> float:
    """The draft's probability of node `row`'s token given its parent (scores are cumulative log-probs)."""
    return math.exp(score[row] - score[parent[row]])


def survivals(parent: Sequence[int], rate: Callable[[int], float]) -> list[float]:
    """P(the root path of each tree row is accepted), given `rate(row)` = P(row accepted | its parent
    accepted); rows are listed parents first, row 0 the root."""
    out = [1.0]
    for row in range(1, len(parent)):
        out.append(out[parent[row]] * rate(row))
    return out


def best_block(
    survival: Sequence[float], cost: CostFn, ctx: float, draft_seconds: float
) -> tuple[list[int], float]:
    """(the tree rows to verify besides the root, in row order; expected tokens per second): the N rows
    of highest survival (ties: the earlier row), N maximising (1 + their survivals) / (t(N + 1, ctx) +
    `draft_seconds`); ties go to the smaller block."""
    order = sorted(range(1, len(survival)), key=lambda r: (-survival[r], r))
    best_n, best_rate, tokens = 0, -1.0, 1.0
    for n in range(len(order) + 1):
        if n:
            tokens += survival[order[n - 1]]
        rate = tokens / max(cost(n + 1, ctx) + draft_seconds, 1e-12)
        if rate > best_rate * (1 + 1e-9):
            best_n, best_rate = n, rate
    return sorted(order[:best_n]), best_rate


def deeper_pays(
    survival: Sequence[float],
    frontier: Sequence[int],
    calib: DraftCalibration,
    cost: CostFn,
    ctx: float,
    spent: float,
    next_forward: float,
) -> bool:
    """Whether one more draft level is worth its forward: each frontier node gains a child at the
    calibration's extension rate; True when the best block over the tree and those children (paying
    `spent` + `next_forward` draft seconds) beats the best block now (paying `spent`)."""
    now = best_block(survival, cost, ctx, spent)[1]
    rho = calib.extension_rate()
    hypothetical = [*survival, *(survival[f] * rho for f in frontier)]
    return best_block(hypothetical, cost, ctx, spent + next_forward)[1] > now


def draft_step_seconds(draft, eng, context: int, rows: Sequence[int], reps: int = 5) -> dict[int, float]:
    """Median seconds of one draft forward of each row count in `rows`, its window full and the target
    cache holding `context` entries (synthetic tokens: the cost does not depend on them). Leaves the
    engine's cache and the draft's window in an arbitrary state: generation resets both."""
    vocab = int(eng.model.config.vocab_size)
    draft.start(fill_cache(eng, context, 1))
    out: dict[int, float] = {}
    for n in sorted(set(rows)):
        tokens = torch.full((n,), 3 % vocab, dtype=torch.long)
        positions = torch.full((n,), context, dtype=torch.long)
        visible = torch.ones(n, draft.cached + n, dtype=torch.bool)
        times = []
        for _ in range(reps + 1):  # the first run warms the kernels
            draft.begin_block()
            synchronize(eng.device)
            t0 = time.perf_counter()
            draft.step(tokens, positions, visible, context)
            synchronize(eng.device)
            times.append(time.perf_counter() - t0)
        out[n] = statistics.median(times[1:])
    draft.begin_block()
    return out
