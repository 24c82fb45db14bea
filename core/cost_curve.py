"""The cost curve t(B, ctx) of one environment: seconds for one forward of B query rows over a cache
of ctx entries, measured on a grid (`measure_grid`), interpolated between grid points (`CostCurve`)
and cached on disk per (device with its ISA features, model, dtype, linear, threads) (`cached_curve`,
`store_curve`).

`python -m benchmarks.block_cost` measures the full grid and prints it beside the roofline model
(`analysis.cost_model`); the runner measures a compact grid once per environment when a decoder sizes
its blocks by cost (`decoder.block=auto`), before anything is timed.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from core.attention import CausalView
from core.decode_graph import padded_rows
from core.types import HarnessError

CostFn = Callable[[int, float], float]  # (rows, attended context) -> seconds

# What `step_seconds` times: bumped whenever that changes (an attention path a verification block
# takes, the view it runs under), so that curves cached before are measured again, not reused.
# 2: blocks of 2-10 rows over long CPU caches take `few_rows_attention`; 3: logits for every row;
# 4: noisy points measured again, a curve that stays noisy refused
MEASURE_VERSION = 4


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

    key: dict[str, object]  # device, model, dtype, linear, threads; graphs: True for replayed forwards
    rows: list[int]
    contexts: list[int]
    seconds: list[list[float]]  # [context index][rows index]
    shape: dict[str, object] | None = None  # analysis.cost_model.ModelShape fields of the model
    meta: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # also what a cache file read back must satisfy: one edited by hand or cut short is refused here
        if not isinstance(self.key, dict):
            raise ValueError("cost curve: its key must be a mapping of the environment's fields")
        for name, axis in (("rows", self.rows), ("contexts", self.contexts)):
            if not isinstance(axis, list) or not axis:
                raise ValueError(f"cost curve: {name} must be a non-empty list")
            if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in axis):
                raise ValueError(f"cost curve: {name} must be positive integers")
            if any(a >= b for a, b in zip(axis, axis[1:])):
                raise ValueError(f"cost curve: {name} must be strictly increasing")
        grid = self.seconds
        if (
            not isinstance(grid, list)
            or len(grid) != len(self.contexts)
            or any(not isinstance(r, list) or len(r) != len(self.rows) for r in grid)
        ):
            raise ValueError("cost curve: seconds must be a [contexts x rows] grid")
        numbers = all(isinstance(t, (int, float)) and not isinstance(t, bool) for line in grid for t in line)
        if not numbers or not all(math.isfinite(t) and t > 0 for line in grid for t in line):
            raise ValueError("cost curve: every measured forward must take a positive, finite time")
        if self.shape is not None and not isinstance(self.shape, dict):
            raise ValueError("cost curve: shape must be a mapping or null")
        if not isinstance(self.meta, dict):
            raise ValueError("cost curve: meta must be a mapping")

    @property
    def graphed(self) -> bool:
        """Measured on forwards replayed as CUDA graphs (`run.cuda_graphs`)."""
        return bool(self.key.get("graphs", False))

    def __call__(self, rows: int, ctx: float) -> float:
        """Interpolated linearly in rows and in context inside the grid; outside it, the nearest measured
        point (a line through two points can dive below zero past the grid's ends). Never <= 0. On a
        graphed curve `rows` cost what the block they are padded to costs (`padded_rows`)."""
        if self.graphed:
            rows = padded_rows(max(int(rows), 1))
        per_ctx = [_interp(self.rows, line, rows) for line in self.seconds]
        return max(_interp(self.contexts, per_ctx, ctx), self._floor)

    @property
    def _floor(self) -> float:
        return min(min(line) for line in self.seconds)

    def ratio(self, rows: int, ctx: float) -> float:
        return self(rows, ctx) / self(1, ctx)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> CostCurve:
        return cls(**json.loads(text))


def _interp(xs: list[int], ys: list[float], x: float) -> float:
    """Linear between the grid points around `x`; the end point's value beyond either end."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect_left(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


# --- the on-disk cache ------------------------------------------------------------------------------
def cache_dir() -> Path:
    default = Path.home() / ".cache" / "draftless-harness" / "block_cost"
    return Path(os.environ.get("HARNESS_COST_CACHE", str(default)))


def curve_key(
    device: str,
    model: str,
    dtype: str,
    linear: str,
    threads: int,
    *,
    graphs: bool,
    model_name: str = "",
    compiled: bool = False,
) -> dict[str, object]:
    """The environment a curve belongs to. `graphs`: measured on forwards replayed as CUDA graphs, which
    cost apart (absent when False, so an eager curve keeps the key and cache name it always had).
    `model_name`: the weights behind the config name `model` where they differ from it (`model=hf
    model.name=<id>`: one config name, any model), absent otherwise for the same reason. `compiled`: on
    forwards compiled by inductor (`run.compile`), absent when False likewise."""
    key = {"device": device, "model": model, "dtype": dtype, "linear": linear, "threads": threads}
    if model_name and model_name != model:
        key["model_name"] = model_name
    key = {**key, "graphs": True} if graphs else key
    return {**key, "compiled": True} if compiled else key


def cache_name(key: dict[str, object]) -> str:
    """File name of a curve in the cache: one per (device, model, dtype, linear, threads), and apart for
    forwards replayed as CUDA graphs (a key without `graphs` keeps the name it always had) and for each
    model behind one config name (`model_name`, present only where it differs: `model=hf`)."""
    parts = [str(key.get(k, "?")) for k in ("device", "model", "dtype", "linear", "threads")]
    parts += [str(key["model_name"])] if key.get("model_name") else []
    parts += ["graphs"] if key.get("graphs") else []
    parts += ["compiled"] if key.get("compiled") else []
    return "-".join("".join(c if c.isalnum() else "_" for c in p) for p in parts) + ".json"


def _plain(key: dict[str, object]) -> dict[str, str]:
    """A key as compared: values as text (JSON keeps them), `graphs` False the same as absent."""
    return {str(k): str(v) for k, v in key.items() if not (k in ("graphs", "compiled") and not v)}


def key_mismatch(stored: dict[str, object], wanted: dict[str, object]) -> str:
    """What differs between a cached curve's own key and the environment asked for ("" when nothing):
    a file can sit under this environment's name yet hold another's curve (copied, renamed, edited)."""
    have, want = _plain(stored), _plain(wanted)
    diff = [k for k in sorted(set(have) | set(want)) if have.get(k) != want.get(k)]
    return ", ".join(f"{k} {have.get(k, 'absent')!r} instead of {want.get(k, 'absent')!r}" for k in diff)


def read_cached(key: dict[str, object]) -> tuple[CostCurve | None, str]:
    """(the cached curve of this environment, "") when it can be used; (None, why not) when a file is
    there but holds no valid curve, another environment's curve, or one measured by another version of
    the measurement or of torch; (None, "") when there is none."""
    path = cache_dir() / cache_name(key)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None, ""
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"{path} cannot be read ({getattr(exc, 'strerror', None) or exc})"
    try:
        curve = CostCurve.from_json(text)
    except (ValueError, TypeError) as exc:  # not JSON, or not the fields and shape of a curve
        return None, f"{path} holds no valid cost curve ({str(exc).splitlines()[0][:120]})"
    mismatch = key_mismatch(curve.key, key)
    if mismatch:
        return None, f"{path} was measured for another environment ({mismatch})"
    if not is_current(curve):
        return None, f"{path} was measured by another version of the measurement or of torch"
    return curve, ""


def cached_curve(key: dict[str, object]) -> CostCurve | None:
    """The cached curve of this environment, or None (`read_cached` says why)."""
    return read_cached(key)[0]


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


def synthetic_prompt(eng, context: int) -> list[int]:
    """`context` token ids to measure with: the cost of a forward does not depend on them."""
    vocab = _vocab(eng)
    return [(100 + i % 1000) % vocab for i in range(context)]


def fill_cache(eng, context: int, room: int) -> list[int]:
    """Reset the engine's cache to `context` synthetic entries, with room for `room` more; returns their
    token ids (a draft that reads the prompt starts from them)."""
    prompt = synthetic_prompt(eng, context)
    eng.reset(context + room)
    eng.prefill(prompt)
    return prompt


def step_times(eng, context: int, rows: int, reps: int) -> list[float]:
    """Seconds of `reps` causal `rows`-row steps over the engine's `context`-entry cache (nothing kept:
    the cache stays at `context`). On an engine with CUDA graphs the steps are replayed, the first of a
    shape captured (`measure_grid` keeps a second pass)."""
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
    return times


def step_seconds(eng, context: int, rows: int, reps: int) -> float:
    """Median seconds of a causal `rows`-row step over the engine's `context`-entry cache."""
    return statistics.median(step_times(eng, context, rows, reps))


# A measured point is trusted when the middle half of its repeats spans at most NOISY_SPREAD of their
# median (plus JITTER_FLOOR_S, below which a scheduler's time slice decides); a row count may cost less
# than a smaller one only by both points' jitter plus FLAT_SLACK of the smaller one's time (more rows
# never cost less work). Points failing either are measured again with RETRY_REPS times the repeats,
# up to MEASURE_TRIES times in all, and a curve still failing is refused rather than cached: one busy
# moment would otherwise size every later `block=auto` run on this machine.
NOISY_SPREAD = 0.5
FLAT_SLACK = 0.05
JITTER_FLOOR_S = 1e-3
MEASURE_TRIES = 3
RETRY_REPS = 3


class NoisyCurve(HarnessError):
    """The machine was too busy for a cost curve that can be trusted; nothing was cached."""


def _middle(times: list[float]) -> list[float]:
    ordered = sorted(times)
    cut = len(ordered) // 4
    return ordered[cut : len(ordered) - cut]


def _jitter(times: list[float]) -> float:
    """Half the spread of the middle repeats, in seconds."""
    middle = _middle(times)
    return (middle[-1] - middle[0]) / 2


def _noisy(times: list[float]) -> bool:
    return 2 * _jitter(times) > NOISY_SPREAD * statistics.median(times) + JITTER_FLOOR_S


def _drops(line: list[list[float]]) -> list[int]:
    """Indexes j where j + 1 rows' median costs less than j rows' by more than the jitter allows."""
    med = [statistics.median(t) for t in line]
    return [
        j
        for j in range(len(line) - 1)
        if med[j + 1] < med[j] * (1 - FLAT_SLACK) - _jitter(line[j]) - _jitter(line[j + 1]) - JITTER_FLOOR_S
    ]


def suspect_points(line: list[list[float]]) -> list[int]:
    """Indexes of the points of one context's line (repeat times per row count) to measure again:
    those whose repeats disagree, and both ends of every drop in cost as rows grow."""
    bad = {j for j, times in enumerate(line) if _noisy(times)}
    for j in _drops(line):
        bad |= {j, j + 1}
    return sorted(bad)


def _why(line: list[list[float]], rows: list[int], ctx: int) -> str:
    med = [statistics.median(t) for t in line]
    drops = _drops(line)
    if drops:
        j = drops[0]
        more, fewer = f"{rows[j + 1]} rows took {med[j + 1]:.3g} s", f"{rows[j]} rows {med[j]:.3g} s"
        return f"at {ctx} cache entries {more}, {fewer}"
    j = next(j for j, t in enumerate(line) if _noisy(t))
    lo, hi = min(_middle(line[j])), max(_middle(line[j]))
    return f"at {ctx} cache entries repeats of {rows[j]} rows took {lo:.3g} to {hi:.3g} s"


def measure_grid(eng, rows: list[int], contexts: list[int], reps: int) -> list[list[float]]:
    """Median seconds per forward, [context][rows]; each context is measured twice (the first pass
    warms the allocator and kernels) and the second pass kept, then its suspect points (see
    `suspect_points`) measured again. Raises NoisyCurve when a context's line stays suspect. Leaves the
    engine's cache in an arbitrary state: callers reset it before generating."""
    grid = []
    for ctx in contexts:
        fill_cache(eng, ctx, max(rows) + 1)
        line: list[list[float]] = []
        for _ in range(2):
            line = [step_times(eng, ctx, b, reps) for b in rows]
        for _ in range(MEASURE_TRIES - 1):
            bad = suspect_points(line)
            if not bad:
                break
            for j in bad:
                line[j] = step_times(eng, ctx, rows[j], reps * RETRY_REPS)
        if suspect_points(line):
            raise NoisyCurve(
                f"the cost curve measured for decoder.block=auto stays noisy after {MEASURE_TRIES} tries "
                f"({_why(line, rows, ctx)}): the machine is busy; nothing was cached. Rerun when it is "
                "quieter (the curve is measured again), or use decoder.block=fixed"
            )
        grid.append([statistics.median(t) for t in line])
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
    curve, why = (None, "") if refresh else read_cached(key)
    if curve is not None and curve.rows[-1] >= max_rows:
        return curve, False
    if curve is not None:
        why = f"its largest block, {curve.rows[-1]} rows, is below this decoder's {max_rows}"
    rows, contexts = runtime_grid(max_rows, eng.max_positions)
    if on_measure is not None:
        on_measure(
            f"measuring this environment's cost curve ({len(rows)} block sizes x {len(contexts)} cache "
            f"lengths, once; cached in {cache_dir()})"
            + (f"; the cached one is not used: {why}" if why else "")
        )
    seconds = measure_grid(eng, rows, contexts, reps)
    curve = CostCurve(key, rows, contexts, seconds, None, measurement_meta(reps))
    store_curve(curve)
    return curve, True
