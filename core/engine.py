"""The one primitive every decoder shares: `step` (one forward over a block) and `commit`.

`step(tokens, position_ids, view, logits_rows)` runs the target model over a block of new tokens,
each with its own position id, with the visibility the `view` gives it over [cache | block], and
stages the block's KV in the cache. `commit(keep)` keeps the KV of the accepted block rows (in
order) and forgets the rest. Decoders never touch model internals or the cache layout otherwise.

The forward is written out here (gpt-fast style) over the HF modules' weights: fused QKV and
gate/up projections, our own static KV cache, no per-step mask or cache-object allocation.
`core/hf_compat.py` is the only place that knows the HF module names (Llama and Qwen2 layouts).

`linear="onednn"` (opt-in, fp32 on CPU): the projection and LM-head weights are prepacked once for
oneDNN (`torch.ops.mkldnn._linear_pointwise`, the kernel inductor uses for frozen CPU linears). On
CPUs where aten's MKL sgemm takes a slow path (AMD EPYC; `python -m benchmarks.bench_block_cost
--linear aten` against `--linear onednn` shows it on yours) every forward gets faster, multi-row
blocks most. Results differ from aten's in the last bits (max |diff| ~1e-4 on logits ~1e2), so
compare decoders on the same engine setting.
"""

from __future__ import annotations

import dataclasses
import platform
import struct
from collections.abc import Callable, Sequence
from typing import Any

import torch

from core.attention import CausalView, ViewKind
from core.decode_graph import StaticForwards, fits, has_room, padded_rows
from core.hf_compat import DecoderWeights, extract_weights, rope_cos_sin
from core.kv_cache import KVCache
from core.positions import RelativePositions, absolute
from core.replay import Replay
from core.types import LayerSkip


def onednn_applies(model: torch.nn.Module) -> bool:
    """Prepacked oneDNN linears: fp32 weights on an x86 CPU with mkldnn and a bias-free LM head."""
    p = next(model.parameters())
    head = model.get_output_embeddings()
    return (
        p.device.type == "cpu"
        and p.dtype == torch.float32
        and platform.machine().lower() in ("x86_64", "amd64")
        and torch.backends.mkldnn.is_available()
        and getattr(head, "bias", None) is None
    )


