"""A small draft model for hierarchical speculation (TriForce's M_q): its own engine and its own
StreamingLLM cache with in-cache positions.

The draft keeps `sinks` first entries and the most recent ones, and numbers them by cache slot (the
StreamingLLM "pos shift" the TriForce repository uses for JackFram/llama-68m, whose window is 2k), so it
runs over contexts far longer than its own window. Entries are evicted in batches: the cache grows
from `budget` entries to `budget + room` and is then cut back to the sinks plus the most recent
entries (keys re-rotated by `Engine.evict`), so a draft row sees between `budget` and `budget + room`
entries. The draft holds speculative tokens too; a proposal first rolls back whatever the target did
not keep (a common-prefix check against the sequence it is given), so the caller never manages the
draft's cache.

`build_draft(cfg, target_lm, target_engine)` turns the `draft` config group into one of these (or None
for `draft=none`, the self-speculative form), with the checks a user needs: the same vocabulary as
the target, a window that holds the cache budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from core.attention import CausalView
from core.engine import Engine
from core.models import PACKAGED_GGUF, load_model
from core.sampling import Sampler
from core.types import Counts, HarnessError

KINDS = ("none", "self_layers", "hub", "packaged", "tiny")


class DraftModel:
    # what the runner times as the draft's forwards (runners.timing.DraftClock): a step of its engine
    # with the eviction and commit around it
    FORWARDS = ("_feed_ids",)  # every forward of the draft (`_feed` goes through it)

    def __init__(
        self, engine: Engine, label: str, vocab_size: int, budget: int = 256, sinks: int = 16, room: int = 64
    ) -> None:
        for what, v, lo in (("budget", budget, 2), ("sinks", sinks, 0), ("room", room, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise HarnessError(f"draft: {what} must be an integer >= {lo}, got {v!r}")
        if sinks >= budget:
            raise HarnessError(f"draft: budget ({budget}) must exceed sinks ({sinks})")
        self.engine, self.label, self.vocab_size = engine, label, vocab_size
        self.budget, self.sinks, self.room = budget, sinks, room
        self.recent = budget - sinks
        self.capacity = budget + room
        if self.capacity > engine.max_positions:
            raise HarnessError(
                f"draft={label}: its cache (budget {budget} + room {room} = {self.capacity} positions) "
                f"exceeds the draft model's context ({engine.max_positions}); "
                "lower draft.budget or draft.room"
            )
        self.fed: list[int] = []  # the tokens whose KV the draft cache holds, in order
        self.settled = 0  # fed[:settled] is known to be final

    def params(self) -> dict:
        return {"label": self.label, "budget": self.budget, "sinks": self.sinks, "room": self.room}

    def check_block(self, span: int) -> None:
        """The draft may hold `span` speculative tokens; eviction must never reach them."""
        if span > self.room or 2 * span > self.recent:
            raise HarnessError(
                f"draft={self.label}: up to {span} speculative tokens (gamma1 + gamma2 + 2) need "
                f"draft.room >= {span} and draft.budget - draft.sinks >= {2 * span} "
                f"(have room {self.room}, recent {self.recent})"
            )

    # ------------------------------------------------------------------------------------------
    def start(self, prompt: Sequence[int], counts: Counts) -> None:
        """Reset the cache and stream the prompt through it (chunks of half the recent window)."""
        eng = self.engine
        chunk = max(1, min(eng.prefill_chunk, self.recent // 2))
        # entries never exceed `capacity`; the slots past it hold the pad rows of a fixed-shape forward
        # (core.decode_graph pads a block of n <= max(chunk, room) rows to a power of two, < 2n)
        eng.reset(self.capacity + max(chunk, self.room))
        self.fed, self.settled = [], 0
        for lo in range(0, len(prompt) - 1, chunk):  # the last prompt token is the first root
            self._feed(list(prompt[lo : min(lo + chunk, len(prompt) - 1)]), counts, logits=False)
        self.settled = len(self.fed)

    def _feed(
        self, tokens: list[int], counts: Counts, logits: bool = True, pick_into: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        ids = self.engine.stage(tokens)
        out = self._feed_ids(ids, counts, pick_into)
        self.fed += tokens
        return out if logits else None

    def _feed_ids(
        self, ids: torch.Tensor, counts: Counts, pick_into: torch.Tensor | None = None
    ) -> torch.Tensor:
        """One forward of the draft over `ids` (a device tensor; the caller records them in `fed`);
        the last row's logits. `pick_into` (a 0-dim device tensor): also write their greedy choice
        there, on the device, as part of the draft's step."""
        eng = self.engine
        n = ids.numel()
        if eng.length + n > self.capacity:  # keep the sinks and the most recent entries
            keep = self.recent - n
            eng.evict(self.sinks, eng.length - keep)
        lo = eng.length
        out = eng.step(ids, eng.positions(lo, n), CausalView(eng.scale), [n - 1])
        eng.commit(range(n))
        counts.draft_model_step(n, lo)
        if pick_into is not None:
            torch.argmax(self._fit(out[0]), dim=-1, out=pick_into)
        return out[0]

    def _sync(self, seq: Sequence[int], committed: int) -> list[int]:
        """Roll the cache back to its longest prefix of `seq` short of the last token; return the tokens of
        `seq` still to feed."""
        i = self.settled
        n = min(len(self.fed), len(seq))
        while i < n and self.fed[i] == seq[i]:
            i += 1
        i = min(i, len(seq) - 1)  # the last token is always fed: its row gives the first draft
        drop = len(self.fed) - i
        if drop:
            self.engine.crop(self.engine.length - drop)
            del self.fed[i:]
        self.settled = min(i, committed)
        return list(seq[i:])

    def _fit(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft logits over the target's vocabulary (rows the draft lacks get probability 0)."""
        v = logits.shape[-1]
        if v == self.vocab_size:
            return logits
        if v > self.vocab_size:
            return logits[: self.vocab_size]
        pad = torch.full((self.vocab_size - v,), float("-inf"), dtype=logits.dtype, device=logits.device)
        return torch.cat([logits, pad])

    @torch.inference_mode()
    def propose_chain(
        self, seq: Sequence[int], committed: int, n: int, counts: Counts, lead: int | None = None
    ) -> torch.Tensor:
        """`n` greedy draft tokens after `seq` as a device tensor, each fed to the draft from the device
        without the host reading it. The caller reads them (with whatever else it reads) and hands them
        to `drafted`. With `lead`, the tensor starts with that token (`[lead, d1..dn]`: a verifier's
        root in front of the drafts, written in place instead of concatenated)."""
        first = int(lead is not None)
        chain = torch.empty(first + n, dtype=torch.long, device=self.engine.device)
        if lead is not None:
            chain[0] = lead
        self._feed(self._sync(seq, committed), counts, logits=False, pick_into=chain[first] if n else None)
        for i in range(first + 1, first + n):
            self._feed_ids(chain[i - 1 : i], counts, pick_into=chain[i])
        return chain

    @torch.inference_mode()
    def propose_sampled(
        self, seq: Sequence[int], committed: int, n: int, sampler: Sampler, counts: Counts, lead: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`propose_chain` with each token drawn from the sampler's distribution on the device
        (`Sampler.device_draw`): `[lead, d1..dn]` and those distributions `[n, vocab]`, which the
        verifier's speculative sampling compares with its own."""
        chain = torch.empty(1 + n, dtype=torch.long, device=self.engine.device)
        chain[0] = lead
        logits = self._feed(self._sync(seq, committed), counts)
        probs = []
        for i in range(1, 1 + n):
            assert logits is not None
            probs.append(sampler.probs(self._fit(logits)))
            chain[i] = sampler.device_draw(probs[-1])
            if i < n:
                logits = self._feed_ids(chain[i : i + 1], counts)
        return chain, torch.stack(probs)

    def drafted(self, tokens: list[int]) -> None:
        """The host values of `propose_chain`'s tokens: all but the last were fed to the draft."""
        self.fed += tokens[:-1]


# --- the `draft` config group --------------------------------------------------------------------
def build_draft(cfg: Any, target_lm: Any, target: Engine) -> DraftModel | None:
    """The draft model a `draft` config node names (None for `draft=none`)."""
    if cfg is None:
        return None
    kind = cfg.get("kind", "none")
    if kind not in KINDS:
        raise HarnessError(f"draft.kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind == "none":
        return None
    cache = {k: cfg[k] for k in ("budget", "sinks", "room") if cfg.get(k) is not None}
    vocab = target.w.vocab_size
    if kind == "self_layers":
        layers = cfg.get("layers")
        n = target.w.n_layers
        if isinstance(layers, bool) or not isinstance(layers, int) or not 0 < layers < n:
            raise HarnessError(
                f"draft=self_layers: layers must be an integer in [1, {n - 1}], got {layers!r}"
            )
        label = f"self-draft: first {layers} of {n} layers (layer-truncated target, not the paper's draft)"
        return DraftModel(target.truncated(layers), label, vocab, **cache)

    dtype = str(target.dtype).replace("torch.", "")
    if kind == "tiny":
        lm = load_model(
            "tiny", "tiny", dtype=dtype, device=str(target.device), arch=cfg.get("arch", "llama"),
            seed=int(cfg.get("seed", 1)), tiny=dict(cfg.get("tiny") or {}),
        )  # fmt: skip
        label = f"tiny random {cfg.get('arch', 'llama')} (tests)"
    elif kind == "packaged":  # an offline model of core.models.PACKAGED_GGUF, e.g. qwen25-coder-0.5b
        name = cfg.get("name")
        if not name or name == "???":
            known = ", ".join(PACKAGED_GGUF)
            raise HarnessError(f"draft.kind=packaged needs draft.name=<one of {known}>")
        lm = load_model("packaged", str(name), dtype=dtype, device=str(target.device))
        label = str(name)
    else:
        name = cfg.get("name")
        if not name or name == "???":
            raise HarnessError("draft=hf needs draft.name=<hub id or local folder>")
        lm = load_model(
            "hub", str(name), dtype=dtype, device=str(target.device), revision=cfg.get("revision")
        )
        label = str(name)
    check_same_vocabulary(target_lm.tokenizer, lm.tokenizer, label)
    engine = Engine(lm.model, prefill_chunk=target.prefill_chunk)
    if target.graphs is not None:  # the draft's steps are graphed like the target's
        engine.use_graphs(target.graphs.capture, target.graphs.compiled)
    return DraftModel(engine, label, vocab, **cache)


def check_same_vocabulary(target_tok: Any, draft_tok: Any, label: str) -> None:
    """A draft proposes token ids: it must use the target's tokenizer vocabulary."""
    get = getattr(target_tok, "get_vocab", None), getattr(draft_tok, "get_vocab", None)
    if get[0] is None or get[1] is None:
        same = type(target_tok) is type(draft_tok)
    else:
        same = get[0]() == get[1]()
    if not same:
        raise HarnessError(
            f"draft={label}: its tokenizer vocabulary differs from the target's; a draft must share the "
            "target's vocabulary (e.g. JackFram/llama-68m for Llama-2 targets)"
        )
