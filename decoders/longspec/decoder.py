"""LongSpec (Yang et al. 2025, "LongSpec: Long-Context Lossless Speculative Decoding with Efficient
Drafting and Verification"): a one-block draft that reads the target's
KV cache drafts a tree by dynamic beam search; one target forward verifies every tree node through
Hybrid Tree Attention (`core.tree_attention`). Lossless: the target decides every token.

One step, with L committed entries in the target cache and the root r = the last output token (not
cached yet, as in `decoders.selfspec`):
1. Draft (`decoders.longspec.draft.LongSpecDraft`): depth 1 = the top-w1 children of r under the draft
   (r queried at position L); at depth d every beam node of depth d-1 (queried at position L + d - 1,
   seeing the draft's window cache and its own ancestors) proposes its top-w_d children, and the top-w_d
   of all of those by cumulative draft log-prob become the new beam and tree nodes (the others are not
   in the tree). The draft's cross-attention reads only the target's L committed entries.
2. Verify: ONE target forward over [r, every tree node], node at depth d at position L + d, with the
   ancestor mask over the block and the whole cache visible (`HybridTreeView`).
3. Accept: greedy = the longest root path whose every token is the target's argmax at its parent, plus
   the bonus argmax after it. Sampling = at each node along the path, its children x1..xm (one-hot,
   deterministic top-k drafts) are tried in order with Lookahead's/SpecInfer's rule
   (`decoders.sampled_verify.TreeCheck`): accept x_i with probability p_i(x_i), p_1 = the target's
   distribution at the node, p_{i+1} = p_i with x_i removed and renormalised; when none is accepted
   the next token is drawn from p_{m+1} and the step ends. Exact in distribution; the probabilities
   and one token drawn in advance per node are read in one transfer.
4. Commit the root and the accepted path's rows (`engine.commit`: their KV compacted in the one cache),
   then the same tokens enter the draft's window.
A chain (gamma drafts) is the case widths = [1] * gamma.

`block=auto` (ours, not the paper's): the drafted tree is cut to the nodes worth verifying on this
hardware and drafting may stop before `depth` (`decoders.longspec.auto`); verification is unchanged.

`lookup=N` (ours, not the paper's): after drafting, prompt lookup's guess (`decoders.pld.NGramIndex`:
up to N tokens after the earliest earlier occurrence of the trailing 2-gram of prompt + output) joins
the tree as one more root path; where the draft proposed the same tokens the path runs through its nodes.
The one-block draft cannot copy from its context, so a lookup covers tokens the draft rarely proposes.
Under block=auto a lookup node's rate is the chain's running acceptance at its place (per matched n-gram
length, as decoder=pld's), a node both drafted and looked up takes the higher of its two rates.
Verification is unchanged: lossless.

Counts: one `counts.step` per target forward (block rows, drafted tree nodes, accepted, committed, cache
entries read); one `counts.draft_model_step(rows, window entries)` per draft forward (its cross-attention
reads the target's committed entries of one layer on top: not in `kv_attended`, like any draft model).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from core.checks import choice, integer, number
from core.options import options, recorded_without
from core.positions import RelativePositions
from core.sampling import Sampler
from core.tree_attention import BACKENDS, HybridTreeView
from core.types import Counts, HarnessError
from decoders.base import BaseDecoder, extend_output
from decoders.block_size import BLOCK_MODES, AcceptanceStats
from decoders.longspec.auto import (
    DraftCalibration,
    best_block,
    deeper_pays,
    draft_step_seconds,
    node_probability,
    survivals,
)
from decoders.longspec.draft import DEFAULT_WINDOW, LongSpecDraft, check_window, resolve_layer, target_name
from decoders.longspec.sail import is_sail, load_sail
from decoders.longspec.tree import DraftedTree, Tree
from decoders.pld import NGramIndex
from decoders.sampled_verify import TreeCheck, TreeWalk, drafted_values, gathers
from decoders.verify import step_for

RANDOM = "random"  # decoder.checkpoint=random: an explicitly untrained random-init draft (smoke runs)
AUTO = "auto"  # decoder.checkpoint=auto: the draft shipped in SHIPPED for the target model
SHIPPED = Path(__file__).resolve().parents[2] / "checkpoints" / "longspec"  # <target name>/ per draft
LOOKUP_NGRAM = 2  # lookup=N: the trailing n-gram matched, as decoder=pld's default


def shipped_draft(engine) -> Path:
    """The committed draft folder for `engine`'s model (`checkpoints/longspec/<model folder name>`)."""
    name = Path(target_name(engine)).name
    folder = SHIPPED / name
    if not (folder / "config.json").is_file():
        have = sorted(p.name for p in SHIPPED.glob("*") if (p / "config.json").is_file())
        raise HarnessError(
            f"decoder=longspec: no shipped LongSpec draft for {name!r} "
            f"(shipped: {', '.join(have) or 'none'}): "
            "train one (python -m training.longspec) and pass decoder.checkpoint=<its draft folder>, or "
            "decoder.checkpoint=random for an untrained draft (lossless, tau near 1)"
        )
    return folder


