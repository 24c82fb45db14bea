"""The checks of a KV policy's config keys, each a one-line `HarnessError` naming the key (a policy's
constructor calls them; `docs/adding-a-policy.md`)."""

from __future__ import annotations

from core.types import HarnessError

BACKENDS = ("dense", "flex", "sliced", "flash")


def check_budget(name: str, budget: int, fixed: int, fixed_what: str) -> int:
    """Validate a token budget against the part of it that is always kept (sinks, recent, window)."""
    if not isinstance(budget, int) or isinstance(budget, bool) or budget <= 0:
        raise HarnessError(f"kv={name}: budget must be a positive integer, got {budget!r}")
    if budget <= fixed:
        raise HarnessError(
            f"kv={name}: budget ({budget}) must exceed {fixed_what} ({fixed}) so that something is left "
            "to select"
        )
    return budget


def check_budget_frac(name: str, budget_frac: float | None) -> float | None:
    """Validate `kv.budget_frac` (null, or a fraction of the context in (0, 1])."""
    if budget_frac is None:
        return None
    if isinstance(budget_frac, bool) or not isinstance(budget_frac, (int, float)) or not 0 < budget_frac <= 1:
        raise HarnessError(f"kv={name}: budget_frac must be in (0, 1] (or null), got {budget_frac!r}")
    return float(budget_frac)


def check_dense_layers(name: str, dense_layers: int) -> int:
    """Validate `kv.dense_layers` (the first layers that see the whole cache; TriForce Table 1 and Quest
    keep 2)."""
    if isinstance(dense_layers, bool) or not isinstance(dense_layers, int) or dense_layers < 0:
        raise HarnessError(f"kv={name}: dense_layers must be a non-negative integer, got {dense_layers!r}")
    return dense_layers


def check_backend(name: str, backend: str) -> str:
    if backend not in BACKENDS:
        raise HarnessError(f"kv={name}: backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    return backend
