"""Hub access for tasks: one call, one clear error line naming the offline alternative."""

from __future__ import annotations

from typing import Any

from core.types import HarnessError


def load_hub(
    task: str, repo: str, split: str, offline_hint: str, config: str | None = None, streaming: bool = False
) -> Any:
    """`datasets.load_dataset(repo, config, split=split)`, or a one-line `HarnessError`.

    `offline_hint` names what to do instead, e.g. "use task.source=package (offline stand-in)".
    Any failure (no network, HF_HUB_OFFLINE=1, missing config) gets the same single line.
    """
    try:
        import datasets

        return datasets.load_dataset(repo, config, split=split, streaming=streaming)
    except Exception as exc:  # noqa: BLE001 - every hub failure maps to one user-facing line
        what = f"{repo}" + (f"/{config}" if config else "") + f":{split}"
        reason = str(exc).splitlines()[0][:120] if str(exc) else exc.__class__.__name__
        raise HarnessError(
            f"task {task}: hub dataset {what} unavailable ({exc.__class__.__name__}: {reason}); "
            f"{offline_hint}"
        ) from exc