def _widths(depth: object, widths: object) -> list[int]:
    integer("decoder.depth", depth, 1)
    try:
        if isinstance(widths, (str, bytes)):
            raise TypeError
        values = list(widths)  # a list or Hydra's ListConfig
    except TypeError:
        raise HarnessError(f"decoder=longspec: widths must be a list of {depth} positive integers") from None
    if len(values) != depth or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in values):
        raise HarnessError(
            f"decoder=longspec: widths must be {depth} positive integers (one per depth), got {values!r}"
        )
    return values


@dataclass
class LongSpecConfig:
    """The paper's tree (depth 5, widths [4, 16, 16, 16, 16]); `LongSpec.__init__` says what each does."""

    depth: int = 5  # tree depth (paper)
    widths: list[int] = field(default_factory=lambda: [4, 16, 16, 16, 16])  # beam width per depth (paper)
    window: int | None = None  # draft self-attention window (None = the checkpoint's; random: 512)
    target_layer: int | None = None  # target layer the draft reads (None = the checkpoint's; random: last)
    # auto: the shipped draft for the model (checkpoints/longspec/), a draft folder, a released
    # sail/longspec-* draft, or random (untrained: lossless, tau near 1); None: refused (one error line)
    checkpoint: str | None = None
    seed: int = 0  # init seed of checkpoint=random
    # masked: one SDPA over [cache | tree] | hybrid: the paper's split merged through log-sum-exps (the
    # same attention; masked is faster on CPU)
    tree_attention: str = "masked"
    # None: the draft proposes from the whole vocabulary (paper) | N (a CPU option): only from its
    # training data's N most frequent tokens, which shrinks its LM-head GEMM; lossless (the target
    # verifies); a draft without token counts (checkpoint=random) needs None
    draft_vocab: int | None = None
    # fixed: verify every drafted node (paper) | auto (ours, not the paper's): verify only the nodes worth
    # their rows on this hardware's cost curve, and stop drafting when a level no longer pays
    # (decoders/longspec/auto.py)
    block: str = recorded_without("fixed")
    # 0: the tree is the draft's alone (paper) | N (ours, not the paper's): up to N prompt-lookup tokens
    # join the tree as one more branch from the root
    lookup: int = recorded_without(0)
    # 1.0: the beam ranks nodes by the draft's own log-probs (paper) | T (ours, not the paper's): by the
    # log-probs of logits / T (drafting only; lossless)
    beam_temperature: float = recorded_without(1.0)


