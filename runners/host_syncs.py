"""Counts the host-device synchronisations of a piece of code, on any device (a CPU included).

A synchronisation here is an operation that makes the host wait for a device tensor's data: a scalar
read (`.item()`, `int(t)`, `float(t)`, `bool(t)`, `if t:`, `torch.equal`), a read of a whole tensor
(`.tolist()`, `.numpy()`, `torch.tensor([t0, t1])`), an operator whose output shape depends on the data
(`nonzero`, boolean-mask indexing, `masked_select`, `unique`, `repeat_interleave` without an output
size, ...), a copy from the device to the host (`.cpu()`), and a blocking copy of host data to the
device (`torch.tensor(values, device=...)`, `.to(device)` or `copy_` of a host tensor without
`non_blocking`: PyTorch synchronises the stream after such a copy; `Engine.stage` copies without one).
They are seen at the dispatcher (`TorchDispatchMode`) and, for what never reaches it on a CPU
(`tolist`, `numpy`, `.cpu()`, `torch.tensor(..., device=...)`, `.to(device)`), at the Python API
(`TorchFunctionMode`), so the count does not need a GPU.

On a GPU a tensor's device says whether reading it waits. On a CPU every tensor is on the one device,
so the counter tells them apart the way the code would place them on a GPU: a tensor made without a
`device` (or with the string "cpu"), a Python value made a tensor (`t[i] = 1`), what `.cpu()` returns,
whatever is computed from such tensors only, and what indexing one gives is a host tensor, reading it
is free; every other tensor (the model's, the cache's, one made with `device=engine.device`, whatever
mixes them) is a device tensor. Tensors made before counting started count as device tensors.

Both modes put every operator through Python, which costs far more than the operators of a small
model: count in an untimed generation, never in a timed one.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from collections.abc import Collection
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

from core.replay import Replay
from core.types import Counts
from runners.forwards import MethodPatch, model_forwards

aten = torch.ops.aten

# the host reads a value out of the tensor's data
SCALAR_READS = frozenset(
    {
        aten._local_scalar_dense.default,
        aten.item.default,
        aten.is_nonzero.default,
        aten.equal.default,
        aten.allclose.default,
    }
)
# the output's shape is the data's: the host learns it before it can allocate the output
DATA_SHAPED = frozenset(
    {
        aten.nonzero.default,
        aten.nonzero_numpy.default,
        aten.argwhere.default,
        aten.where.default,  # the one-argument form (torch.where(cond))
        aten.masked_select.default,
        aten._unique.default,
        aten._unique2.default,
        aten.unique_dim.default,
        aten.unique_consecutive.default,
        aten.unique_dim_consecutive.default,
        aten.bincount.default,
    }
)
REPEAT_INTERLEAVE = frozenset({aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor})
MASK_INDEXING = frozenset(
    {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
)
LIFTS = frozenset({aten.lift_fresh.default, aten.lift_fresh_copy.default})
INDEXING = frozenset({aten.index.Tensor, aten.index_select.default, aten.gather.default})
COPIES = frozenset({aten._to_copy.default, aten.to.dtype_layout, aten.to.device, aten.to.other})
# Python-level reads of a whole tensor that never reach the dispatcher for a CPU tensor
WHOLE_READS = frozenset({torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.__array__})
FROM_DATA = frozenset({torch.tensor, torch.as_tensor})
# factories whose tensor is on the host unless a device is named
FACTORIES = FROM_DATA | frozenset(
    {
        torch.arange, torch.zeros, torch.ones, torch.full, torch.empty, torch.eye, torch.linspace,
        torch.rand, torch.randn, torch.randint, torch.randperm, torch.from_numpy, torch.frombuffer,
    }
)  # fmt: skip
MOVES = frozenset({torch.Tensor.cpu, torch.Tensor.to})


class HostSyncs:
    """`with HostSyncs(device) as syncs:` counts, in `syncs.count`, the synchronisations of the code in
    the block (the module docstring says which); `mark()` notes a point, `since_mark` counts after it
    (up to `stop()`, after which what happens is counted in `after_stop` only: a generation's reads made
    once after its decode loop are not per step). `trace=True` also counts them by operator and calling
    line in `sites` (up to `stop()`)."""

    def __init__(self, device: torch.device | str, trace: bool = False) -> None:
        self.device_type = torch.device(device).type
        self.count = 0
        self.marked_at = 0
        self.stopped = False
        self.after_stop = 0
        self.sites: Counter[str] | None = Counter() if trace else None
        self.host = WeakIdKeyDictionary()  # CPU: the tensors a GPU run would hold on the host
        self.reading = False  # inside a counted Python-level call: its own operators are that one
        # device operators outside the model forwards (`forwards_apart`): kernel launches on a GPU
        self.launches = 0
        self.launches_marked_at = 0
        self.in_forward = 0  # depth of the target/draft forwards being run
        self.in_factory = 0  # inside a tensor factory (counted as one launch by the function mode)
        self._modes = (_FunctionCounter(self), _DispatchCounter(self))

    def mark(self) -> None:
        self.marked_at = self.count
        self.launches_marked_at = self.launches
        self.stopped = False

    def stop(self) -> None:
        self.stopped = True

    @property
    def since_mark(self) -> int:
        return self.count - self.marked_at

    @property
    def launches_since_mark(self) -> int:
        return self.launches - self.launches_marked_at

    def launches_kernel(self, func: Any, args: tuple, kwargs: dict, out: Any) -> bool:
        """Whether one dispatched operator outside a forward would launch a device kernel: it computes
        (not a view or metadata) and touches a device tensor."""
        if self.stopped or self.in_forward or self.in_factory or func in SCALAR_READS or _is_view(func):
            return False
        return any(self.on_device(t) for t in tree_leaves((args, kwargs, out)))

    def __enter__(self) -> HostSyncs:
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)

    # ------------------------------------------------------------------------------------------
    def add(self, what: str) -> None:
        if self.stopped:
            self.after_stop += 1
            return
        self.count += 1
        if self.sites is not None:
            self.sites[f"{what} at {_caller()}"] += 1

    def on_device(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t.device.type == self.device_type and t not in self.host

    def place(self, t: Any, host: bool) -> None:
        if isinstance(t, torch.Tensor) and self.device_type == "cpu":
            if host:
                self.host[t] = True
            else:
                self.host.pop(t, None)

    def syncs(self, func: Any, args: tuple, kwargs: dict) -> bool:
        """Whether one dispatched operator waits for the device."""
        first = args[0] if args else None
        if func in SCALAR_READS or func in DATA_SHAPED:
            return self.on_device(first)
        if func in REPEAT_INTERLEAVE:
            return kwargs.get("output_size") is None and self.on_device(first)
        if func in MASK_INDEXING:
            return self.on_device(first) and any(_is_mask(i) for i in args[1])
        if func is aten.copy_.default:
            blocking = not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
            return (_on_host(args[0], self) and self.on_device(args[1])) or (
                blocking and self.on_device(args[0]) and _host_data(args[1], self)
            )
        if func in COPIES and self.device_type != "cpu":  # a CPU's moves are `Tensor.cpu` / `.to`
            dest = _destination(args[1:], kwargs) if func is not aten.to.other else args[1].device
            if dest is None:
                return False
            if torch.device(dest).type == "cpu":
                return self.on_device(first)
            return not kwargs.get("non_blocking", False) and _host_data(first, self)
        return False

    def propagate(self, func: Any, args: tuple, kwargs: dict, out: Any) -> None:
        """CPU: a Python value made a tensor (`t[i] = 1`'s 1), and what is computed from host tensors
        only, is a host tensor."""
        if self.device_type != "cpu":
            return
        if func in LIFTS:
            self.place(out, host=True)
            return
        if not self.host:
            return
        if func in INDEXING and args and isinstance(args[0], torch.Tensor) and args[0] in self.host:
            # indexing a host tensor reads host data, whatever the index (one made before counting)
            for t in tree_leaves(out):
                self.place(t, host=True)
            return
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if inputs and all(t in self.host for t in inputs):
            for t in tree_leaves(out):
                self.place(t, host=True)


def _is_view(func: Any) -> bool:
    """An operator that returns a view of its input (no kernel runs)."""
    return any(r.alias_info is not None and not r.alias_info.is_write for r in func._schema.returns)


@contextlib.contextmanager
def forwards_apart(probe: HostSyncs, dec: Any):
    """While active, the operators of `dec`'s target forwards (`engine.step`) and of its draft model's
    forwards (the methods its class names in `FORWARDS`, as `runners.timing.DraftClock`) are not
    counted in `probe.launches`: what is left is the decoder's own device work."""

    def apart(inner):
        def forward(*args, **kwargs):
            probe.in_forward += 1
            try:
                return inner(*args, **kwargs)
            finally:
                probe.in_forward -= 1

        return forward

    patch = MethodPatch(model_forwards(dec), apart)
    try:
        yield probe
    finally:
        patch.undo()


@contextlib.contextmanager
def graph_bodies_apart(probe: HostSyncs):
    """While active, the operators of the fixed-shape forwards' bodies (`core.replay.Replay`: what
    a CUDA graph replays, target and draft) are not counted in `probe.launches`, and each replay counts
    as one launch: what is left is what a step launches with CUDA graphs on (the graphs, their staging
    and the decoder's own device work). Run with the fixed-shape forwards eager (`capture=False`), it
    counts on any device."""
    inner = Replay.__call__

    def replay(self: Replay, key: tuple) -> Any:
        probe.launches += not probe.stopped
        probe.in_forward += 1
        try:
            return inner(self, key)
        finally:
            probe.in_forward -= 1

    Replay.__call__ = replay  # type: ignore[method-assign]
    try:
        yield probe
    finally:
        Replay.__call__ = inner  # type: ignore[method-assign]


def _on_host(t: Any, probe: HostSyncs) -> bool:
    return isinstance(t, torch.Tensor) and not probe.on_device(t)


def _host_data(t: Any, probe: HostSyncs) -> bool:
    """A host tensor whose copy to the device is a memcpy (a 0-dim one, a Python value being written,
    is not counted)."""
    return isinstance(t, torch.Tensor) and t.dim() > 0 and not probe.on_device(t)


def _is_mask(index: Any) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


def _destination(args: tuple, kwargs: dict) -> Any:
    """The device a `to`-like call names (None: none named)."""
    if kwargs.get("device") is not None:
        return kwargs["device"]
    for a in args:
        if isinstance(a, (str, torch.device)):
            return a
        if isinstance(a, torch.Tensor):
            return a.device
    return None


def _names_host(device: Any) -> bool:
    """Whether a factory's `device` argument puts its tensor on the host when the code runs on a GPU."""
    return device is None or (isinstance(device, str) and torch.device(device).type == "cpu")


def _holds_device_tensor(data: Any, probe: HostSyncs) -> bool:
    """Whether a (nested) Python sequence holds a device tensor (`torch.tensor` then reads it)."""
    if isinstance(data, (list, tuple)):
        return any(probe.on_device(x) or _holds_device_tensor(x, probe) for x in data)
    return False


TORCH_DIR = str(Path(torch.__file__).parent)


def _caller() -> str:
    """`file:line function` of the innermost frame outside torch and this module."""
    frame = sys._getframe(2)
    while frame is not None and (
        frame.f_code.co_filename.startswith(TORCH_DIR) or frame.f_code.co_filename == __file__
    ):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} {frame.f_code.co_name}"


