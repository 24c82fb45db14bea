"""Helpers shared by the test modules (no test module imports from another)."""

from __future__ import annotations

import torch


def page_minmax(k: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Brute-force per-page channel min and max `[..., pages, d]` of keys `[..., L, d]` (the last page
    may be partial): the reference Quest's incremental page extremes are checked against."""
    *lead, length, d = k.shape
    pages = -(-length // page_size)
    pad = pages * page_size - length
    kp = torch.nn.functional.pad(k.float(), (0, 0, 0, pad), value=float("nan"))
    kp = kp.reshape(*lead, pages, page_size, d)
    return kp.nan_to_num(float("inf")).amin(-2), kp.nan_to_num(float("-inf")).amax(-2)
