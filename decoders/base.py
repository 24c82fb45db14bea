"""The decoder contract: what every decoder must and may provide, and what the runner gives it.

A decoder is a small class: `generate` (here) runs the prefill, then hands everything after it to the
subclass's `_decode`, which calls `engine.step` / `engine.commit` and reports counts, never time.

A subclass MUST provide:
- `name`: its config name (conf/decoder/<name>.yaml), written into the records;
- `_decode(prompt, out, max_new_tokens, stop_ids, counts)`: append the generated tokens to `out`
  (it holds the first token, picked from the prefill's logits) until `max_new_tokens` or a stop
  token (`extend_output` does both), calling `counts.step(...)` once per target decode forward;
- `lossless`: whether its output equals vanilla greedy (a class attribute, or a property when it
  depends on the KV policy).
It MAY provide:
- `max_block()`: the most query rows one step stages (sizes the cache; default 1);
- `prepare(prompt, counts)`: prefill-phase work besides the target's own prefill (a draft model's);
- `identity_extra()`: run-identity fields its config does not determine (a checkpoint's digest);
- `compiles_attention()`: True when its attention compiles per shape, so the runner's warm-up
  covers the whole generation length;
- `sizes_blocks_by_cost = True` with a `block` attribute: `block=auto` is available; the runner then
  measures the environment's cost curve and calls `use_cost(curve)` before the first generation.
Its options live in one dataclass, `Config` (`core.options`: each option's type, default and meaning,
the keys of its conf/decoder/ YAML, what the records show); its constructor takes `engine`, `kv` and
`sampler`, then those options as keywords (`options(self.Config, given)`), each checked with
`core.checks`, which raise one `HarnessError` naming the field. Anything else the
runner must pass is declared in `needs`: `"tokenizer"` (the target's tokenizer) and/or `"draft"`
(the run's `draft` group, a `decoders.draft_model.DraftModel`). The runner never inspects a
constructor's signature; `docs/adding-a-decoder.md` walks through a new decoder.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch

from core.cost_curve import CostFn
from core.engine import Engine
from core.options import NoOptions
from core.sampling import Sampler
from core.types import Counts, HarnessError
from decoders.verify import step_for
from kv_policies.base import KVPolicy
from kv_policies.full import FullKV

NEEDS = frozenset({"tokenizer", "draft"})  # what a decoder may declare in `needs`


class BaseDecoder:
    """Base of every decoder (the contract is in this module's docstring)."""

    name: str = "base"
    lossless: bool = True
    needs: ClassVar[frozenset[str]] = frozenset()
    Config: ClassVar[type] = NoOptions  # its options (core.options): the one place each is declared
    sizes_blocks_by_cost: ClassVar[bool] = False
    block: str = "fixed"  # "auto" (where `sizes_blocks_by_cost`): blocks sized by the cost curve
    cost: CostFn | None = None

    def __init__(self, engine: Engine, kv: KVPolicy | None = None, sampler: Sampler | None = None) -> None:
        self.engine = engine
        self.kv = kv or FullKV()
        self.sampler = sampler or Sampler()

    def max_block(self) -> int:
        """Largest number of query tokens one step may stage (sizes the cache)."""
        return 1

    def use_cost(self, cost: CostFn) -> None:
        """The environment's cost curve t(rows, ctx), for `block=auto` (set by the runner)."""
        self.cost = cost

    def block_cost(self) -> CostFn | None:
        """The cost curve when blocks are sized by cost, None for fixed blocks."""
        if self.block != "auto":
            return None
        if self.cost is None:
            raise HarnessError(
                f"{self.name}: block=auto sizes blocks from a cost curve; none was given "
                "(the runner measures one; outside it call decoder.use_cost(curve))"
            )
        return self.cost

    def compiles_attention(self) -> bool:
        """True when this decoder's attention compiles per shape (FlexAttention): the runner's warm-up
        then covers the whole generation length."""
        return getattr(self.kv, "backend", "dense") == "flex" and not self.kv.lossless

    def generate(
        self, prompt_ids: Sequence[int], max_new_tokens: int, stop_ids: set[int], counts: Counts
    ) -> list[int]:
        if max_new_tokens <= 0:
            raise HarnessError(f"max_new_tokens must be positive, got {max_new_tokens}")
        if not prompt_ids:
            raise HarnessError("empty prompt")
        eng = self.engine
        need = len(prompt_ids) + max_new_tokens
        if need > eng.max_positions:
            raise HarnessError(
                f"prompt ({len(prompt_ids)} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model "
                f"context ({eng.max_positions}); lower max_new_tokens or truncate the task's inputs"
            )
        eng.reset(need + self.max_block() + 1)
        # the policy's state and hooks live for this generation only (the engine may serve others)
        self.kv.attach(eng)
        self.kv.reset(len(prompt_ids), need)
        counts.kv_budget = self.kv.budget
        logits = eng.prefill(prompt_ids, hooks=self.kv.prefill_hooks())
        self.kv.after_prefill(eng)
        first = self.sampler.pick(logits)
        self.prepare(list(prompt_ids), counts)
        counts.prefill_done(len(prompt_ids))
        out = [first]
        if first not in stop_ids and max_new_tokens > 1:
            self._decode(list(prompt_ids), out, max_new_tokens, stop_ids, counts)
        counts.decode_done()
        counts.resolve()
        counts.kv_activity = self.kv.activity.summary(counts.forwards)
        return out

    def step_and_pick(self, tokens: torch.Tensor, positions: torch.Tensor, view) -> int:
        """One target forward of one row and the token after it: greedy, the step's own argmax (chosen
        on the device, one read), sampled, the sampler's draw from its logits."""
        logits, ids = step_for(self.sampler, self.engine, tokens, positions, view)
        return int(ids[0]) if ids is not None else self.sampler.pick(logits[0])

    def identity_extra(self) -> dict:
        """Run-identity fields the decoder's config does not determine (a draft checkpoint's weights
        digest); empty for most decoders, so their run ids are those of their config."""
        return {}

    def prepare(self, prompt: list[int], counts: Counts) -> None:
        """Prefill-phase work besides the target's prefill (a draft model's own prefill)."""

    def _decode(
        self, prompt: list[int], out: list[int], max_new_tokens: int, stop_ids: set[int], counts: Counts
    ) -> None:
        raise NotImplementedError


def extend_output(
    out: list[int], new: Sequence[int], max_new_tokens: int, stop_ids: set[int]
) -> tuple[int, bool]:
    """Append `new` to `out` up to a stop token (kept) or the length limit. Returns (appended, done)."""
    n = 0
    for tok in new:
        if len(out) >= max_new_tokens:
            return n, True
        out.append(int(tok))
        n += 1
        if tok in stop_ids:
            return n, True
    return n, len(out) >= max_new_tokens
