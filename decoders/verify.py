"""Verification of several equal-length candidate k-grams computed in one forward.

Shared by the n-gram decoders (Lookahead, FAFO, prompt lookup). The block of one forward holds the
last committed token (the *root*) and g candidates `cands[j] = (a_j1 .. a_jk)`, each candidate
causal within itself and seeing the full cache plus the root. Row (j, t) of the block yields the
target distribution after the prefix + a_j1..a_jt.

- `greedy_verify`: accept candidate tokens while each equals the argmax at the previous position;
  keep the longest accepted prefix over all candidates (the first one on ties), then append the
  bonus token (argmax after the last accepted token). This is the usual greedy verification
  applied to every candidate; the output equals vanilla greedy token for token.
- Sampling (`decoders.sampled_verify`): Lookahead's multi-candidate verification of one-hot drafts
  (Fu et al. 2024, Sec. 3.3, after SpecInfer): a token x is accepted with probability p(x); on
  rejection p(x) is set to 0 and p renormalised, and the next candidate that shares the accepted
  prefix (and proposes a different token) is tried. When no candidate survives, the bonus token is
  sampled from the residual p. Lossless in distribution: with one-hot drafts, "accept x w.p. p(x),
  else sample from p with x removed" draws exactly from p, at every depth. One drafted chain with the
  drafter's real distributions (self-speculative decoding, TriForce): standard speculative sampling,
  exact in distribution.

All return a `Verdict`: the committed tokens (accepted + bonus), the winning candidate and how
many of its tokens were accepted, from which `commit_rows` gives the block rows whose KV to keep
(the root's row and the accepted candidate tokens' rows; the bonus token's KV is computed when it
is fed as the next root).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from core.sampling import Sampler


@dataclass
class Verdict:
    candidate: int  # index of the candidate whose prefix was accepted; -1 when none was
    accepted: int  # candidate tokens accepted (bonus excluded)
    tokens: list[int]  # the accepted tokens followed by the bonus token

    def commit_rows(self, root_row: int, cand_rows: Sequence[Sequence[int]] | torch.Tensor) -> list[int]:
        """Block rows to keep: the root, then candidate `self.candidate`'s first `accepted` rows.

        `cand_rows[j][t]` is the block row of candidate j's token t."""
        if self.accepted == 0:
            return [root_row]
        rows = cand_rows[self.candidate]
        return [root_row, *(int(r) for r in rows[: self.accepted])]

    def flat_rows(self, root_row: int, first_cand_row: int, k: int) -> list[int]:
        """`commit_rows` for the usual layout where candidate j token t sits at `first + j*k + t`."""
        if self.accepted == 0:
            return [root_row]
        base = first_cand_row + self.candidate * k
        return [root_row, *range(base, base + self.accepted)]


Table = torch.Tensor | Sequence[Sequence[int]]  # [g, k]: a host tensor or nested lists


def prefix_match(cand: Sequence[int], root_pred: int, preds: Sequence[int]) -> int:
    """How many leading tokens of one candidate the greedy target agrees with: token t is accepted when
    it equals the argmax at the row before it (`root_pred` for the first, `preds[t - 1]` after)."""
    prev, n = root_pred, 0
    for tok, nxt in zip(cand, preds, strict=True):
        if tok != prev:
            break
        n, prev = n + 1, nxt
    return n


def candidate_slices(values: Sequence[int], first: int, g: int, k: int) -> list[Sequence[int]]:
    """`values` of the usual layout's candidate rows: candidate j's token t at row `first + j*k + t`."""
    return [values[first + j * k : first + (j + 1) * k] for j in range(g)]


def greedy_verify(cands: Table, root_pred: int, cand_pred: Table) -> Verdict:
    """Longest greedy-accepted candidate prefix plus the bonus token.

    cands: [g, k] candidate tokens; root_pred: argmax at the root row; cand_pred: [g, k],
    `cand_pred[j, t]` = argmax at the row of candidate j's token t. g may be 0. Host tensors (read back
    with the step's one read) or nested lists: the walk is a few dozen integer comparisons, cheaper in
    Python than as tensor operators.
    """
    table = cands.tolist() if isinstance(cands, torch.Tensor) else cands
    preds = cand_pred.tolist() if isinstance(cand_pred, torch.Tensor) else cand_pred
    if len(table) != len(preds):
        raise ValueError(f"greedy_verify: {len(table)} candidates but {len(preds)} rows of predictions")
    return _longest_accepted(table, int(root_pred), preds.__getitem__)


