"""Plain data types shared by decoders, tasks and the runner."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    import torch

    from core.kv_cache import KVCache
    from kv_policies.activity import Activity


@dataclass
class Sample:
    """One benchmark item. `turns` holds the user messages (1 for single-turn tasks)."""

    sample_id: str
    turns: list[str]
    category: str = ""
    reference: Any = None  # gold answer / tests / anything the task's scorer needs
    meta: dict[str, Any] = field(default_factory=dict)
    raw_prompt: bool = False  # True: feed turns[0] as raw text (completion tasks), no chat template


class DeviceReads(NamedTuple):
    """A forward's KV reads still on the device: `per_layer` (a tensor of the entries each layer reads per
    KV head) plus `plus` entries every layer reads too (a draft's fresh tail), added by `Counts` when it
    reads them, so that a view makes no operator of its own to report them."""

    per_layer: Any
    plus: int = 0


@dataclass
class StepRecord:
    """Counts for ONE target-model forward over a block of new tokens."""

    block_tokens: int  # query tokens in the forward
    drafted: int  # candidate tokens submitted for verification
    accepted: int  # candidate tokens accepted (bonus excluded)
    committed: int  # tokens appended to the output (accepted + bonus)
    kv_attended: int  # cached KV entries read by this forward, summed over layers and KV heads / n_kv_heads
    draft: bool = False  # a self-speculative draft forward (the target over a KV policy's selection)
    draft_model: bool = False  # a forward of a separate draft model (TriForce's M_q); kv_attended = its cache


class Counts:
    """What a decoder reports. The runner owns the clock and passes `on_prefill_done` (and, to tell the
    decode loop from the reads made once per generation after it, `on_decode_done`)."""

    def __init__(
        self, on_prefill_done: Any = None, keep_steps: bool = True, on_decode_done: Any = None
    ) -> None:
        self.steps: list[StepRecord] = []
        self.prefill_tokens = 0
        self.forwards = 0
        self.drafted = 0
        self.accepted = 0
        self.committed = 0
        self.kv_attended = 0
        self.draft_forwards = 0  # self-speculative draft forwards (not in `forwards`, not in tau)
        self.draft_model_forwards = 0  # forwards of a separate draft model (hierarchical speculation)
        self.drafted_l1 = 0  # hierarchy, level 1: draft-model tokens checked by the target over the policy
        self.accepted_l1 = 0  # ... and accepted there (the final level is `drafted` / `accepted`)
        self.slow_steps = 0  # SFI: dense steps that chose the sparse set again (the rest are fast steps)
        self.kv_rebuilds = 0  # times a drafting decoder had the KV policy choose its selection again
        self.keep_steps = keep_steps
        self._on_prefill_done = on_prefill_done
        self._on_decode_done = on_decode_done
        self.kv_budget: int | None = None  # the KV policy's budget in this generation (None: unbounded)
        self.kv_activity: Activity | None = None  # how much the policy restricted
        self._deferred: list[tuple[DeviceReads, StepRecord | None]] = []  # KV reads still on the device

    def prefill_done(self, n_tokens: int) -> None:
        self.prefill_tokens += n_tokens
        if self._on_prefill_done is not None:
            self._on_prefill_done()

    def decode_done(self) -> None:
        """The decode loop ended (`BaseDecoder.generate` calls it before the generation's deferred reads)."""
        if self._on_decode_done is not None:
            self._on_decode_done()

    def step(self, block_tokens: int, drafted: int, accepted: int, committed: int, kv_attended: Any) -> None:
        """One target forward. `kv_attended`: an int, or a device tensor the host need not wait for (a
        view's `kv_read`: the entries read per layer, whose rounded mean is the forward's read), or such a
        tensor with entries every layer reads on top (`DeviceReads`); device reads are taken by `resolve`
        when the generation ends."""
        self.forwards += 1
        self.drafted += drafted
        self.accepted += accepted
        self.committed += committed
        rec = StepRecord(block_tokens, drafted, accepted, committed, 0) if self.keep_steps else None
        self._add_read(kv_attended, rec)
        if rec is not None:
            self.steps.append(rec)

    def _add_read(self, kv_attended: Any, rec: StepRecord | None) -> None:
        if isinstance(kv_attended, int):
            self.kv_attended += kv_attended
            if rec is not None:
                rec.kv_attended = kv_attended
        else:
            reads = kv_attended if isinstance(kv_attended, DeviceReads) else DeviceReads(kv_attended)
            self._deferred.append((reads, rec))

    def resolve(self) -> None:
        """Read the deferred KV reads: each the rounded mean of its elements (per-layer reads), worked
        out for all reads of one size at once and read in one host-device transfer per generation."""
        if not self._deferred:
            return
        import torch

        by_size: dict[int, list[int]] = {}
        for i, (reads, _) in enumerate(self._deferred):
            by_size.setdefault(reads.per_layer.numel(), []).append(i)
        order = [i for idx in by_size.values() for i in idx]
        means = [
            torch.stack([self._deferred[i][0].per_layer.reshape(size) for i in idx]).double().mean(1)
            for size, idx in by_size.items()
        ]
        values = dict(zip(order, torch.cat(means).tolist(), strict=True))
        for i, (reads, rec) in enumerate(self._deferred):
            value = round(values[i] + reads.plus)  # half to even, as torch rounds
            self.kv_attended += value
            if rec is not None:
                rec.kv_attended = value
        self._deferred = []

    def draft_step(
        self, kv_attended: Any, block_tokens: int = 1, drafted: int = 0, accepted: int = 0
    ) -> None:
        """One draft forward of the target over a KV policy's selection (self-speculation): its KV reads
        count, its tokens do not. In a hierarchy it checks `drafted` draft-model tokens (level 1) and
        accepts `accepted` of them."""
        self.draft_forwards += 1
        self.drafted_l1 += drafted
        self.accepted_l1 += accepted
        rec = StepRecord(block_tokens, drafted, accepted, 0, 0, draft=True) if self.keep_steps else None
        self._add_read(kv_attended, rec)
        if rec is not None:
            self.steps.append(rec)

    def draft_model_step(self, block_tokens: int, cache_len: int) -> None:
        """One forward of a separate draft model over its own cache of `cache_len` entries (its KV is
        another model's: not in `kv_attended`)."""
        self.draft_model_forwards += 1
        if self.keep_steps:
            self.steps.append(StepRecord(block_tokens, 0, 0, 0, cache_len, draft=True, draft_model=True))

    def kv_rebuild(self, kv_read: float) -> None:
        """The KV policy chose its selection again (`KVPolicy.rebuild`), reading `kv_read` cached
        entries per layer and KV head (keys count half an entry); the reads count with the forwards'."""
        self.kv_rebuilds += 1
        self.kv_attended += round(kv_read)

    @property
    def tau(self) -> float:
        """Mean tokens committed per target forward after prefill (bonus included)."""
        return self.committed / self.forwards if self.forwards else float("nan")


class Decoder(Protocol):
    lossless: bool

    def generate(
        self, prompt_ids: list[int], max_new_tokens: int, stop_ids: set[int], counts: Counts
    ) -> list[int]: ...


class PolicyEngine(Protocol):
    """The parts of `core.engine.Engine` a KV policy, its slot map, its views and its compressed region
    read: the engine itself in a run, `tests.helpers.FakeEngine` (a real cache, eager forwards) in the
    policies' unit tests. What only a real engine has (`replayable`, `model`, ...) is read on paths a
    stand-in never takes (fixed-shape forwards, kvpress's model hooks)."""

    cache: KVCache
    scale: float
    device: torch.device

    @property
    def length(self) -> int: ...

    @property
    def fixed_shape(self) -> bool: ...

    @property
    def captured(self) -> bool: ...


class HarnessError(Exception):
    """A user-facing error: the runner prints its message as one line and exits non-zero."""


@dataclass(frozen=True)
class LayerSkip:
    """Sublayers a forward leaves out (`Engine.step(skip=...)`): the attention of the layers in `attn`
    and the MLP of those in `mlp`, by layer index (SWIFT's layer-skipping self-draft, arXiv 2410.06916)."""

    attn: frozenset[int] = frozenset()
    mlp: frozenset[int] = frozenset()

    @property
    def size(self) -> int:
        """Sublayers skipped."""
        return len(self.attn) + len(self.mlp)
