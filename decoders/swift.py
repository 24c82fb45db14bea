"""SWIFT (Xia et al., "SWIFT: On-the-Fly Self-Speculative Decoding for LLM Inference Acceleration", ICLR
2025, arXiv 2410.06916): the target drafts for itself with some of its sublayers skipped, a skip set
searched during decoding on the context already generated, no training and no second model.

One step, with the committed prefix of length P in the cache and the root r = the last output token:
1. Draft: up to `max_draft` one-row forwards of the target with the current skip set left out
   (`Engine.step(skip=...)`). Row i feeds the previous draft at position P + i over the whole cache
   plus the draft's own rows; a skipped attention neither reads nor writes the cache, and since the
   skip set is fixed within a draft, no layer reads a row it did not write. Drafting stops after a
   token whose draft probability is below `confidence` (the paper's confidence-aware early stop).
2. Roll back: `engine.crop(P)` forgets the drafted rows; 3. verify `[r, d1..dk]` in one full forward
   over the full cache (`SelfSpeculative._verify`: greedy matching or speculative sampling), commit
   the root and the accepted drafts. The cache ends exactly as vanilla's.
4. Search (the paper's "context-based layer set optimization"): once the generation has more than
   `context_window` + 1 tokens, after each verification one candidate skip set (`skip_ratio` of the
   interior layers' 2(L - 2) sublayers, first and last layer always kept) drafts the first
   `context_window` + 1 generated tokens in one parallel forward over the prompt's cache; its
   matchness (the share of those tokens its argmax predicts) replaces the incumbent's when higher.
   The search stops at `max_score`, after `patience` candidates without a gain, or after
   `search_steps` candidates. That forward's rows are staged after the committed cache and never
   committed.

Ours, not the paper's: the search runs per generation from the reference's starting set (attention
and MLP of every other interior layer), with a random generator seeded from `seed` (run.seed) and the
prompt, so a generation's drafts do not depend on what ran before it (warm-up, resumed runs); the
reference keeps one search across a task's instances. The incumbent is scored before the first
candidate (the reference starts from score 0). Candidates are drawn at random; the reference's
Bayesian-optimization proposal (every 25th, a Gaussian process over the sublayer mask) is left out.
Verification is a chain; the reference adds top-k siblings to each drafted position (a small tree).

Counts: `forwards` are the verification forwards (tau = committed tokens per verification, as for
selfspec and TriForce). Draft and search forwards are `draft_step`s (`draft_forwards`; steps with
`draft` true), with `block_tokens` their rows and `kv_attended` the cache entries read averaged over
all layers, so a skipped attention's layer reads none and a draft forward's share of a full one shows.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from core.attention import CausalView, MaskView
from core.checks import integer, number
from core.types import Counts, HarnessError, LayerSkip
from decoders.selfspec import SelfSpeculative


@dataclass
class SkipSearch:
    """One generation's search state: the incumbent skip set, its matchness and the budget spent."""

    skip: LayerSkip
    score: float = -1.0  # -1: the incumbent is not scored yet
    tried: int = 0  # candidates scored (the incumbent included)
    misses: int = 0  # candidates since the last gain
    active: bool = True