class Engine:
    """Owns the model weights and the KV cache for batch size 1."""

    def __init__(
        self,
        model: torch.nn.Module,
        prefill_chunk: int = 1024,
        linear: str = "aten",
        cuda_graphs: bool = False,
        compiled: bool = False,
    ) -> None:
        self.model = model
        self.w: DecoderWeights = extract_weights(model)
        cfg = self.w
        self.device = cfg.device
        self.dtype = cfg.dtype
        self.scale = cfg.head_dim**-0.5
        self.cache = KVCache(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, cfg.dtype, cfg.device)
        self.prefill_chunk = prefill_chunk
        self.max_positions = cfg.max_positions
        self._arange = torch.arange(0, device=cfg.device)  # `positions` slices it; grown on demand
        self.linear = linear
        self._packed: dict[int, torch.Tensor] = {}
        if linear == "onednn":
            self._pack_onednn()
        elif linear != "aten":
            raise ValueError(f"linear must be 'aten' or 'onednn', got {linear!r}")
        self.graphs = None  # plain decode steps replayed as CUDA graphs (core/decode_graph.py)
        # decode steps (every step but the prefill's) that took the fixed-shape forward, or would have
        # with graphs on: what `run.cuda_graphs` covers (the runner's `static_frac`)
        self.fixed_shape_steps = 0
        if cuda_graphs and self.device.type != "cuda":
            raise ValueError(f"cuda_graphs=True needs the model on a CUDA device, not {self.device}")
        if cuda_graphs or compiled:
            self.use_graphs(capture=cuda_graphs, compiled=compiled)

    def use_graphs(self, capture: bool, compiled: bool = False) -> None:
        """Send this engine's fixed-shape steps through `core.decode_graph.StaticForwards`: captured CUDA
        graphs (`capture`), or the same forwards run eagerly (the CPU tests' twin of the graphs);
        `compiled`: each compiled by inductor first (`run.compile`)."""
        self.graphs = StaticForwards(self, capture=capture, compiled=compiled)

    @property
    def fixed_shape(self) -> bool:
        """Whether this engine's decode steps take the fixed-shape forwards (`use_graphs`), captured or
        not: a policy may then keep its own per-step work at fixed shapes too (`replayable`)."""
        return self.graphs is not None

    @property
    def captured(self) -> bool:
        """Whether the fixed-shape forwards are captured as CUDA graphs (`use_graphs(capture=True)`)."""
        return self.graphs is not None and self.graphs.capture

    def replayable(self, run: Callable[[], Any], state: Sequence[torch.Tensor] = ()) -> Replay:
        """`run` (a function of device buffers at fixed shapes) as a `core.replay.Replay`: captured as a
        CUDA graph once per key and replayed where this engine's forwards are (`captured`), else run
        eagerly; `state`: the tensors it updates from their own values (restored after warm-ups)."""
        return Replay(run, self.captured, self.device, state)

    def rows_run(self, n: int) -> int:
        """The rows a block of `n` rows runs in, so costs: `n`, or on fixed-shape forwards its padded
        size (`core.decode_graph.padded_rows`). A decoder may fill the difference for free."""
        return padded_rows(n) if self.fixed_shape else n

    def _pack_onednn(self) -> None:
        if not onednn_applies(self.model):
            raise ValueError("linear='onednn' needs an fp32 model on an x86 CPU with a bias-free LM head")
        head = self.w.lm_head.weight
        names = ("wqkv", "wo", "wgu", "wdown")
        weights = [head] + [getattr(layer, n) for layer in self.w.layers for n in names]
        with torch.inference_mode():
            for wt in weights:
                self._packed[id(wt)] = torch.ops.mkldnn._reorder_linear_weight(wt.detach(), 32)

    def _lin(self, x: torch.Tensor, wt: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
        packed = self._packed.get(id(wt))
        if packed is None:
            return torch.nn.functional.linear(x, wt, b)
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, b, "none", [], "")

    # ------------------------------------------------------------------------------------------
    def reset(self, capacity: int) -> None:
        self.cache.reset(capacity)

    def reserve(self, capacity: int) -> None:
        """Allocate the cache for `capacity` entries now (a run reserves its largest context once, so
        no timed generation pays for a reallocation)."""
        self.cache.reset(capacity)

    @torch.inference_mode()
    def prefill(self, token_ids: Sequence[int], hooks: Sequence = ()) -> torch.Tensor:
        """Fill the empty cache with `token_ids` (chunked); return the last row's logits [vocab].
        `hooks`: fn(layer, q, k_all, cache_len) called in every layer of every chunk (a KV policy's
        `prefill_hooks()` for this generation: SnapKV's observation window, H2O's prefill scores)."""
        ids = self.stage(list(token_ids))
        view = CausalView(self.scale)
        logits = None
        for lo in range(0, ids.numel(), self.prefill_chunk):
            chunk = ids[lo : lo + self.prefill_chunk]
            pos = torch.arange(lo, lo + chunk.numel(), device=self.device)
            logits = self.step(chunk, pos, view, logits_rows=[chunk.numel() - 1], hooks=hooks, replay=False)
            self.cache.commit(range(chunk.numel()))
        assert logits is not None
        return logits[0]

    @torch.inference_mode()
    def step(
        self,
        tokens: torch.Tensor,
        position_ids: torch.Tensor | RelativePositions,
        view,
        logits_rows: Sequence[int] | torch.Tensor | None = None,
        hooks: Sequence = (),
        replay: bool = True,
        argmax: bool = False,
        with_logits: bool = True,
        skip: LayerSkip | None = None,
    ) -> Any:
        """One forward over a block. Returns float logits for `logits_rows` (all rows if None), and with
        `argmax=True` the pair (logits, long argmax of each of those rows): the greedy choice is made on
        the device as part of the step (inside the graph when it is replayed), as gpt-fast and vLLM
        pick inside the model step, so a greedy decoder does no work over the vocabulary itself.
        `with_logits=False` (with `argmax`): the pair is (None, argmax) and the `[rows, vocab]` logits end
        with the step, so a caller that reads only the argmax holds none between steps (a replayed graph
        then copies none out; an eager step frees them as part of the forward, not at the caller's next
        assignment).
        With `cuda_graphs`, a plain step without hooks is replayed from a captured graph unless
        `replay=False` (the prefill: its chunks have every size). `position_ids` may be a
        `RelativePositions` (a layout's offsets after the cache), which such a graph adds to the cache
        length itself. `skip`: sublayers left out (a layer-skipping self-draft, SWIFT); a skipped attention
        neither reads nor writes the cache, so those rows are stale until a full forward rewrites them."""
        if replay and not hooks and skip is None and fits(self.cache, tokens.numel(), view):
            self.fixed_shape_steps += 1
            if self.graphs is not None:
                return self.graphs(tokens, position_ids, view, logits_rows, argmax, with_logits)
        elif replay and not hooks and view.kind is ViewKind.REGION_GATHERABLE:
            # a compressed region's step that, with graphs on, reads its selection by gather instead
            # (`core.policy_views.gathered_view`): counted as the fixed-shape step it would be
            self.fixed_shape_steps += has_room(self.cache, tokens.numel())
        cache = self.cache
        # `.to` is a no-op for tensors already on the device
        tokens, position_ids = tokens.to(self.device), absolute(position_ids).to(self.device)
        cache.stage_positions(position_ids)
        cache_len = cache.length

        def attend(
            li: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x: torch.Tensor
        ) -> torch.Tensor:
            k_all, v_all = cache.write(li, k, v)
            for hook in hooks:  # a hook with `wants_input` also gets the layer's attention input x
                if getattr(hook, "wants_input", False):
                    hook(li, q, k_all, cache_len, x)
                else:
                    hook(li, q, k_all, cache_len)
            return view.attend(li, q.unsqueeze(0), k_all.unsqueeze(0), v_all.unsqueeze(0))

        h = self.layers_forward(tokens, position_ids, attend, skip)
        if logits_rows is not None:
            h = h.index_select(0, self.stage(logits_rows))
        logits = self.lm_logits(self.w.final_norm(h))
        if not argmax:
            return logits
        ids = logits.argmax(dim=-1)
        return (logits if with_logits else None, ids)

    def layers_forward(
        self,
        tokens: torch.Tensor,
        position_ids: torch.Tensor,
        attend: Callable,
        skip: LayerSkip | None = None,
    ) -> torch.Tensor:
        """The decoder layers over a block (embedding in, last hidden states out, before the final
        norm). `attend(layer, q [H, n, d], k [H_kv, n, d], v [H_kv, n, d], x)` stores the block's K/V
        and returns the attention output `[1, H, n, d]`: the one place a forward's cache layout and
        visibility enter (`step`'s cache slices and view, `StaticForward`'s fixed-shape slots)."""
        w = self.w
        n = tokens.numel()
        cos, sin = rope_cos_sin(self.model, position_ids, self.dtype)
        cos, sin_signed = cos.unsqueeze(1), _signed_sin(sin).unsqueeze(1)  # [n, 1, d]: every head
        h = w.embed(tokens)  # [n, hidden]
        H, Hkv, d = w.n_heads, w.n_kv_heads, w.head_dim
        q_size, kv_size = H * d, Hkv * d
        no_attn, no_mlp = (skip.attn, skip.mlp) if skip is not None else ((), ())
        for li, layer in enumerate(w.layers):
            if li not in no_attn:
                x = layer.norm1(h)
                qkv = self._lin(x, layer.wqkv, layer.bqkv)
                qk = qkv[:, : q_size + kv_size].view(n, H + Hkv, d)  # q and k heads rotated together
                qk = qk * cos + _swap_halves(qk) * sin_signed
                q = qk[:, :H].transpose(0, 1)
                k = qk[:, H:].transpose(0, 1)
                v = qkv[:, q_size + kv_size :].view(n, Hkv, d).transpose(0, 1)
                o = attend(li, q, k, v, x)
                h = h + self._lin(o[0].transpose(0, 1).reshape(n, q_size), layer.wo)
            if li not in no_mlp:
                x = layer.norm2(h)
                gu = self._lin(x, layer.wgu)
                g, u = gu.chunk(2, dim=-1)
                h = h + self._lin(w.act(g) * u, layer.wdown)
        return h

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Float logits of normed hidden states `h` through the LM head (prepacked when the engine
        packs its GEMMs; a draft that shares the head calls this too)."""
        if self._packed:
            return self._lin(h, self.w.lm_head.weight).float()
        return self.w.lm_head(h).float()

    def linear_for(self, weight: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
        """`x -> x @ weight.T` run like the model's own GEMMs: prepacked for oneDNN (the packed copy
        owned by the returned function) when this engine packs them, `F.linear` otherwise. For weights
        derived from the model's, e.g. a draft's rows of the LM head."""
        if not self._packed:
            return lambda x: torch.nn.functional.linear(x, weight)
        with torch.inference_mode():
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), 32)
        return lambda x: torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, None, "none", [], "")

    def commit(self, keep: Sequence[int] | torch.Tensor) -> None:
        self.cache.commit(keep)

    def truncated(self, n_layers: int) -> Engine:
        """An engine over this model's first `n_layers` layers, its final norm and its LM head (a
        layer-truncated self-draft), sharing the weights and any prepacked GEMM weights, with a KV
        cache of its own."""
        if not 0 < n_layers <= self.w.n_layers:
            raise ValueError(f"n_layers must be in [1, {self.w.n_layers}], got {n_layers}")
        sub = object.__new__(Engine)
        sub.__dict__.update(self.__dict__)
        sub.__dict__.pop("step", None)  # an instance-level wrapper (a clock) times the parent's forwards only
        sub.w = dataclasses.replace(self.w, layers=self.w.layers[:n_layers], n_layers=n_layers)
        w = sub.w
        sub.cache = KVCache(w.n_layers, w.n_kv_heads, w.head_dim, w.dtype, w.device)
        sub.graphs, sub.fixed_shape_steps = None, 0  # the parent's graphs hold the parent's layers and cache
        if self.graphs is not None:  # a self-draft's steps are graphed like the target's
            sub.use_graphs(self.graphs.capture, self.graphs.compiled)
        return sub

    @torch.inference_mode()
    def evict(self, lo: int, hi: int) -> None:
        """Forget cached entries `[lo, hi)` and shift the later ones down to slot == position: their keys
        are re-rotated by -(hi - lo) positions (StreamingLLM's in-cache positions, so a model with a
        short context window can run over any length). Values do not carry positions."""
        cache = self.cache
        in_order = cache.in_order
        cache.drop(lo, hi)
        cache.in_order = in_order  # renumbered below: slot == position again
        moved, shift = cache.length - lo, hi - lo
        if not moved or not shift:
            return
        cos, sin = rope_cos_sin(self.model, self.stage([shift]), torch.float32)
        norm = (cos * cos + sin * sin).sqrt()  # a RoPE type's attention scaling (YaRN) is not a rotation
        cos, sin = (cos / norm).to(self.dtype), (sin / norm).to(self.dtype)
        k = cache.k[:, :, lo : cache.length]
        k.copy_(k * cos - _rotate_half(k) * sin)  # rotation by -shift
        cache.slot_pos[lo : cache.length] = torch.arange(lo, cache.length, device=self.device)

    def crop(self, length: int) -> None:
        self.cache.crop(length)

    def positions(self, start: int, n: int) -> torch.Tensor:
        """Positions `start .. start + n - 1` on the device: a slice of one `arange` the engine keeps, so a
        step's positions cost neither a copy nor a launch. Read-only: callers offset it out of place."""
        end = start + n
        if self._arange.numel() < end:
            self._arange = torch.arange(max(end, 2 * self._arange.numel(), 1024), device=self.device)
        return self._arange[start:end]

    def chain_start(self, positions: torch.Tensor) -> int | None:
        """Where `positions` starts when it is a slice of `positions()` (a chain), else None."""
        if positions._base is not self._arange or positions.dim() != 1 or positions.stride(0) != 1:
            return None
        return positions.storage_offset()

    def chain(self, tokens: Sequence[int], start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """A chain block's token ids (one host-to-device copy, `stage`) and their positions `start,
        start + 1, ...` (`positions`)."""
        return self.stage(tokens), self.positions(start, len(tokens))

    def stage(self, values: Sequence[int] | torch.Tensor, dtype: torch.dtype = torch.long) -> torch.Tensor:
        """Host values as a tensor on the device, without the host waiting for it: on CUDA through pinned
        memory and an asynchronous copy (a copy from pageable memory synchronises the stream; PyTorch's
        caching host allocator keeps the pinned block until its copy is done), elsewhere the tensor. A
        tensor already on the device is returned as it is (in `dtype`)."""
        if isinstance(values, torch.Tensor):
            if self.device.type == "cpu":  # itself (or in `dtype`); a move a sync counter sees as the upload
                return values.to(self.device, dtype, non_blocking=True)
            if values.device == self.device:
                return values if values.dtype == dtype else values.to(dtype)
            host = values
        else:
            host = host_tensor(values, dtype)
            if self.device.type == "cpu":
                return host  # already where it goes (a `.to` would be one more operator a step)
        if self.device.type == "cuda":
            host = host.pin_memory()
        return host.to(self.device, non_blocking=True)

    @property
    def length(self) -> int:
        return self.cache.length


_TYPECODES = {torch.long: "q", torch.int32: "i"}  # struct codes of the staged integer dtypes


def host_tensor(values: Sequence[int], dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Python ints as a host tensor. Integers are packed by `struct` into a buffer that
    `torch.frombuffer` wraps (the tensor keeps it alive): `struct.pack` converts a step's block of 481
    ints in half the time `array` takes, and `torch.tensor`, which parses the list element by element,
    takes ten times as long."""
    code = _TYPECODES.get(dtype)
    if code is None or not len(values):
        return torch.tensor(values, dtype=dtype)
    return torch.frombuffer(bytearray(struct.pack(f"{len(values)}{code}", *values)), dtype=dtype)


def _signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin with its first half negated: `_swap_halves(x) * _signed_sin(sin) == _rotate_half(x) * sin`
    bit for bit (a sign flip is exact), in one multiply instead of a negate, a concat and a multiply."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)


def _swap_halves(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [x2, x1] along the last dim."""
    d = x.shape[-1]
    return x.unflatten(-1, (2, d // 2)).flip(-2).flatten(-2)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
