"""CUDA-graph capture emulated on a CPU (`core.replay.Replay`), for the tests of the fixed-shape forwards
(`core.decode_graph`) and for runs that rehearse a GPU session on a CPU (`run.cuda_graphs=emulate`,
`scripts/gpu_lease.sh rehearse`).

A captured CUDA graph replays the kernels of one run on the same memory: every operator, every shape
and every Python value of the run (a slice bound, a scalar operand, a length) is fixed when it is
captured, and only what the forward reads from its device buffers changes between replays. The eager
twin (`Engine.use_graphs(capture=False)`) runs the forward's Python every step, so a value that should
have come from a buffer but was taken from the host (`cache.length`, a row count) gives the right
answer there and a stale one under a graph, on a GPU only.

`emulated_capture()` patches `Replay` so that `capture=True` works on any device the way CUDA graphs
do: the warm-up runs, then one run recorded operator by operator (`TorchDispatchMode`) with its
Python values, the state restored as after a capture (a captured run computes nothing), the memory
the run allocated for itself poisoned (a graph's temporaries are overwritten by later replays), and each call
a replay of the recorded operators on the same tensors, writing the recorded outputs in place. The
recorded run must not wait for the device nor take a tensor from the host into a device operator
(`runners.host_syncs` tells them apart on a CPU): a capture can do neither. Nor may it mix a float
buffer of another precision than the model's into its operators (`mixed_precision_buffers`): a CUDA
graph replays the silent cast as well, so an fp32 buffer in a bf16 run passes there unnoticed.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from core.replay import Replay
from runners.host_syncs import HostSyncs


class _Recorder(TorchDispatchMode):
    """Every operator of a run with its arguments and outputs (kept alive, so that their ids name them),
    and those that would mix host data into a device operator (`probe`'s view of which is which): a
    capture takes no tensor from the host but a Python number."""

    def __init__(self, probe: HostSyncs) -> None:
        super().__init__()
        self.probe = probe
        self.ops: list[tuple[Any, Any, Any, Any]] = []
        self.host_operands: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if any(self.probe.on_device(t) for t in tensors) and any(
            t.dim() and t in self.probe.host for t in tensors
        ):
            self.host_operands.append(str(func))
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


class EmulatedGraph:
    """The recorded operators of one run, replayed: a tensor made inside the run is the replay's own,
    one made before it (weights, cache, staged buffers) is the same tensor, every other value as
    recorded. The recorded run's outputs are the graph's output buffers."""

    def __init__(self, ops: list[tuple[Any, Any, Any, Any]], out: Any) -> None:
        self.ops, self.out = ops, out

    def replay(self) -> None:
        made: dict[int, torch.Tensor] = {}

        def now(x: Any) -> Any:
            return made.get(id(x), x) if isinstance(x, torch.Tensor) else x

        for func, args, kwargs, out in self.ops:
            fresh = func(*tree_map(now, args), **tree_map(now, kwargs))
            for was, new in zip(tree_leaves(out), tree_leaves(fresh), strict=True):
                if isinstance(was, torch.Tensor):
                    made[id(was)] = new
        for buffer in tree_leaves(self.out):
            if isinstance(buffer, torch.Tensor) and id(buffer) in made and made[id(buffer)] is not buffer:
                buffer.copy_(made[id(buffer)])


def _storage(t: torch.Tensor) -> int | None:
    """Where `t`'s memory starts; None for a tensor without a storage (oneDNN's packed weights)."""
    try:
        return t.untyped_storage().data_ptr()
    except (NotImplementedError, RuntimeError):
        return None


def poison(t: torch.Tensor) -> None:
    """Values no correct reader uses: NaN, an index far out of any range, True."""
    if t.is_floating_point() or t.is_complex():
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.fill_(True)
    else:
        t.fill_(torch.iinfo(t.dtype).max)


def poison_temporaries(ops: list[tuple[Any, Any, Any, Any]], out: Any, state: tuple = ()) -> int:
    """Poison the memory a recorded run allocated for itself (`poison`), but its outputs and what it
    shares with tensors made before it (weights, cache, staged buffers, `state`), and return how many
    storages. A CUDA graph's temporaries live in its private pool, which later replays and other graphs
    overwrite; here they would keep their capture-time values, so code that reads one outside the graph
    would read a plausible stale value: poisoned, it fails."""
    keep = {_storage(t) for t in tree_leaves((out, state)) if isinstance(t, torch.Tensor)}
    made: set[int] = set()
    for _, args, kwargs, o in ops:  # a tensor read before any operator of the run made it was there before
        keep.update(
            _storage(t)
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor) and id(t) not in made
        )
        made.update(id(t) for t in tree_leaves(o) if isinstance(t, torch.Tensor))
    done: set[int] = set()
    with torch.inference_mode():  # the run's tensors may be inference tensors
        _poison_each(ops, keep, done)
    return len(done)


def _poison_each(ops: list[tuple[Any, Any, Any, Any]], keep: set[int | None], done: set[int]) -> None:
    for *_, o in ops:
        for t in tree_leaves(o):
            if not isinstance(t, torch.Tensor) or not t.numel():
                continue
            where = _storage(t)
            if where is not None and where not in keep and where not in done:
                done.add(where)
                base = t._base if t._base is not None else t
                poison(base)


def mixed_precision_buffers(ops: list[tuple[Any, Any, Any, Any]]) -> list[str]:
    """The operators of a recorded run that mix a float buffer made before the run (staged, static,
    cached) of another dtype than the model's with operands of other dtypes: PyTorch promotes or casts
    it silently (an fp32 buffer in a bf16 run doubles what a replay reads and moves the result to fp32,
    or `copy_` rounds it), where the code means the model's precision. The model's dtype: the one of
    the largest float tensor the run reads from before it (its weights). Upcasts made inside the run
    (`x.float()` for a norm or a softmax) are the run's own tensors and pass."""
    made: set[int] = set()
    before: dict[int, torch.Tensor] = {}
    for _, args, kwargs, o in ops:
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, torch.Tensor) and t.is_floating_point() and id(t) not in made:
                before.setdefault(id(t), t)
        made.update(id(t) for t in tree_leaves(o) if isinstance(t, torch.Tensor))
    if not before:
        return []
    model = max(before.values(), key=lambda t: t.numel()).dtype
    found = []
    for func, args, kwargs, _ in ops:
        floats = [
            t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.is_floating_point()
        ]
        if len({t.dtype for t in floats}) < 2:
            continue
        odd = [t for t in floats if id(t) in before and t.dtype != model and t.dim()]
        if odd:
            found.append(f"{func} reads a {odd[0].dtype} buffer in a {model} run")
    return sorted(set(found))


