"""The cost curve t(B, ctx) of one environment: seconds for one forward of B query rows over a cache
of ctx entries, measured on a grid (`measure_grid`), interpolated between grid points (`CostCurve`)
and cached on disk per (device, model, dtype, linear, threads) (`cached_curve`, `store_curve`).

`python -m benchmarks.block_cost` measures the full grid and prints it beside the roofline model
(`analysis.cost_model`); the runner measures a compact grid once per environment when a decoder sizes
its blocks by cost (`decoder.block=auto`), before anything is timed.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from core.attention import CausalView

CostFn = Callable[[int, float], float]  # (rows, attended context) -> seconds

# What `step_seconds` times: bumped whenever that changes (an attention path a verification block
# takes, the view it runs under), so that curves cached before are measured again, not reused.
# 2: blocks of 2-10 rows over long CPU caches take `few_rows_attention`; 3: logits for every row
MEASURE_VERSION = 3


def measurement_meta(reps: int) -> dict[str, object]:
    """The `meta` of a curve measured now: how many repeats, which measurement, which torch."""
    return {"reps": reps, "measure_version": MEASURE_VERSION, "torch": torch.__version__}


def is_current(curve: CostCurve) -> bool:
    """Whether `curve` was measured by this code's `step_seconds` under this torch."""
    meta = curve.meta
    return meta.get("measure_version") == MEASURE_VERSION and meta.get("torch") == torch.__version__


@dataclass
class CostCurve:
    """Seconds per forward measured on a grid of block rows x cache lengths, for one environment."""

    key: dict[str, object]  # device, model, dtype, linear, threads
    rows: list[int]
    contexts: list[int]
    seconds: list[list[float]]  # [context index][rows index]
    shape: dict[str, object] | None = None  # analysis.cost_model.ModelShape fields of the model
    meta: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if sorted(self.rows) != self.rows or sorted(self.contexts) != self.contexts:
            raise ValueError("cost curve: rows and contexts must be increasing")
        if len(self.seconds) != len(self.contexts) or any(len(r) != len(self.rows) for r in self.seconds):
            raise ValueError("cost curve: seconds must be a [contexts x rows] grid")

    def __call__(self, rows: int, ctx: float) -> float:
        """Interpolated linearly in rows and in context; linear extrapolation past the grid's ends
        (the last two points' slope: cost grows with rows and entries), never below 0."""
        per_ctx = [_interp(self.rows, line, rows) for line in self.seconds]
        return max(_interp(self.contexts, per_ctx, ctx), 0.0)

    def ratio(self, rows: int, ctx: float) -> float:
        return self(rows, ctx) / self(1, ctx)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> CostCurve:
        return cls(**json.loads(text))


def _interp(xs: list[int], ys: list[float], x: float) -> float:
    if len(xs) == 1:
        return ys[0]
    i = min(max(bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


# --- the on-disk cache ------------------------------------------------------------------------------
def cache_dir() -> Path:
    default = Path.home() / ".cache" / "draftless-harness" / "block_cost"
    return Path(os.environ.get("HARNESS_COST_CACHE", str(default)))


def cache_name(key: dict[str, object]) -> str:
    """File name of a curve in the cache: one per (device, model, dtype, linear, threads)."""
    parts = [str(key.get(k, "?")) for k in ("device", "model", "dtype", "linear", "threads")]
    return "-".join("".join(c if c.isalnum() else "_" for c in p) for p in parts) + ".json"


def cached_curve(key: dict[str, object]) -> CostCurve | None:
    """The cached curve of this environment (None when absent, unreadable, or measured by another
    version of the measurement or of torch)."""
    path = cache_dir() / cache_name(key)
    try:
        curve = CostCurve.from_json(path.read_text())
    except (OSError, ValueError, TypeError):
        return None
    return curve if is_current(curve) else None


def store_curve(curve: CostCurve) -> Path:
    """Write `curve` into the cache atomically; returns its path."""
    path = cache_dir() / cache_name(curve.key)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(curve.to_json())
    tmp.replace(path)
    return path


# --- measuring ---------------------------------------------------------------------------------------
def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op off CUDA): timing brackets need it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _vocab(eng) -> int:
    return int(eng.model.config.vocab_size)


def step_seconds(eng, context: int, rows: int, reps: int) -> float:
    """Median seconds of a causal `rows`-row step over the engine's `context`-entry cache (nothing
    kept: the cache stays at `context`)."""
    # the attention a causal block of this size gets in a decoder's verification (one row: vanilla's
    # split decode attention; a few rows over a long CPU cache: `few_rows_attention`; else masked SDPA)
    view = CausalView(eng.scale)
    tokens = (torch.arange(rows) + 3) % _vocab(eng)  # any ids: the cost does not depend on them
    pos = torch.arange(context, context + rows)
    times = []
    for _ in range(reps):
        synchronize(eng.device)
        t0 = time.perf_counter()
        eng.step(tokens, pos, view)  # logits for every row: a verification reads each row's
        synchronize(eng.device)
        times.append(time.perf_counter() - t0)
        eng.commit([])
    return statistics.median(times)


def measure_grid(eng, rows: list[int], contexts: list[int], reps: int) -> list[list[float]]:
    """Median seconds per forward, [context][rows]; each context is measured twice (the first pass
    warms the allocator and kernels) and the second pass kept. Leaves the engine's cache in an
    arbitrary state: callers reset it before generating."""
    grid = []
    for ctx in contexts:
        eng.reset(ctx + max(rows) + 1)
        vocab = _vocab(eng)
        eng.prefill([(100 + i % 1000) % vocab for i in range(ctx)])
        line: list[float] = []
        for _ in range(2):
            line = [step_seconds(eng, ctx, b, reps) for b in rows]
        grid.append(line)
    return grid


def runtime_grid(max_rows: int, max_positions: int) -> tuple[list[int], list[int]]:
    """The compact grid the runner measures for `decoder.block=auto`: rows 1, 2, 4, .. up to the
    decoder's largest block, at up to three cache lengths the model can hold."""
    rows = [1]
    while rows[-1] < max_rows:
        rows.append(min(rows[-1] * 2, max_rows))
    room = max_positions - rows[-1] - 1
    contexts = sorted({c for c in (256, 1024, 4096) if c <= room}) or [max(room // 2, 1)]
    return rows, contexts


def cached_or_measured(
    eng,
    key: dict[str, object],
    max_rows: int,
    reps: int = 5,
    on_measure: Callable[[str], None] | None = None,
    refresh: bool = False,
) -> tuple[CostCurve, bool]:
    """The environment `key`'s curve from the cache when it reaches `max_rows` rows (and not `refresh`);
    otherwise measured now on `runtime_grid` (reported first through `on_measure`) and cached. Returns
    (curve, measured now). Measuring leaves the engine's cache in an arbitrary state."""
    curve = None if refresh else cached_curve(key)
    if curve is not None and curve.rows[-1] >= max_rows:
        return curve, False
    rows, contexts = runtime_grid(max_rows, eng.max_positions)
    if on_measure is not None:
        on_measure(
            f"measuring this environment's cost curve ({len(rows)} block sizes x {len(contexts)} cache "
            f"lengths, once; cached in {cache_dir()})"
        )
    seconds = measure_grid(eng, rows, contexts, reps)
    curve = CostCurve(key, rows, contexts, seconds, None, measurement_meta(reps))
    store_curve(curve)
    return curve, True
