"""Hub access for tasks: fail fast, with one clear error line naming the offline alternative."""

from __future__ import annotations

import functools
import os
import socket
from typing import Any
from urllib.parse import urlparse

from core.types import HarnessError


@functools.lru_cache(maxsize=1)
def hub_reachable(timeout_s: float = 3.0) -> bool:
    """False when offline mode is set or the hub host does not answer a TCP connect within `timeout_s`.

    Checked once per process, so `source=auto` falls back to the offline data at once instead of
    waiting through the `datasets` client's retry back-off (about 25 s without a network).
    """
    if any(
        os.environ.get(v, "").lower() in ("1", "true", "yes")
        for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    ):
        return False
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        with socket.create_connection((url.hostname or "huggingface.co", url.port or 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def load_hub(
    task: str, repo: str, split: str, offline_hint: str, config: str | None = None, streaming: bool = False
) -> Any:
    """`datasets.load_dataset(repo, config, split=split)`, or a one-line `HarnessError`.

    `offline_hint` names what to do instead, e.g. "use task.source=package (offline stand-in)".
    Any failure (no network, offline mode, missing config) gets the same single line.
    """
    what = f"{repo}" + (f"/{config}" if config else "") + f":{split}"
    if not hub_reachable():
        raise HarnessError(
            f"task {task}: hub dataset {what} unavailable (hub unreachable or offline mode); {offline_hint}"
        )
    try:
        import datasets

        return datasets.load_dataset(repo, config, split=split, streaming=streaming)
    except Exception as exc:  # noqa: BLE001 - every hub failure maps to one user-facing line
        reason = f"{exc.__class__.__name__}: " + (str(exc).splitlines() or [""])[0][:120]
        raise HarnessError(f"task {task}: hub dataset {what} unavailable ({reason}); {offline_hint}") from exc