class Swift(SelfSpeculative):
    name = "swift"
    gamma_field = "max_draft"

    def __init__(
        self,
        engine,
        kv=None,
        sampler=None,
        skip_ratio: float = 0.45,
        max_draft: int = 25,
        confidence: float = 0.8,
        context_window: int = 16,
        search_steps: int = 1000,
        patience: int = 300,
        max_score: float = 0.93,
        seed: int = 0,
    ) -> None:
        skip_ratio = number("decoder.skip_ratio", skip_ratio, 0, 1, high_open=True)
        confidence = number("decoder.confidence", confidence, 0, 1)
        context_window = integer("decoder.context_window", context_window, 1)
        search_steps = integer("decoder.search_steps", search_steps, 0)  # 0 = keep the starting set
        patience = integer("decoder.patience", patience, 1)
        max_score = number("decoder.max_score", max_score, 0, 1)
        seed = integer("decoder.seed", seed, 0)
        super().__init__(engine, kv, sampler, gamma=max_draft)
        if not self.kv.lossless:
            raise HarnessError(
                f"decoder=swift drafts by skipping layers over the full cache and verifies over it; "
                f"kv={self.kv.name} would only hide entries from it: use kv=full"
            )
        self.skip_ratio, self.confidence = float(skip_ratio), float(confidence)
        self.context_window, self.search_steps, self.patience = context_window, search_steps, patience
        self.max_score, self.seed = float(max_score), seed
        n_layers = engine.w.n_layers
        interior = range(1, n_layers - 1)  # the reference always keeps the first and the last layer
        self.sublayers = [("attn", i) for i in interior] + [("mlp", i) for i in interior]
        self.n_skip = int(len(self.sublayers) * self.skip_ratio)
        every_other = frozenset(range(1, n_layers - 1, 2))
        self.start_skip = LayerSkip(every_other, every_other)  # the reference's starting set
        self.search = SkipSearch(self.start_skip)

    def params(self) -> dict:
        return {
            "skip_ratio": self.skip_ratio,
            "max_draft": self.gamma,
            "confidence": self.confidence,
            "context_window": self.context_window,
            "search_steps": self.search_steps,
            "patience": self.patience,
            "max_score": self.max_score,
            "seed": self.seed,
        }

    def max_block(self) -> int:
        return max(self.gamma, self.context_window) + 1  # a verification, or a search forward

    # --- the draft -------------------------------------------------------------------------------
    def _draft(
        self, root: int, length: int, n: int, counts: Counts
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`[root, up to n drafts]` on the device and, when sampling, the drafts' distributions: one-row
        forwards with the incumbent skip set, stopped after the first draft below `confidence`."""
        eng, sampler, skip = self.engine, self.sampler, self.search.skip
        view = CausalView(eng.scale)
        chain, probs = [eng.stage([root])], []
        positions = eng.positions(length, n)
        for i in range(n):
            logits = eng.step(chain[-1], positions[i : i + 1], view, skip=skip)[0]
            eng.commit([0])
            counts.draft_step(self._reads(length + i, skip))
            if sampler.greedy:
                conf, tok = torch.softmax(logits, dim=-1).max(dim=-1)
            else:
                probs.append(sampler.probs(logits))
                tok = sampler.device_draw(probs[-1])
                conf = probs[-1][tok]
            chain.append(tok.view(1))
            if float(conf) < self.confidence:  # the one read a draft step makes
                break
        eng.crop(length)
        return torch.cat(chain), (torch.stack(probs) if probs else None)

    def _reads(self, cache_len: int, skip: LayerSkip) -> int:
        """Cache entries a forward with `skip` reads, averaged over all layers (skipped attention: none)."""
        layers = self.engine.w.n_layers
        return cache_len * (layers - len(skip.attn)) // layers

    # --- the search ------------------------------------------------------------------------------
    def _candidate(self, rng: random.Random) -> LayerSkip:
        chosen = rng.sample(self.sublayers, self.n_skip)
        return LayerSkip(
            frozenset(i for kind, i in chosen if kind == "attn"),
            frozenset(i for kind, i in chosen if kind == "mlp"),
        )

    def _matchness(self, skip: LayerSkip, window: list[int], prompt_len: int, counts: Counts) -> float:
        """The share of `window[1:]` that a forward with `skip` over `window` predicts (argmax), seeing
        the prompt's cache and the window causally: the generated entries after the prompt are hidden,
        as the reference drafts over the prompt's cache alone. Nothing is committed."""
        eng = self.engine
        n, length = len(window), eng.length
        mask = torch.zeros(n, length + n, dtype=torch.bool, device=eng.device)
        mask[:, :prompt_len] = True
        mask[:, length:] = torch.ones(n, n, dtype=torch.bool, device=eng.device).tril()
        tokens, positions = eng.chain(window, prompt_len)
        _, ids = eng.step(
            tokens, positions, MaskView(mask, eng.scale), argmax=True, with_logits=False, skip=skip
        )
        eng.commit([])
        counts.draft_step(self._reads(prompt_len, skip), block_tokens=n)
        hits = ids[:-1].eq(tokens[1:]).sum()
        return float(hits) / (n - 1)

    def _search_step(self, rng: random.Random, window: list[int], prompt_len: int, counts: Counts) -> None:
        """Score one candidate (first the incumbent) and keep the better; stop at the budget's end."""
        s = self.search
        first = s.score < 0
        skip = s.skip if first else self._candidate(rng)
        score = self._matchness(skip, window, prompt_len, counts)
        s.tried += 1
        if score > s.score:
            s.skip, s.score, s.misses = skip, score, 0
        else:
            s.misses += 1
        if s.score > self.max_score or s.misses >= self.patience or s.tried > self.search_steps:
            s.active = False

    def _decode(
        self, prompt: list[int], out: list[int], max_new_tokens: int, stop_ids: set[int], counts: Counts
    ) -> None:
        eng = self.engine
        self.search = SkipSearch(self.start_skip, active=self.search_steps > 0 and self.n_skip > 0)
        rng = random.Random(f"swift-{self.seed}-{prompt}")  # a str seed is hashed (sha512): reproducible
        done = False
        while not done:
            length = eng.length
            n = min(self.gamma, max_new_tokens - len(out) - 1)  # the bonus token comes on top
            drafts, probs = self._draft(out[-1], length, n, counts) if n > 0 else ([], None)
            done, _ = self._verify(out, drafts, probs, length, max_new_tokens, stop_ids, counts)
            if not done and self.search.active and len(out) > self.context_window + 1:
                self._search_step(rng, out[: self.context_window + 1], len(prompt), counts)