class LongSpec(BaseDecoder):
    name = "longspec"
    sizes_blocks_by_cost = True
    lossless = True  # the target verifies every token
    Config = LongSpecConfig

    def __init__(
        self, engine, kv=None, sampler: Sampler | None = None, draft_module: Any = None, **given: Any
    ) -> None:
        """`checkpoint`: a draft folder (`LongSpecDraft.save`), "auto" (the shipped draft for the target
        model), "random" (untrained, seeded by `seed`), or a released LongSpec draft (`sail/longspec-*`
        hub id or its folder: `decoders.longspec.sail`).
        `window` / `target_layer`: None = the checkpoint's (random: 512 / the last layer); a loaded
        draft's target layer cannot change. `draft_module`: a ready draft object (tests), instead of
        a checkpoint. `tree_attention`: "hybrid" (the paper's cache/tree split merged through LSEs) or
        "masked" (the same attention as one masked SDPA; faster on CPU): `core.tree_attention`.
        `draft_vocab`: None = the draft proposes from the whole vocabulary (the paper); N = only from
        the N tokens most frequent in its training data (`LongSpecDraft.restrict_vocab`; lossless).
        `block`: "fixed" verifies the whole drafted tree; "auto" sizes it by cost
        (`decoders.longspec.auto`). `lookup`: 0 = the paper's tree; N = up to N prompt-lookup tokens
        join the tree as one more branch from the root (ours; module docstring). `beam_temperature`:
        the draft's logits are divided by it before the beam ranks nodes by cumulative log-prob (1.0:
        the paper; above 1 flattens each parent's distribution, so the beam keeps more parents: ours).
        Drafting only: verification, hence losslessness, does not change."""
        o = options(self.Config, given)
        depth, widths, window, target_layer = o.depth, o.widths, o.window, o.target_layer
        checkpoint = o.checkpoint
        seed, tree_attention, draft_vocab, block = o.seed, o.tree_attention, o.draft_vocab, o.block
        lookup, beam_temperature = o.lookup, o.beam_temperature
        tree_attention = choice("decoder.tree_attention", tree_attention, BACKENDS)
        self.block = choice("decoder.block", block, BLOCK_MODES)
        self.lookup = integer("decoder.lookup", lookup, 0)
        self.beam_temperature = number("decoder.beam_temperature", beam_temperature, 0, low_open=True)
        self.lookup_stats = AcceptanceStats()  # block=auto: the lookup chain's acceptance by place
        self.draft_seconds: dict[int, float] = {}  # block=auto: draft forward seconds by row count
        self.calibration = DraftCalibration()
        self.tree_attention = tree_attention
        self.widths = _widths(depth, widths)
        self.depth = depth
        super().__init__(engine, kv, sampler)
        if not self.kv.lossless:
            raise HarnessError(
                f"decoder=longspec verifies over the full cache and drafts from the target's committed "
                f"entries; kv={self.kv.name} would only hide entries from it: use kv=full"
            )
        if window is not None:
            check_window(window)
        if target_layer is not None:
            target_layer = resolve_layer(target_layer, engine.w.n_layers)
        self.checkpoint = checkpoint
        self.draft = (
            draft_module if draft_module is not None else self._load(checkpoint, window, target_layer, seed)
        )
        self.draft_vocab = draft_vocab
        self._tree: DraftedTree | None = None  # the drafted tree's device buffers (`_tree_buffers`)
        if draft_vocab is not None:
            self.draft.restrict_vocab(draft_vocab)

    def _load(
        self, checkpoint: str | None, window: int | None, layer: int | None, seed: int
    ) -> LongSpecDraft:
        if checkpoint is None:
            raise HarnessError(
                "decoder=longspec needs a trained draft: set decoder.checkpoint=auto (the shipped draft "
                "for this model), =<draft folder>, or =random for an untrained random draft "
                "(lossless, tau near 1: smoke runs only)"
            )
        if str(checkpoint) == AUTO:
            folder = shipped_draft(self.engine)
            draft = LongSpecDraft.load(folder, self.engine, window)
            where = folder.relative_to(SHIPPED.parent.parent).as_posix()  # no machine-specific path
            draft.label = f"auto: {where}@{draft.label.rsplit('@', 1)[-1]}"
            return self._check_layer(draft, layer, checkpoint)
        if str(checkpoint) == RANDOM:
            last = self.engine.w.n_layers - 1
            return LongSpecDraft.init_for(
                self.engine, last if layer is None else layer, window or DEFAULT_WINDOW, seed
            )
        if is_sail(checkpoint):  # the authors' released drafts: sail/longspec-* (hub) or such a folder
            draft = load_sail(str(checkpoint), self.engine, window)
        else:
            draft = LongSpecDraft.load(Path(str(checkpoint)).expanduser(), self.engine, window)
        return self._check_layer(draft, layer, checkpoint)

    @staticmethod
    def _check_layer(draft: LongSpecDraft, layer: int | None, checkpoint: object) -> LongSpecDraft:
        if layer is not None and layer != draft.target_layer:
            raise HarnessError(
                f"decoder=longspec: the draft at {checkpoint} reads target layer {draft.target_layer}, "
                f"not decoder.target_layer={layer} (leave it null to use the checkpoint's)"
            )
        return draft

    def identity_extra(self) -> dict:
        """Which draft weights ran (the label holds the checkpoint's weights digest): a retrained draft
        behind the same `checkpoint: auto` gets a new run id."""
        return {} if str(self.checkpoint) == RANDOM else {"draft": self.draft.label}

    def max_block(self) -> int:
        return 1 + sum(self.widths) + self.lookup

    def use_cost(self, cost) -> None:
        """The cost curve, and (block=auto) the draft's forward seconds per beam size, measured now:
        the runner hands the curve over before anything is timed."""
        super().use_cost(cost)
        if self.block == "auto":
            context = max(min(4096, self.engine.max_positions - 2), 1)
            beams = [1, *self.widths[:-1]]
            self.draft_seconds = draft_step_seconds(self.draft, self.engine, context, beams)

    def prepare(self, prompt: list[int], counts: Counts) -> None:
        self.draft.start(prompt)  # the prompt is committed in the target cache: fill the draft's window
        self.calibration = DraftCalibration()  # block=auto: acceptance statistics of this generation
        self.lookup_stats = AcceptanceStats()

    # ------------------------------------------------------------------------------------------
    def _draft_tree(self, root: int, length: int, depth: int, counts: Counts) -> tuple[DraftedTree, float]:
        """Dynamic beam search under the draft, `depth` levels below the root (block=auto: fewer once a
        level no longer pays), kept on the device: each level's beam is a contiguous run of rows, so
        nothing is read back to choose it. Returns the tree and its draft seconds (block=auto's
        estimate, else 0)."""
        cost = self.block_cost()
        spent = 0.0
        draft = self.draft
        tree = self._tree_buffers().start(root)
        draft.begin_block()
        lo, hi = 0, 1  # the beam: rows lo..hi-1 (the root first)
        for d in range(1, depth + 1):
            window, beam = draft.cached, hi - lo
            # the draft's staged block is the tree's rows 0..hi-1 (this beam staged last)
            draft.expand(tree, lo, hi, length, d, self.widths[d - 1], self.beam_temperature)
            counts.draft_model_step(beam, window)
            lo, hi = hi, tree.size
            if cost is not None:
                spent += self._draft_cost(beam)
                if d < depth:
                    survival = self._survivals(tree.host(scores=True)[0])
                    frontier, next_cost = range(lo, hi), self._draft_cost(hi - lo)
                    if not deeper_pays(survival, frontier, self.calibration, cost, length, spent, next_cost):
                        break
        draft.begin_block()  # the staged block is not needed once the tree is drafted
        return tree, spent

    def _tree_buffers(self) -> DraftedTree:
        """The decoder's device buffers for one drafted tree (reused every step)."""
        dev = self.engine.device
        if self._tree is None or self._tree.tokens.device != dev:
            self._tree = DraftedTree(1 + sum(self.widths), self.draft.window, dev)
        return self._tree

    def _draft_cost(self, rows: int) -> float:
        if rows in self.draft_seconds:
            return self.draft_seconds[rows]
        if not self.draft_seconds:
            return 0.0
        near = min(self.draft_seconds, key=lambda r: abs(r - rows))  # a beam narrower than its width
        return self.draft_seconds[near]

    def _survivals(self, tree: Tree) -> list[float]:
        return survivals(tree.parent, lambda row: self._node_rate(tree, row))

    def _node_rate(self, tree: Tree, row: int) -> float:
        """P(node `row` accepted | its parent accepted): the draft's calibrated rate for its probability,
        the lookup chain's running rate at its place, the higher of the two for a node that is both."""
        rates = [self.lookup_stats.rate(tree.lookup_key, tree.lookup[row] - 1)] if tree.lookup[row] else []
        if tree.drafted[row]:
            rates.append(self.calibration.rate(node_probability(tree.score, tree.parent, row)))
        return max(rates)

    def _cut(self, tree: Tree, length: int, spent: float, cost) -> Tree:
        """block=auto: the root + the rows worth verifying (`best_block`), as a tree of their own."""
        keep, _ = best_block(self._survivals(tree), cost, length, spent)
        if len(keep) == len(tree.tokens) - 1:
            return tree
        cut, new_row = Tree([tree.tokens[0]], lookup_key=tree.lookup_key), {0: 0}
        for row in keep:  # row order: parents first
            new_row[row] = cut.add(
                tree.tokens[row],
                new_row[tree.parent[row]],
                tree.score[row],
                tree.drafted[row],
                tree.lookup[row],
            )
        return cut

    def _calibrate(self, tree: Tree, path: list[int]) -> None:
        """block=auto: every node whose parent the target accepted counts for its bin of q."""
        on_path = {0, *path}
        for row in range(1, len(tree.tokens)):
            if tree.drafted[row] and tree.parent[row] in on_path:
                q = node_probability(tree.score, tree.parent, row)
                self.calibration.update(q, row in on_path)
        for row in (0, *path):
            drafted = [c for c in tree.children[row] if tree.drafted[c]]
            if drafted:
                self.calibration.update_parent(any(c in on_path for c in drafted))
        if tree.lookup_key:  # the chain's places in the tree, and how many of them were accepted
            chain = sum(1 for place in tree.lookup if place)
            accepted = sum(1 for row in path if tree.lookup[row])
            self.lookup_stats.update(tree.lookup_key, chain, accepted)

    def _accept(
        self,
        tree: Tree,
        logits: torch.Tensor,
        preds: list[int] | None = None,
        sampled: list[float] | None = None,
    ) -> tuple[list[int], list[int]]:
        """The accepted path's tree rows and the committed tokens (accepted + bonus). `preds`: the
        target's argmax per row when already read back (greedy); `sampled`: `drafted_values` read back
        with a tree drafted on the device (sampling)."""
        rows: list[int] = []
        node = 0
        if self.sampler.greedy:
            if preds is None:
                preds = logits.argmax(-1).tolist()
            while True:
                nxt = next((c for c in tree.children[node] if tree.tokens[c] == preds[node]), None)
                if nxt is None:
                    return rows, [tree.tokens[r] for r in rows] + [preds[node]]
                rows.append(nxt)
                node = nxt
        tree_tokens = tree.tokens
        if sampled is not None:
            path, last = TreeWalk.of_drafted(tree.children, tree_tokens, self.sampler).walk(sampled)
            return path, [tree_tokens[r] for r in path] + [last]
        check = TreeCheck(
            range(len(tree_tokens)),
            [[tree_tokens[c] for c in kids] for kids in tree.children],
            tree.children,
            lambda r: self.sampler.probs(logits[r]),
            self.sampler,
            self.engine.stage,
            self.engine.device,
        )
        path, last = check.walk(check.read()[1])  # the step's one read of the verification
        return path, [tree_tokens[r] for r in path] + [last]

    def _decode(
        self, prompt: list[int], out: list[int], max_new_tokens: int, stop_ids: set[int], counts: Counts
    ) -> None:
        eng = self.engine
        done = False
        index = NGramIndex(LOOKUP_NGRAM, prompt + out) if self.lookup else None  # grows with `out`
        while not done:
            length = eng.length
            budget = max_new_tokens - len(out) - 1  # the bonus token comes on top
            depth = min(self.depth, budget)
            drafted, spent = None, 0.0
            if depth > 0:
                drafted, spent = self._draft_tree(out[-1], length, depth, counts)
            cost = self.block_cost()
            on_host = drafted is None or cost is not None or (self.lookup and budget > 0)
            preds: list[int] | None = None
            sampled: list[float] | None = None  # a sampled walk's values, read with the drafted tree
            if on_host:  # the tree changes on the host (lookup chain, cut): verify the host's tree
                tree = drafted.host(scores=cost is not None)[0] if drafted is not None else Tree([out[-1]])
                if index is not None and budget > 0:
                    index.extend(out[len(index.seq) - len(prompt) :])
                    matched, chain = index.match(min(self.lookup, budget))
                    tree.add_chain(chain, matched)
                if cost is not None and depth > 0:
                    tree = self._cut(tree, length, spent, cost)
                n = len(tree.tokens)
                mask = eng.stage(tree.ancestor_mask(), torch.bool)  # True diagonal by construction
                view = HybridTreeView(mask, eng.scale, self.tree_attention, check_diagonal=False)
                tokens, positions = eng.stage(tree.tokens), RelativePositions(eng.stage(tree.depth), length)
                logits, on_device = step_for(self.sampler, eng, tokens, positions, view)
                preds = on_device.tolist() if on_device is not None else None
            else:  # the drafted tree as it stands on the device; one read-back after the forward
                n = drafted.size
                mask = drafted.ancestors[:n, :n]
                view = HybridTreeView(mask, eng.scale, self.tree_attention, check_diagonal=False)
                logits, on_device = step_for(
                    self.sampler, eng, drafted.tokens[:n], RelativePositions(drafted.depths[:n], length), view
                )
                if on_device is None and gathers(eng.device):  # sampling: gathered on the device tree
                    gathered = drafted_values(
                        drafted.tokens[:n], drafted.parent[:n], self.sampler.probs(logits[:n]), self.sampler
                    )
                    tree, sampled = drafted.host(gathered)
                else:
                    tree, preds = drafted.host(on_device)
            path, new = self._accept(tree, logits, preds, sampled)
            if cost is not None:
                self._calibrate(tree, path)
            n_new, done = extend_output(out, new, max_new_tokens, stop_ids)
            rows = [0, *path][:n_new]
            eng.commit(rows)
            self.kv.after_commit(eng, len(rows))
            self.draft.commit([tree.tokens[r] for r in rows], length)
            counts.step(n, n - 1, len(path), n_new, view.kv_read(length))
