"""The one-row decode forward with fixed shapes, replayed as a CUDA graph (`run.cuda_graphs=true`).

On a GPU a small model's forward is bound by kernel launches, not by the GPU: SmolLM2-135M's ~1300
operators take ~11 ms per forward on an H200, against ~0.06 ms to read its weights
(results/gpu/2026-11-26-nvidia-h200/). A CUDA graph replays the whole forward as one launch, which
needs every shape and address fixed when it is captured. So this forward reads its token, position
and cache length from device buffers, writes the new entry at slot `length` through a device index (not
a Python slice), and attends over the whole allocated cache with the slots past `length` masked out.
The graph is captured once per cache allocation (`KVCache.reset` reallocates only to grow) and
replayed for every step.

`Engine(cuda_graphs=True)` sends one-row steps under a plain `CausalView` with no hooks here (vanilla's
steps, and a speculative decoder's one-row steps over the full cache); blocks, KV-policy views and the
prefill take the regular forward. `StaticDecode(engine, capture=False)` runs the same forward eagerly:
the CPU tests check it against `Engine.step`, and `make test-gpu` checks the captured graph.
"""

from __future__ import annotations

import torch

from core.attention import sdpa


class StaticDecode:
    """One-row decode steps of `engine` through fixed-shape buffers (captured as a CUDA graph when
    `capture`). Called like `Engine.step(tokens, position_ids, view)` for one row; stages the row."""

    def __init__(self, engine, capture: bool) -> None:
        self.engine, self.capture = engine, capture
        dev = engine.device
        self.token = torch.zeros(1, dtype=torch.long, device=dev)
        self.position = torch.zeros(1, dtype=torch.long, device=dev)
        self.length = torch.zeros(1, dtype=torch.long, device=dev)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.graph_key: tuple[int, int] | None = None  # (cache storage address, capacity) it was captured on
        self.logits: torch.Tensor | None = None  # the graph's output buffer
        self.captures = 0

    def __call__(self, tokens: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        cache = self.engine.cache
        position_ids = position_ids.to(self.engine.device)
        cache.stage_positions(position_ids)  # the capacity check and the slot's position, as step does
        self.token.copy_(tokens.reshape(1))
        self.position.copy_(position_ids.reshape(1))
        self.length.fill_(cache.length)
        if not self.capture:
            return self.forward()
        key = (cache.k.data_ptr(), cache.capacity)
        if self.graph is None or key != self.graph_key:
            self._capture()
            self.graph_key = key
        self.graph.replay()
        return self.logits.clone()

    def forward(self) -> torch.Tensor:
        """Float logits `[1, vocab]` of the row in the buffers; its K/V land in slot `length`."""
        eng, cache = self.engine, self.engine.cache
        slots = torch.arange(cache.capacity, device=eng.device)
        visible = (slots <= self.length).view(1, 1, 1, -1)  # committed entries and the new one

        def attend(
            li: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, x: torch.Tensor
        ) -> torch.Tensor:
            cache.k[li].index_copy_(1, self.length, k)
            cache.v[li].index_copy_(1, self.length, v)
            return sdpa(
                q.unsqueeze(0), cache.k[li].unsqueeze(0), cache.v[li].unsqueeze(0), visible, eng.scale
            )

        h = eng.layers_forward(self.token, self.position, attend)
        return eng.lm_logits(eng.w.final_norm(h))

    def _capture(self) -> None:
        """Warm up on a side stream (allocator, kernel selection), then record one forward. Both write
        the staged slot only, which the replay that follows writes again."""
        side = torch.cuda.Stream(self.engine.device)
        side.wait_stream(torch.cuda.current_stream(self.engine.device))
        with torch.cuda.stream(side):
            for _ in range(2):
                self.forward()
        torch.cuda.current_stream(self.engine.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self.forward()
        self.captures += 1
