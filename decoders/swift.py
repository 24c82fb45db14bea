"""SWIFT (Xia et al., "SWIFT: On-the-Fly Self-Speculative Decoding for LLM Inference Acceleration", ICLR
2025, arXiv 2410.06916): the target drafts for itself with some of its sublayers skipped, a skip set
searched during decoding on the context already generated, no training and no second model.

One step, with the committed prefix of length P in the cache and the root r = the last output token:
1. Draft: up to `max_draft` one-row forwards of the target with the current skip set left out
   (`Engine.step(skip=...)`). Row i feeds the previous draft at position P + i over the whole cache
   plus the draft's own rows; a skipped attention neither reads nor writes the cache, and since the
   skip set is fixed within a draft, no layer reads a row it did not write. Drafting stops after a
   token whose draft probability is below `confidence` (the paper's confidence-aware early stop).
2. Roll back: `engine.crop(P)` forgets the drafted rows.
3. Verify in one forward over the full cache. `tree` (greedy): the reference's dynamic verification,
   each drafted position's next most likely draft tokens (`SIBLINGS`) as siblings of its draft, the
   longest accepted path committed; else the chain `[r, d1..dk]` (`SelfSpeculative._verify`: greedy
   matching or speculative sampling). The cache ends exactly as vanilla's.
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
Sampling verifies the chain (`tree=false`); the reference also samples over its tree.

Counts: `forwards` are the verification forwards (tau = committed tokens per verification, as for
selfspec and TriForce). Draft and search forwards are `draft_step`s (`draft_forwards`; steps with
`draft` true), with `block_tokens` their rows and `kv_attended` the cache entries read averaged over
all layers, so a skipped attention's layer reads none and a draft forward's share of a full one shows.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from core.attention import BlockView, CausalView, MaskView
from core.checks import flag, integer, number
from core.options import options
from core.types import Counts, HarnessError, LayerSkip
from decoders.base import extend_output
from decoders.selfspec import SelfSpeculative
from decoders.verify import greedy_verify

# The reference's dynamic verification (greedy): a drafted position whose draft probability is above p
# puts its m most likely draft tokens into the tree (its draft and m - 1 siblings), the first p that fits.
SIBLINGS = ((0.95, 3), (0.8, 5), (0.5, 8), (-1.0, 10))


@dataclass
class SkipSearch:
    """One generation's search state: the incumbent skip set, its matchness and the budget spent."""

    skip: LayerSkip
    score: float = -1.0  # -1: the incumbent is not scored yet
    tried: int = 0  # candidates scored (the incumbent included)
    misses: int = 0  # candidates since the last gain
    active: bool = True


@dataclass
class SwiftConfig:
    """Paper/reference defaults except where marked "ours"."""

    # share of the interior layers' attention + MLP sublayers a draft skips; ours: 0.2 for SmolLM2-135M's
    # 30 layers (tau 1.57 and 1.66 on two MT-Bench turns of 64 tokens; 1.34 and 1.17 at the reference's
    # 0.45 for LLaMA-2)
    skip_ratio: float = 0.2
    max_draft: int = 25  # longest draft per verification (the reference's max_step_draft)
    confidence: float = 0.8  # stop drafting after a token with draft probability below this
    # the search scores candidates on the first context_window + 1 generated tokens (reference 50 over
    # 512-token outputs; ours: 16 for 64-token CPU turns)
    context_window: int = 16
    search_steps: int = 1000  # candidate skip sets per generation at most (reference max_opt_iter)
    patience: int = 300  # stop searching after this many candidates without a gain (max_tolerance_iter)
    max_score: float = 0.93  # stop searching once the matchness exceeds this
    # verify each drafted position's top 3-10 draft tokens too (the reference's dynamic verification,
    # greedy only); false: the chain alone (sampling)
    tree: bool = True
    seed: int = 0  # the search's random candidates (with the prompt); conf/decoder/swift.yaml: run.seed