def _capture(self: Replay) -> None:
    """`Replay._capture` on any device: two warm-up runs, the state restored, one recorded run (no
    synchronisation allowed), the state restored again (a capture does not run the kernels)."""
    saved = [t.clone() for t in self.state]

    def restore() -> None:
        for t, before in zip(self.state, saved, strict=True):
            t.copy_(before)

    for _ in range(2):
        self.run()
    restore()
    probe = HostSyncs(self.device, trace=True)
    recorder = _Recorder(probe)
    with probe, recorder:
        out = self.run()
    if probe.count:
        raise AssertionError(f"a captured run waits for the device: {dict(probe.sites or {})}")
    if recorder.host_operands:
        raise AssertionError(f"a captured run takes host tensors into {sorted(set(recorder.host_operands))}")
    mixed = mixed_precision_buffers(recorder.ops)
    if mixed:
        raise AssertionError(
            f"a captured run casts buffers of another precision than the model's: {mixed[:5]}"
        )
    restore()
    poison_temporaries(recorder.ops, out, self.state)
    self.graph, self.out = EmulatedGraph(recorder.ops, out), out
    self.captures += 1


@contextlib.contextmanager
def captured(device: torch.device | str) -> Iterator[None]:
    """`Replay(capture=True)` as CUDA graphs on a CUDA device, emulated as above elsewhere."""
    if torch.device(device).type == "cuda":
        yield
    else:
        with emulated_capture():
            yield


def emulate_graphs(engine) -> None:
    """`run.cuda_graphs=emulate`: `engine`'s fixed-shape forwards captured and replayed as above, for the
    rest of the process (a rehearsal runs one configuration per process; the tests use the contexts)."""
    Replay._capture = _capture
    engine.use_graphs(capture=True)


@contextlib.contextmanager
def emulated_capture() -> Iterator[None]:
    """`Replay(capture=True)` emulated as above while the block runs (any device)."""
    original = Replay._capture
    Replay._capture = _capture
    try:
        yield
    finally:
        Replay._capture = original


# Operators a CUDA device runs with a host tensor among device ones: copies (a transfer), indexing with
# host indices (moved by PyTorch) and the aliasing of a fresh tensor. Every other operator mixing a
# device tensor with a host one of one or more dimensions raises there: "Expected all tensors to be on
# the same device".
MIXABLE = frozenset(
    {
        torch.ops.aten.copy_.default,
        torch.ops.aten._to_copy.default,
        torch.ops.aten.lift_fresh.default,
        torch.ops.aten.index.Tensor,
        torch.ops.aten.index_put_.default,
        torch.ops.aten.index_put.default,
        torch.ops.aten._index_put_impl_.default,
    }
)


class _Mixing(TorchDispatchMode):
    """Operators that take a device tensor and a host tensor (`probe`'s view of which is which), with the
    line of ours that dispatched each."""

    def __init__(self, probe: HostSyncs) -> None:
        super().__init__()
        self.probe = probe
        self.mixed: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in MIXABLE:
            tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            if any(self.probe.on_device(t) for t in tensors) and any(
                t.dim() and t in self.probe.host for t in tensors
            ):
                self.mixed.append(f"{func} at {_caller()}")
        return func(*args, **kwargs)


def _caller() -> str:
    """The innermost frame of this repository's code outside this module and torch."""
    repo = str(Path(__file__).resolve().parents[1])
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(repo) and not name.endswith("emulated_graphs.py") and "host_syncs" not in name:
            return f"{Path(name).relative_to(repo)}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


@contextlib.contextmanager
def one_device(device: torch.device | str) -> Iterator[None]:
    """Fail (AssertionError) when the code in the block mixes a host tensor into a device operator, as a
    CUDA device refuses to, on any device: on a CPU, `runners.host_syncs` tells the tensors a GPU run
    would hold on the host (made without a device, from Python data, moved by `.cpu()`) from the others.
    The cause of CUDA-only failures of code that had only run on a CPU."""
    if torch.device(device).type == "cuda":  # the device itself refuses
        yield
        return
    probe = HostSyncs(torch.device(device))
    mixing = _Mixing(probe)
    with probe, mixing:
        yield
    if mixing.mixed:
        raise AssertionError(f"host tensors mixed into device operators: {sorted(set(mixing.mixed))[:5]}")