class _FunctionCounter(TorchFunctionMode):
    """Reads the dispatcher does not see, and (on a CPU) where the code puts the tensors it makes."""

    def __init__(self, probe: HostSyncs) -> None:
        super().__init__()
        self.probe = probe

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        probe = self.probe
        if probe.reading or not args and func not in FACTORIES:
            return func(*args, **kwargs)
        if func in MOVES and probe.device_type == "cpu":
            return self._move(func, args, kwargs)
        read = (func in WHOLE_READS and probe.on_device(args[0])) or (
            func in FROM_DATA and bool(args) and _holds_device_tensor(args[0], probe)
        )
        if (
            func in FROM_DATA
            and probe.device_type == "cpu"
            and not _names_host(kwargs.get("device"))
            and bool(args)
            and (not isinstance(args[0], torch.Tensor) or args[0] in probe.host)
        ):
            read = True  # host values made a device tensor: a blocking copy (a GPU's dispatcher sees it)
        if func in FACTORIES:  # one launch (a fill or a copy) when made on the device
            probe.in_factory += 1
            try:
                out = self._call(func, args, kwargs, read)
            finally:
                probe.in_factory -= 1
            on_host = _names_host(kwargs.get("device"))
            if probe.device_type == "cpu":
                probe.place(out, host=on_host)
            if not (on_host or probe.in_forward or probe.reading or probe.stopped or func is torch.empty):
                probe.launches += 1  # (an empty tensor is an allocation: no kernel fills it)
            return out
        return self._call(func, args, kwargs, read)

    def _call(self, func, args: tuple, kwargs: dict, read: bool) -> Any:
        if not read:
            return func(*args, **kwargs)
        self.probe.add(getattr(func, "__name__", str(func)))
        self.probe.reading = True
        try:
            return func(*args, **kwargs)
        finally:
            self.probe.reading = False

    def _move(self, func, args: tuple, kwargs: dict) -> Any:
        """`.cpu()` / `.to("cpu")`: a copy to the host; `.to(engine.device)`: a copy to the device. On a
        CPU both return the tensor itself, so the result is a view that can be placed apart from it."""
        probe, src = self.probe, args[0]
        dest = torch.device("cpu") if func is torch.Tensor.cpu else _destination(args[1:], kwargs)
        if dest is None:  # a dtype change: stays where it is (the dispatcher propagates)
            return func(*args, **kwargs)
        to_host = isinstance(dest, str) and torch.device(dest).type == "cpu" or func is torch.Tensor.cpu
        if isinstance(dest, torch.Tensor):
            to_host = dest in probe.host
        blocking_upload = (
            not to_host and src in probe.host and src.dim() > 0 and not kwargs.get("non_blocking")
        )
        out = self._call(func, args, kwargs, read=to_host and probe.on_device(src) or blocking_upload)
        if out is src and (src in probe.host) != to_host:
            out = out.view_as(out)
        probe.place(out, host=to_host)
        return out