class Swift(SelfSpeculative):
    name = "swift"
    gamma_field = "max_draft"
    Config = SwiftConfig

    def __init__(self, engine, kv=None, sampler=None, **given: Any) -> None:
        o = options(self.Config, given)
        skip_ratio = number("decoder.skip_ratio", o.skip_ratio, 0, 1, high_open=True)
        confidence = number("decoder.confidence", o.confidence, 0, 1)
        context_window = integer("decoder.context_window", o.context_window, 1)
        search_steps = integer("decoder.search_steps", o.search_steps, 0)  # 0 = keep the starting set
        patience = integer("decoder.patience", o.patience, 1)
        max_score = number("decoder.max_score", o.max_score, 0, 1)
        seed = integer("decoder.seed", o.seed, 0)
        self.tree = flag("decoder.tree", o.tree)
        super().__init__(engine, kv, sampler, gamma=o.max_draft)
        if self.tree and not self.sampler.greedy:
            raise HarnessError(
                "decoder=swift: the tree verification (decoder.tree=true) is greedy only here; "
                "sample with decoder.tree=false (chain verification, speculative sampling)"
            )
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

    def max_block(self) -> int:
        tree = self.gamma * SIBLINGS[-1][1] if self.tree else self.gamma  # a depth: its draft + siblings
        return max(tree, self.context_window) + 1  # a verification, or a search forward

    # --- the draft -------------------------------------------------------------------------------
    def _draft(
        self, root: int, length: int, n: int, counts: Counts
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`[root, up to n drafts]` on the device and, when sampling, the drafts' distributions: one-row
        forwards with the incumbent skip set, stopped after the first draft below `confidence`."""
        eng, sampler, skip = self.engine, self.sampler, self.search.skip
        view = CausalView(eng.scale)
        chain, probs = [eng.stage([root])], []
        self._siblings: list[torch.Tensor] = []  # tree: each depth's alternatives to its draft
        positions = eng.positions(length, n)
        for i in range(n):
            logits = eng.step(chain[-1], positions[i : i + 1], view, skip=skip)[0]
            eng.commit([0])
            counts.draft_step(self._reads(length + i, skip))
            if sampler.greedy:
                top = torch.softmax(logits, dim=-1).topk(SIBLINGS[-1][1])
                conf, tok = top.values[0], top.indices[0]
            else:
                probs.append(sampler.probs(logits))
                tok = sampler.device_draw(probs[-1])
                conf = probs[-1][tok]
            chain.append(tok.view(1))
            confidence = float(conf)  # the one read a draft step makes
            if self.tree:
                self._siblings.append(top.indices[1 : next(m for p, m in SIBLINGS if confidence > p)])
            if confidence < self.confidence:
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
            if self.tree and n > 0:
                done = self._verify_tree(out, drafts, length, max_new_tokens, stop_ids, counts)
            else:
                done, _ = self._verify(out, drafts, probs, length, max_new_tokens, stop_ids, counts)
            if not done and self.search.active and len(out) > self.context_window + 1:
                self._search_step(rng, out[: self.context_window + 1], len(prompt), counts)

    def _verify_tree(
        self,
        out: list[int],
        chain: torch.Tensor,
        length: int,
        max_new_tokens: int,
        stop_ids: set[int],
        counts: Counts,
    ) -> bool:
        """Greedy verification of the draft chain `[root, d1..dk]` with each depth's siblings: a sibling at
        depth j sees the root, d1..d(j-1) and itself. The longest accepted path (the chain first on ties)
        and its bonus are committed. Returns whether the generation is done. One read."""
        eng, k = self.engine, chain.numel() - 1
        depths = list(range(k + 1))
        for j, sib in enumerate(self._siblings):
            depths += [j + 1] * sib.numel()
        n = len(depths)
        mask = torch.zeros(n, n, dtype=torch.bool)
        mask[: k + 1, : k + 1] = torch.ones(k + 1, k + 1, dtype=torch.bool).tril()
        for row in range(k + 1, n):
            mask[row, : depths[row]] = True
            mask[row, row] = True
        tokens = torch.cat([chain, *self._siblings])
        positions = eng.positions(length, k + 1)[torch.tensor(depths, device=eng.device)]
        view = BlockView(mask.to(eng.device), eng.scale)
        _, preds = eng.step(tokens, positions, view, argmax=True, with_logits=False)
        both = torch.cat([tokens, preds]).tolist()  # the one read
        toks, picked = both[:n], both[n:]
        cands, rows = [toks[1 : k + 1]], [list(range(1, k + 1))]
        for row in range(k + 1, n):
            rows.append([*range(1, depths[row]), row])
            cands.append([toks[r] for r in rows[-1]])
        verdict = greedy_verify(cands, picked[0], [[picked[r] for r in rr] for rr in rows])
        n_new, done = extend_output(out, verdict.tokens, max_new_tokens, stop_ids)
        keep = verdict.commit_rows(0, rows)[:n_new]
        eng.commit(keep)
        self.kv.after_commit(eng, len(keep))
        counts.step(n, n - 1, verdict.accepted, n_new, length)
        return done
