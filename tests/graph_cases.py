"""The decoder x KV policy cases the capture tests run (tests/test_captured_graphs.py,
tests/test_emulation_checks.py), and one case's generations on the regular path or on captured
fixed-shape forwards (`generate`), with what each reports (`report`) and the cache it leaves
(`same_cache`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from core.engine import Engine
from core.types import Counts
from decoders.registry import DECODERS as REGISTERED
from kv_policies.registry import build_policy
from tests.helpers import DECODERS, POLICIES, tiny_policy
from tests.helpers import tiny as tiny_of

PROMPT_LEN, NEW = 60, 24


def _policy(name: str, **kw: Any) -> Callable:
    return lambda: build_policy(name, **kw)


RETRIEVAL = {"budget": 24, "chunk": 4}
# name -> (decoder maker, policy maker): every registered decoder under its own policy at its tiny
# settings (tests/helpers.py), then the experiments' other decoder x policy pairs; budgets below the
# prompt so that every restricting policy restricts
CASES: dict[str, tuple[Callable, Callable]] = {
    (name if tiny.policy == "full" else f"{name}+{tiny.policy}"): (
        tiny.make,
        _policy(tiny.policy, **tiny_policy(tiny.policy)),
    )
    for name, tiny in ((n, tiny_of(n)) for n in sorted(REGISTERED))
}
CASES.update(
    {
        "fafo": (DECODERS["fafo"].make, _policy("full")),
        "fafo+quest": (DECODERS["fafo"].make, _policy("quest", budget=24, page_size=8, dense_layers=0)),
        "fafo+snapkv": (DECODERS["fafo"].make, _policy("snapkv", budget=24, window=8)),
        "fafo+h2o": (DECODERS["fafo"].make, _policy("h2o", budget=24, recent=8)),
        "selfspec+retrieval": (DECODERS["selfspec"].make, _policy("retrieval", **RETRIEVAL)),
        "selfspec+topk": (DECODERS["selfspec"].make, _policy("topk", budget=24, dense_layers=1)),
        "vanilla+kvpress": (
            DECODERS["vanilla"].make,
            _policy("kvpress", press="StreamingLLMPress", compression_ratio=0.6),
        ),
        # the long-context experiments' compressed-region backend: read by gather on graphed engines
        "selfspec+retrieval/sliced": (
            DECODERS["selfspec"].make,
            _policy("retrieval", backend="sliced", **RETRIEVAL),
        ),
        "triforce+retrieval/sliced": (
            DECODERS["triforce"].make,
            _policy("retrieval", backend="sliced", **RETRIEVAL),
        ),
        "sfi+sfi/sliced": (DECODERS["sfi"].make, _policy("sfi", backend="sliced", **POLICIES["sfi"])),
    }
)


def _prompt(seed: int = 3) -> list[int]:
    return torch.randint(0, 256, (PROMPT_LEN,), generator=torch.Generator().manual_seed(seed)).tolist()


def report(dec: Any, prompts: list[list[int]], new: int, stop: set[int] = frozenset()) -> list[tuple]:
    """What each generation reports: tokens, forwards, acceptance, slow steps, KV reads, policy activity."""
    reports = []
    for prompt in prompts:
        counts = Counts()
        out = dec.generate(prompt, new, stop, counts)
        reads = [s.kv_attended for s in counts.steps]
        summary = dec.kv.activity.summary(counts.forwards)
        c = counts
        reports.append((out, c.forwards, c.draft_forwards, c.accepted, c.slow_steps, reads, summary))
    return reports


def generate(model, case: str, capture: bool | None) -> tuple[list[tuple], Engine, Any]:
    """Two generations of one decoder on the regular path (`capture=None`) or the fixed-shape one, the
    second on the allocation and the forwards of the first: (their reports, the engine, the decoder)."""
    make, policy = CASES[case]
    eng = Engine(model)
    if capture is not None:
        eng.use_graphs(capture=capture)
    dec = make(eng, policy())
    return report(dec, [_prompt(3), _prompt(5)], NEW), eng, dec


def same_cache(a: Engine, b: Engine) -> bool:
    n = a.length
    if b.length != n:
        return False
    k, v = (a.cache.k[:, :, :n], b.cache.k[:, :, :n]), (a.cache.v[:, :, :n], b.cache.v[:, :, :n])
    return all(torch.allclose(x, y, atol=1e-5, rtol=1e-5) for x, y in (k, v))
