"""Every decoder by its method name (the class's `name`): the one list the runner's tools, the docs
and the parametrized test suite read. A new decoder adds its line here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from core.checks import registered_class

if TYPE_CHECKING:
    from core.engine import Engine
    from core.types import Decoder

# method name -> "module:Class"
DECODERS = {
    "vanilla": "decoders.vanilla:Vanilla",
    "pld": "decoders.pld:PromptLookup",
    "lookahead": "decoders.lookahead:Lookahead",
    "fafo": "decoders.fafo.decoder:FAFO",
    "fafo_2forward": "decoders.fafo.decoder:FAFO2Forward",
    "swift": "decoders.swift:Swift",
    "selfspec": "decoders.selfspec:SelfSpeculative",
    "triforce": "decoders.triforce:TriForce",
    "longspec": "decoders.longspec.decoder:LongSpec",
    "sfi": "decoders.sfi:SlowFast",
}

# The name each method's runs were recorded under before #96: the `_target_` of its YAML, which was part
# of the run identity then. It stays in the identity of these methods (`runners.identity`) so that every
# committed run keeps its id; a class may move freely, but these strings never change. A method added
# since is identified by its method name instead (no entry here).
RECORDED_AS = {
    "vanilla": "decoders.vanilla.Vanilla",
    "pld": "decoders.pld.PromptLookup",
    "lookahead": "decoders.lookahead.Lookahead",
    "fafo": "decoders.fafo.FAFO",
    "fafo_2forward": "decoders.fafo.FAFO2Forward",
    "swift": "decoders.swift.Swift",
    "selfspec": "decoders.selfspec.SelfSpeculative",
    "triforce": "decoders.triforce.TriForce",
    "longspec": "decoders.longspec.LongSpec",
    "sfi": "decoders.sfi.SlowFast",
}


def decoder_class(name: str) -> type:
    """The class registered under `name` (one `HarnessError` line for an unknown name)."""
    return registered_class("decoder", DECODERS, name)


def build_decoder(name: str, engine: Engine, **params: Any) -> Decoder:
    """Instantiate a decoder by method name (the Hydra configs in conf/decoder/ do the same)."""
    return decoder_class(name)(engine, **params)