def greedy_verify_flat(cands: Sequence[Sequence[int]], picked: Sequence[int], first: int, k: int) -> Verdict:
    """`greedy_verify` over the usual layout (candidate j's token t at row `first + j*k + t`), reading
    `picked` (every row's argmax, the root's first) only for the candidates whose first token the root's
    argmax agrees with: most fail there, so their rows are never sliced."""
    return _longest_accepted(cands, picked[0], lambda j: picked[first + j * k : first + (j + 1) * k])


def _longest_accepted(
    cands: Sequence[Sequence[int]], root: int, preds_of: Callable[[int], Sequence[int]]
) -> Verdict:
    """The walk of both greedy verifications: `preds_of(j)` (candidate j's argmax rows) is asked only for
    candidates whose first token is the root's argmax; most fail there, so no call is made for them."""
    best, n, best_preds = -1, 0, ()
    for j, cand in enumerate(cands):
        if not cand or cand[0] != root:
            continue
        preds = preds_of(j)
        m = prefix_match(cand, root, preds)
        if m > n:  # the first maximum on ties
            best, n, best_preds = j, m, preds
    if n == 0:
        return Verdict(-1, 0, [root])
    return Verdict(best, n, [*cands[best][:n], best_preds[n - 1]])


def greedy_chain(chain: torch.Tensor, preds: torch.Tensor) -> tuple[list[int], Verdict]:
    """Greedy verification of one drafted chain still on the device: `chain` `[root, d1..dk]` as the step
    took it, `preds` the step's argmax per row. One read for both; the walk runs on Python ints.
    Returns (the drafts, the verdict)."""
    k = chain.numel() - 1
    both = torch.cat([chain[1:], preds]).tolist()
    drafts, picked = both[:k], both[k:]
    return drafts, greedy_verify([drafts] if k else [], picked[0], [picked[1:]] if k else [])


def step_for(
    sampler: Sampler, eng, tokens: torch.Tensor, positions: torch.Tensor, view, logits_rows=None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`eng.step` as a verification needs it: (None, the argmax of each row on the device) when the
    sampler is greedy (the logits end with the step), (logits, None) when it samples (no work over
    the vocabulary it would not use)."""
    if sampler.greedy:
        return eng.step(tokens, positions, view, logits_rows=logits_rows, argmax=True, with_logits=False)
    return eng.step(tokens, positions, view, logits_rows=logits_rows), None


def step_with_argmax(
    sampler: Sampler, eng, tokens: torch.Tensor, positions: torch.Tensor, view, logits_rows=None
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """`eng.step` for a decoder whose host structures read every row's argmax, sampled or not (Lookahead's
    window, FAFO's streams): (logits when the sampler samples, else None; the argmax on the device)."""
    return eng.step(
        tokens, positions, view, logits_rows=logits_rows, argmax=True, with_logits=not sampler.greedy
    )


def verify_logits(
    logits: torch.Tensor | None, cands: Table, first: int, preds: torch.Tensor | None = None
) -> Verdict:
    """Greedy verification of `cands` [g, k] (a host tensor or nested lists) from one forward: the root's
    row 0, candidate j token t's row `first + j*k + t`; `preds` is the argmax of every row as the step
    returns it (else taken from `logits`), read here in one transfer. Sampling: `decoders.sampled_verify`."""
    if isinstance(cands, torch.Tensor):
        k = cands.shape[1]
    else:
        k = len(cands[0]) if cands else 0
    assert preds is not None or logits is not None
    picked = (logits.argmax(dim=-1) if preds is None else preds).tolist()
    table = cands.tolist() if isinstance(cands, torch.Tensor) else cands
    return greedy_verify_flat(table, picked, first, k)
