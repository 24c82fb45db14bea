"""TriForce (Sun et al. 2024, Algorithm 1 of "TriForce: Lossless Acceleration of Long Sequence Generation
with Hierarchical Speculative Decoding"): hierarchical speculation.

Three stages over one target KV cache plus the draft model's own small cache:
- level 1: a small draft model M_q (`decoders.draft_model.DraftModel`: its own StreamingLLM cache)
  drafts `gamma1` tokens;
- the middle: ONE forward of the target over the KV policy's selection (TriForce's retrieval cache
  C_r with kv=retrieval) checks them: `[r, x1..x_gamma1]`, causal, seeing the selection of the
  committed prefix plus the middle level's own fresh tail. Speculative sampling (greedy: argmax
  matching) accepts a prefix and appends a correction or a bonus token; the accepted tokens' KV stays
  in the tail. Repeated until at least `gamma2` tokens are pending (so up to gamma2 + gamma1 - 1);
- level 2: `engine.crop` forgets the tail (its KV came from a restricted forward) and one full-cache
  forward verifies every pending token against the middle level's distributions; commit and bonus.
Lossless: level 2 is exact speculative sampling against the full-cache target (greedy: token-identical
to vanilla). `draft=none` has no level 1: the target over the policy drafts `gamma2` tokens one row at
a time, which is `decoder=selfspec` ("retrieval without hierarchy" in the paper).

Differences from the reference implementation, stated: the repository's Middle_Spec drafts one M_q
token per middle forward (gamma1 = 1 in Algorithm 1's terms); here gamma1 is a parameter (the paper's
Table 8 sweeps it). The retrieval cache keeps tokens generated after its build visible until a rebuild
instead of overwriting its least important slots (`kv_policies.retrieval`).

Counts: `forwards`/`drafted`/`accepted` are level 2 (tau and the paper's acceptance rate);
`drafted_l1`/`accepted_l1` the middle level's check of the draft model; `draft_forwards` the target's
forwards over the policy; `draft_model_forwards` the small model's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from core.checks import integer
from core.options import options
from core.policy_views import draft_view
from core.types import Counts
from decoders.draft_model import DraftModel
from decoders.sampled_verify import ChainCheck
from decoders.selfspec import SelfSpeculative
from decoders.verify import greedy_chain, step_for


@dataclass
class TriForceConfig:
    gamma1: int = 2  # draft-model tokens per middle forward (the paper's best, Table 8)
    gamma2: int = 6  # tokens accumulated before the full-cache verification (Table 8)
    rebuild_every: int = 0  # level-2 verifications between kv.rebuild() calls (0 = never)
    # also rebuild when the level-2 acceptance of the last rebuild_window verifications falls below this
    # (0 = never; the paper gives no threshold)
    rebuild_below: float = 0.0
    rebuild_window: int = 8


class TriForce(SelfSpeculative):
    name = "triforce"
    gamma_field = "gamma2"
    needs = frozenset({"draft"})  # the run's draft group (None: draft=none, no middle level)
    Config = TriForceConfig

    def __init__(self, engine, kv=None, sampler=None, draft: DraftModel | None = None, **given: Any) -> None:
        o = options(self.Config, given)
        gamma1 = integer("decoder.gamma1", o.gamma1, 1)
        super().__init__(
            engine,
            kv,
            sampler,
            gamma=o.gamma2,
            rebuild_every=o.rebuild_every,
            rebuild_below=o.rebuild_below,
            rebuild_window=o.rebuild_window,
        )
        self.gamma1, self.gamma2 = gamma1, self.gamma
        self.draft = draft
        if draft is not None:
            draft.check_block(gamma1 + self.gamma2 + 2)

    def max_block(self) -> int:
        return self.gamma1 + self.gamma2 + 2

    def prepare(self, prompt: list[int], counts: Counts) -> None:
        if self.draft is not None:
            self.draft.start(prompt, counts)

    # ------------------------------------------------------------------------------------------
    def _middle(
        self, seq: list[int], committed: int, length: int, room: int, counts: Counts
    ) -> tuple[list[int], list[torch.Tensor]]:
        """One level-1 round: the draft model proposes, the target over the policy checks in one
        forward. `seq` ends with the middle root (the token whose KV is not cached yet); the tail holds
        the pending tokens before it. Returns the new tokens (accepted drafts + correction/bonus) and,
        when sampling, the middle level's distribution at each of them."""
        eng, kv, draft = self.engine, self.kv, self.draft
        assert draft is not None
        n1 = min(self.gamma1, room - 1)  # the middle's own correction/bonus token comes on top
        # [root, drafts] on the device (the root written in front of the draft's chain), read with this
        # level's numbers: greedy, its argmax; sampling, the probabilities speculative sampling compares
        k, lead, q = max(n1, 0), seq[-1], None
        if not k:
            tokens = eng.stage([lead])
        elif self.sampler.greedy:
            tokens = draft.propose_chain(seq, committed, k, counts, lead=lead)
        else:
            tokens, q = draft.propose_sampled(seq, committed, k, self.sampler, counts, lead=lead)
        cache_len = eng.length
        view = draft_view(kv, eng, length, k + 1)
        positions = eng.positions(cache_len, k + 1)
        logits, preds = step_for(self.sampler, eng, tokens, positions, view)
        probs: list[torch.Tensor] = []
        if preds is not None:  # greedy
            xt, verdict = greedy_chain(tokens, preds)  # one read: drafts and predictions
        else:
            phat = self.sampler.probs(logits)
            check = ChainCheck(tokens[1:], q, phat, self.sampler)
            verdict, xt = check.run(), check.drafts
            probs = list(phat[: verdict.accepted + 1])
        if k:
            draft.drafted(xt)
        eng.commit(verdict.flat_rows(0, 1, k))
        counts.draft_step(view.kv_read(cache_len), k + 1, k, verdict.accepted)
        return verdict.tokens, probs

    def _decode(
        self, prompt: list[int], out: list[int], max_new_tokens: int, stop_ids: set[int], counts: Counts
    ) -> None:
        if self.draft is None:
            return super()._decode(prompt, out, max_new_tokens, stop_ids, counts)
        eng = self.engine
        done, steps = False, 0
        self._recent.clear()
        while not done:
            length = eng.length
            room = max_new_tokens - len(out) - 1  # the level-2 bonus comes on top
            pending: list[int] = []
            pending_probs: list[torch.Tensor] = []
            seq = prompt + out
            while len(pending) < min(self.gamma2, room) and not (pending and pending[-1] in stop_ids):
                new, probs = self._middle(seq + pending, len(seq), length, room - len(pending), counts)
                for i, tok in enumerate(new):
                    pending.append(tok)
                    if probs:
                        pending_probs.append(probs[i])
                    if tok in stop_ids:
                        break
            eng.crop(length)
            done, accepted = self._verify(
                out, pending, pending_probs, length, max_new_tokens, stop_ids, counts
            )
            steps += 1
            self._after_verification(steps, accepted, len(pending), counts)
