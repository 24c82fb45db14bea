"""Every KV policy by its config name: the one list `build_policy`, the docs and the parametrized
test suite read. A new policy adds its line here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from core.checks import registered_class

if TYPE_CHECKING:
    from kv_policies.base import KVPolicy

# name -> "module:Class"; `build_policy` gives the one-line error for anything else
REGISTRY = {
    "full": "kv_policies.full:FullKV",
    "streaming": "kv_policies.streaming:StreamingLLM",
    "quest": "kv_policies.quest:Quest",
    "snapkv": "kv_policies.snapkv:SnapKV",
    "h2o": "kv_policies.h2o:H2O",
    "retrieval": "kv_policies.retrieval:Retrieval",
    "topk": "kv_policies.topk:TopK",
    "sfi": "kv_policies.sfi:SFI",
    "kvpress": "kv_policies.kvpress_adapter:KVPress",
}

# The name each policy's runs were recorded under before #96 (its YAML's `_target_`, then part of the run
# identity): kept in the identity of these policies (`runners.identity`) so that committed runs keep their
# ids; frozen, whatever module the class lives in. A policy added since is identified by its name.
RECORDED_AS = {
    "full": "kv_policies.full.FullKV",
    "streaming": "kv_policies.streaming.StreamingLLM",
    "quest": "kv_policies.quest.Quest",
    "snapkv": "kv_policies.snapkv.SnapKV",
    "h2o": "kv_policies.h2o.H2O",
    "retrieval": "kv_policies.retrieval.Retrieval",
    "topk": "kv_policies.topk.TopK",
    "sfi": "kv_policies.sfi.SFI",
    "kvpress": "kv_policies.kvpress_adapter.KVPress",
}


def policy_class(name: str) -> type:
    """The class registered under `name` (one `HarnessError` line for an unknown name)."""
    return registered_class("KV policy", REGISTRY, name)


def build_policy(name: str, **params: Any) -> KVPolicy:
    """Instantiate a policy by name (the Hydra configs in conf/kv/ do the same through `_target_`)."""
    return policy_class(name)(**params)
