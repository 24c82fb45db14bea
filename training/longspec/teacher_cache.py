"""The frozen target's view of a training sequence, kept on disk so that later epochs (and later runs
over the same data, e.g. `init=<draft>` continuations) skip the target forward.

One entry per (target, layer, top-k, tokens, positions), content-addressed: the K/V of the layer the
draft reads (float16, or float32 where a value would overflow float16) and the target's `topk` most
likely next tokens with their log-probabilities at every position. `labels: target` reads the first of
them; `labels: soft` the top-k distribution renormalised (the full distribution of a 49k vocabulary
would be ~100 KB per token). Entries are written whole (temporary file, then renamed): an interrupted
run leaves no half entry.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class TargetView:
    k: torch.Tensor  # [H_kv, S, d] post-RoPE keys of the layer
    v: torch.Tensor  # [H_kv, S, d]
    top_ids: torch.Tensor  # [S, topk] the target's most likely next tokens, most likely first
    top_logprobs: torch.Tensor  # [S, topk] their log-probabilities under the full distribution

    def soft_labels(self) -> torch.Tensor:
        """The top-k teacher distribution, renormalised over its k tokens: [S, topk]."""
        return self.top_logprobs.float().softmax(-1)


def view_from_logits(k: torch.Tensor, v: torch.Tensor, logits: torch.Tensor, topk: int) -> TargetView:
    top = logits.float().log_softmax(-1).topk(topk, dim=-1)
    return TargetView(k, v, top.indices, top.values)


class TeacherCache:
    """A folder of `TargetView`s keyed by the target's identity and the sequence."""

    def __init__(self, folder: Path, target_identity: dict, topk: int) -> None:
        self.folder = folder
        self.topk = topk
        self.identity = json.dumps({**target_identity, "topk": topk}, sort_keys=True)
        self.hits = 0
        self.misses = 0

    def _path(self, tokens: torch.Tensor, positions: torch.Tensor) -> Path:
        h = hashlib.sha256(self.identity.encode())
        h.update(tokens.to(torch.int64).cpu().numpy().tobytes())
        h.update(positions.to(torch.int64).cpu().numpy().tobytes())
        digest = h.hexdigest()
        return self.folder / digest[:2] / f"{digest}.pt"

    def get(self, tokens: torch.Tensor, positions: torch.Tensor, device: torch.device) -> TargetView | None:
        path = self._path(tokens, positions)
        if not path.is_file():
            self.misses += 1
            return None
        self.hits += 1
        return _as_view(torch.load(path, map_location=device, weights_only=True), device)

    def put(self, tokens: torch.Tensor, positions: torch.Tensor, view: TargetView) -> TargetView:
        """Store `view`; returns it as stored (rounded to the kept dtypes), what a later `get` gives, so
        the first epoch trains on exactly what later ones read back."""
        path = self._path(tokens, positions)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        stored = {
            "k": _compact(view.k),
            "v": _compact(view.v),
            "top_ids": view.top_ids.to(torch.int32).cpu(),
            "top_logprobs": view.top_logprobs.to(torch.float16).cpu(),
        }
        torch.save(stored, tmp)
        tmp.replace(path)
        return _as_view(stored, view.k.device)


def _compact(x: torch.Tensor) -> torch.Tensor:
    """float16 when every value fits it, else float32 (a stored entry never holds an inf it did not have)."""
    half = x.to(torch.float16)
    return (half if torch.isfinite(half).all() or not torch.isfinite(x).all() else x.float()).cpu()


def _as_view(stored: dict, device: torch.device) -> TargetView:
    return TargetView(
        stored["k"].to(device, torch.float32),
        stored["v"].to(device, torch.float32),
        stored["top_ids"].to(device, torch.long),
        stored["top_logprobs"].to(device, torch.float32),
    )
