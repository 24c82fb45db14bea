"""Self-speculative decoding: the target drafts for itself through a KV policy, then verifies with
the full cache (TriForce's "retrieval without hierarchy" with kv=retrieval; MagicDec, LongSpec's
baseline, with kv=streaming).

One step, with the committed prefix of length P in the cache and the root r = the last output token:
1. Draft: up to γ one-row forwards of the target. Row i feeds the previous token at position P + i
   and sees only the policy's selection of `[0, P)` plus the draft's own fresh tail `[P, P + i)`
   (`core.policy_views.draft_view`); its KV is committed so the next draft row sees it.
2. Roll back: `engine.crop(P)` forgets every drafted entry (their KV came from a restricted forward).
3. Verify: one forward of `[r, d1..dγ]` over the full cache; greedy: accept while each draft equals
   the target's argmax; sampling: speculative sampling with the draft's real distributions
   (`decoders.sampled_verify.ChainCheck`). Commit the root and the accepted drafts, plus the bonus.
One KV cache throughout: no private copy. Counts: `forwards` are the verification forwards (tau =
committed tokens per verification forward, as in the papers); the draft forwards are counted apart
(`Counts.draft_step`, `draft_forwards`), with the cache entries they read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from core.attention import CausalView
from core.checks import integer, number
from core.options import options
from core.policy_views import draft_view
from core.types import Counts, HarnessError
from decoders.base import BaseDecoder, extend_output
from decoders.sampled_verify import ChainCheck
from decoders.verify import greedy_chain, step_for


@dataclass
class SelfSpeculativeConfig:
    gamma: int = 6  # draft tokens per step (TriForce's gamma2 = 6)
    # verification steps between kv.rebuild() calls (0 = never; TriForce's on-chip script never rebuilds
    # within 256 generated tokens)
    rebuild_every: int = 0
    # also rebuild when the acceptance of the last rebuild_window verifications falls below this
    # (0 = never; the paper gives no threshold)
    rebuild_below: float = 0.0
    rebuild_window: int = 8


class SelfSpeculative(BaseDecoder):
    name = "selfspec"
    gamma_field = "gamma"  # the config key of the tokens drafted per verification
    Config = SelfSpeculativeConfig

    def __init__(self, engine, kv=None, sampler=None, **given: Any) -> None:
        o = options(SelfSpeculativeConfig, given)  # a subclass passes these of its own options
        gamma = integer(f"decoder.{self.gamma_field}", o.gamma, 1)
        rebuild_every = integer("decoder.rebuild_every", o.rebuild_every, 0)  # 0 = never
        rebuild_below = number("decoder.rebuild_below", o.rebuild_below, 0, 1, high_open=True)  # 0 = never
        rebuild_window = integer("decoder.rebuild_window", o.rebuild_window, 1)
        super().__init__(engine, kv, sampler)
        if getattr(self.kv, "backend", "dense") == "flex":
            raise HarnessError(
                f"decoder=selfspec: kv={self.kv.name} backend=flex keeps one static block mask and cannot "
                "add the draft's fresh tail; use kv.backend=sliced (or dense)"
            )
        self.gamma = gamma
        self.rebuild_every = rebuild_every  # verification steps between policy rebuilds (kv=retrieval)
        # rebuild when the acceptance of the last `rebuild_window` verifications falls below this
        self.rebuild_below, self.rebuild_window = float(rebuild_below), rebuild_window
        self._recent: list[tuple[int, int]] = []

    lossless = True  # the full-cache verification decides every token

    def _after_verification(self, step: int, accepted: int, drafted: int, counts: Counts) -> None:
        """TriForce's rebuild rule for the policy's selection (kv=retrieval): every `rebuild_every`
        verifications, or when the acceptance over the last `rebuild_window` verifications drops below
        `rebuild_below` (then the window starts afresh)."""
        if self.rebuild_every and step % self.rebuild_every == 0:
            counts.kv_rebuild(self.kv.rebuild(self.engine))
            self._recent.clear()
            return
        if not self.rebuild_below:
            return
        self._recent.append((accepted, drafted))
        del self._recent[: -self.rebuild_window]
        total = sum(d for _, d in self._recent)
        full = len(self._recent) == self.rebuild_window and total
        if full and sum(a for a, _ in self._recent) / total < self.rebuild_below:
            counts.kv_rebuild(self.kv.rebuild(self.engine))
            self._recent.clear()

    def max_block(self) -> int:
        return self.gamma + 1

    def _draft(
        self, root: int, length: int, n: int, counts: Counts
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`[root, n draft tokens]` on the device and, when sampling, the draft's distributions `[n, vocab]`
        at them. Every one of the `n` is drafted (a stop token among them is cut by the verification's
        output) and read with the verification's numbers."""
        if self.sampler.greedy:
            return self._draft_greedy(root, length, n, counts), None
        return self._draft_sampled(root, length, n, counts)

    def _draft_sampled(
        self, root: int, length: int, n: int, counts: Counts
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`_draft_greedy` with each token drawn on the device from the sampler's distribution
        (`Sampler.device_draw`), which the verification's speculative sampling needs beside it."""
        eng, kv, sampler = self.engine, self.kv, self.sampler
        chain = [eng.stage([root])]
        positions = eng.positions(length, n)
        probs = []
        for i in range(n):
            view = draft_view(kv, eng, length)
            logits = eng.step(chain[-1], positions[i : i + 1], view)
            eng.commit([0])
            counts.draft_step(view.kv_read(length + i))
            probs.append(sampler.probs(logits[0]))
            chain.append(sampler.device_draw(probs[-1]).view(1))
        eng.crop(length)
        return torch.cat(chain), torch.stack(probs)

    def _draft_greedy(self, root: int, length: int, n: int, counts: Counts) -> torch.Tensor:
        """`[root, n greedy draft tokens]` on the device; each draft step feeds the last one's argmax
        (the step's own output tensor, so no copy a row) without the host reading it."""
        eng, kv = self.engine, self.kv
        chain = [eng.stage([root])]
        positions = eng.positions(length, n)
        for i in range(n):
            view = draft_view(kv, eng, length)
            _, ids = eng.step(chain[-1], positions[i : i + 1], view, argmax=True, with_logits=False)
            eng.commit([0])
            counts.draft_step(view.kv_read(length + i))
            chain.append(ids)
        eng.crop(length)
        return torch.cat(chain)

    def _decode(
        self, prompt: list[int], out: list[int], max_new_tokens: int, stop_ids: set[int], counts: Counts
    ) -> None:
        eng = self.engine
        done, steps = False, 0
        self._recent.clear()
        while not done:
            length = eng.length
            n = min(self.gamma, max_new_tokens - len(out) - 1)  # the bonus token comes on top
            drafts, probs = self._draft(out[-1], length, n, counts) if n > 0 else ([], None)
            done, accepted = self._verify(out, drafts, probs, length, max_new_tokens, stop_ids, counts)
            steps += 1
            drafted = drafts.numel() - 1 if isinstance(drafts, torch.Tensor) else len(drafts)
            self._after_verification(steps, accepted, drafted, counts)

    def _verify(
        self,
        out: list[int],
        drafts: list[int] | torch.Tensor,
        probs: list[torch.Tensor] | torch.Tensor | None,
        length: int,
        max_new_tokens: int,
        stop_ids: set[int],
        counts: Counts,
    ) -> tuple[bool, int]:
        """The final level: `[out[-1], *drafts]` in one forward over the full cache from cache length
        `length` (what the drafts wrote beyond it is overwritten), greedy or Leviathan acceptance against
        the drafts' distributions `probs` (a list of rows or `[k, vocab]`), the accepted tokens and the
        bonus committed and appended to `out`. Returns (generation done, drafts accepted). One read
        (greedy: drafts and argmax; sampling: drafts, their probabilities and the tokens drawn in advance)."""
        eng = self.engine
        if isinstance(drafts, torch.Tensor):  # greedy: the chain [root, drafts] is on the device
            tokens, k = drafts, drafts.numel() - 1
            positions = eng.positions(length, k + 1)
        else:
            k = len(drafts)
            tokens, positions = eng.chain([out[-1], *drafts], length)
        logits, preds = step_for(self.sampler, eng, tokens, positions, CausalView(eng.scale))
        if preds is not None:  # greedy: one read for the drafts and the predictions
            verdict = greedy_chain(tokens, preds)[1]
        else:
            q = probs if isinstance(probs, torch.Tensor) or not probs else torch.stack(probs)
            verdict = ChainCheck(tokens[1:], q, self.sampler.probs(logits), self.sampler).run()
        n_new, done = extend_output(out, verdict.tokens, max_new_tokens, stop_ids)
        rows = verdict.flat_rows(0, 1, k)[:n_new]
        eng.commit(rows)
        self.kv.after_commit(eng, len(rows))
        counts.step(k + 1, k, verdict.accepted, n_new, length)
        return done, verdict.accepted
