"""The decoders of the paper experiments at tiny sizes, each made for an engine and a KV policy (the
tests' tiny random models: 256-token vocabulary, prompts of about 60 tokens)."""

from __future__ import annotations

from typing import Any


def vanilla(eng: Any, kv: Any) -> Any:
    from decoders.vanilla import Vanilla

    return Vanilla(eng, kv)


def pld(eng: Any, kv: Any) -> Any:
    from decoders.pld import PromptLookup

    return PromptLookup(eng, kv, num_tokens=5)


def lookahead(eng: Any, kv: Any) -> Any:
    from decoders.lookahead import Lookahead

    return Lookahead(eng, kv, N=3, W=4, G=2)


def longspec(eng: Any, kv: Any) -> Any:
    from decoders.longspec import LongSpec

    return LongSpec(eng, kv, depth=3, widths=[2, 3, 3], checkpoint="random", window=16)


def fafo(eng: Any, kv: Any) -> Any:
    from decoders.fafo.decoder import FAFO

    return FAFO(eng, kv, k=2, n=4)


def fafo_2forward(eng: Any, kv: Any) -> Any:
    from decoders.fafo import FAFO2Forward

    return FAFO2Forward(eng, kv, k=2, n=4)


def selfspec(eng: Any, kv: Any) -> Any:
    from decoders.selfspec import SelfSpeculative

    return SelfSpeculative(eng, kv=kv, gamma=4)


def triforce(eng: Any, kv: Any) -> Any:
    """TriForce with a one-layer self-draft (the draft model's own cache: 24 entries, 4 sinks)."""
    from decoders.draft_model import DraftModel
    from decoders.triforce import TriForce

    draft = DraftModel(eng.truncated(1), "self-1", eng.w.vocab_size, budget=24, sinks=4, room=12)
    return TriForce(eng, kv=kv, gamma1=2, gamma2=4, draft=draft, rebuild_every=1)


def sfi(eng: Any, kv: Any) -> Any:
    """SFI with every seventh token id a boundary: slow steps now and then."""
    from decoders.sfi import SlowFast

    return SlowFast(eng, kv=kv, t_max=4, trigger_token_ids=set(range(0, 256, 7)))