class _DispatchCounter(TorchDispatchMode):
    def __init__(self, probe: HostSyncs) -> None:
        super().__init__()
        self.probe = probe

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        probe = self.probe
        if not probe.reading and probe.syncs(func, args, kwargs):
            probe.add(str(func.overloadpacket.__name__))
        out = func(*args, **kwargs)
        probe.propagate(func, args, kwargs, out)
        if not probe.reading and probe.launches_kernel(func, args, kwargs, out):
            probe.launches += 1
        return out


def syncs_per_step(dec: Any, prompt: list[int], max_new_tokens: int, stop_ids: Collection[int]) -> float:
    """Host synchronisations per decode step (target forward counted in tau) of
    `dec.generate(prompt, max_new_tokens, stop_ids)`, counted from the end of its prefill to the end of its
    decode loop (the generation's deferred reads after it are once per generation). Untimed: the
    modes slow every operator. NaN for a decoder whose attention compiles (kv.backend=flex): torch.compile
    does not run under a dispatch mode."""
    if dec.compiles_attention():
        return float("nan")
    syncs = HostSyncs(dec.engine.device)
    counts = Counts(on_prefill_done=syncs.mark, keep_steps=False, on_decode_done=syncs.stop)
    with syncs:
        dec.generate(prompt, max_new_tokens, set(stop_ids), counts)
    return syncs.since_mark / counts.forwards if counts.forwards else float("nan")
