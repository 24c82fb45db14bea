"""SFI's decoder (Algorithm 1 of "Slow-Fast Inference"): vanilla decoding whose steps alternate
between fast steps over `kv=sfi`'s sparse set and slow, dense steps that choose that set again.

A step is slow when it is the first decode step, when the previous token is a boundary token, or when
`t_max` fast steps have passed since the last slow one; every other step is fast. Slow steps attend to
the whole cache (their token is the dense model's); fast steps see sinks + recent window + the
selected entries. LOSSY: fast steps may pick other tokens than dense decoding (the audit measures how
often and where).

Boundary tokens (`triggers`, the paper's {. ? ! ; newline}): a token "ends with" a boundary when its
decoded text, with trailing spaces and tabs removed (newlines kept), ends with one of the characters;
the set is built once per tokenizer from every vocabulary entry.

Counts: one step per forward (`block_tokens` 1); `slow_steps` per generation; the policy's activity
(`restricted_frac` = fast steps that hid something, `visible_frac`) comes from `kv=sfi`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import torch

from core.attention import CausalView, View
from core.checks import integer
from core.options import options
from core.types import Counts, HarnessError
from decoders.base import BaseDecoder, extend_output

TRIGGERS = (".", "?", "!", ";", "\n")


def trigger_ids(tokenizer: Any, triggers: tuple[str, ...] = TRIGGERS) -> frozenset[int]:
    """Ids of the tokens whose decoded text (trailing spaces/tabs stripped) ends with a trigger."""
    return _trigger_ids(tokenizer, tuple(triggers))


@lru_cache(maxsize=8)
def _trigger_ids(tokenizer: Any, triggers: tuple[str, ...]) -> frozenset[int]:
    size = len(tokenizer.get_vocab()) if hasattr(tokenizer, "get_vocab") else int(tokenizer.vocab_size)
    texts = tokenizer.batch_decode([[i] for i in range(size)]) if hasattr(tokenizer, "batch_decode") else [
        tokenizer.decode([i]) for i in range(size)
    ]  # fmt: skip
    return frozenset(i for i, t in enumerate(texts) if t.rstrip(" \t\r").endswith(triggers))


@dataclass
class SlowFastConfig:
    t_max: int = 64  # fast steps before a forced slow step
    # a token whose text ends with one of these triggers a slow step
    triggers: list[str] = field(default_factory=lambda: list(TRIGGERS))


class SlowFast(BaseDecoder):
    name = "sfi"
    needs = frozenset({"tokenizer"})  # boundary tokens are read off the vocabulary
    lossless = False
    Config = SlowFastConfig

    def __init__(
        self,
        engine,
        kv=None,
        sampler=None,
        tokenizer: Any = None,
        trigger_token_ids: set[int] | frozenset[int] | None = None,
        **given: Any,
    ) -> None:
        o = options(self.Config, given)
        t_max = integer("decoder.t_max", o.t_max, 1)
        triggers = tuple(str(t) for t in o.triggers)
        if not triggers or not all(triggers):
            raise HarnessError(
                f"decoder=sfi: triggers must be a non-empty list of characters, got {triggers!r}"
            )
        super().__init__(engine, kv, sampler)
        if getattr(self.kv, "name", "") != "sfi":
            raise HarnessError(
                f"decoder=sfi needs kv=sfi (its sparse set and Selector), got kv={self.kv.name}"
            )
        self.t_max, self.triggers = t_max, triggers
        if trigger_token_ids is None:
            if tokenizer is None:
                raise HarnessError(
                    "decoder=sfi needs the tokenizer (or trigger_token_ids) to find boundary tokens"
                )
            trigger_token_ids = trigger_ids(tokenizer, triggers)
        if not trigger_token_ids:
            raise HarnessError(f"decoder=sfi: no token of the vocabulary ends with any of {triggers!r}")
        self.trigger_token_ids = frozenset(trigger_token_ids)

    def _decode(
        self, prompt: list[int], out: list[int], max_new_tokens: int, stop_ids: set[int], counts: Counts
    ) -> None:
        eng, kv = self.engine, self.kv
        tok = torch.empty(1, dtype=torch.long, device=eng.device)
        position, since_slow, slow, done = len(prompt), 0, True, False
        while not done:
            tok[0] = out[-1]
            if slow:
                kv.begin_slow()
                view: View = kv.slow_view(eng)
            else:
                view = kv.fast_view(eng)
            try:
                token = self.step_and_pick(tok, eng.positions(position, 1), view)
            finally:
                kv.end_slow()
            eng.commit([0])
            kv.after_commit(eng, 1)
            position += 1
            n, done = extend_output(out, [token], max_new_tokens, stop_ids)
            read = eng.length - 1 if isinstance(view, CausalView) else view.kv_read(eng.length - 1)
            counts.step(1, 0, 0, n, read)
            counts.slow_steps += int(slow)
            since_slow = 0 if slow else since_slow + 1
            slow = out[-1] in self.trigger_token_ids or since_slow >= self.t_max
