"""Each registered method's `Config` (core.options) as a Hydra structured-config schema, so that a
preset in conf/decoder/ or conf/kv/ holds only what differs from the dataclass's defaults:

    # conf/decoder/pld_auto.yaml
    defaults:
      - pld_schema        # every option of PromptLookup.Config at its default, typed
      - _self_
    block: auto

The schema `<method>_schema` of group `decoder` or `kv` is the method's `Config` plus `_target_` (its
registry entry's class: where the class lives is written once, in the registry) and, for a decoder,
`_partial_: true` (the runner adds the engine, the policy and the sampler). Composing against it, an
option the `Config` declares is overridable on the command line whether or not a preset names it
(`decoder.num_tokens=5`), and a value of the wrong type stops the composition
(`runners.overrides.compose_checked` says it in one line). A key the `Config` does not declare is
refused by the pre-flight check (`core.options.validated`, one line), not by Hydra: the schema is not in
struct mode, because an experiment may set an option before its sweep picks the method that has it
(conf/experiment/triforce_table1_cpu.yaml sets `kv.budget_frac` over the default kv=full, whose `Config`
has no options; each job of its sweep then picks a policy that has it).

`register_schemas()` must run before anything composes (run.py, the paper runner, the benchmarks, the
tests' compose helpers): Hydra's ConfigStore is per process. It reads the registries, so a new method's
schema comes with its registry line."""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from core.checks import registered_class
from decoders import registry as decoders
from kv_policies import registry as policies

# group -> (registry, whether the runner completes the instance: Hydra's `_partial_`)
GROUPS = {"decoder": (decoders.DECODERS, True), "kv": (policies.REGISTRY, False)}
SUFFIX = "_schema"  # conf/<group>/<method>.yaml extends `<method>_schema`


def schema(config: type, target: str, partial: bool) -> DictConfig:
    """`config`'s fields at their defaults, typed, with Hydra's `_target_` (and `_partial_`) added; not
    in struct mode (see the module's docstring)."""
    node = OmegaConf.structured(config)
    OmegaConf.set_struct(node, False)
    node["_target_"] = target
    if partial:
        node["_partial_"] = True
    return node


def register_schemas() -> None:
    """Store every registered decoder's and KV policy's schema in Hydra's ConfigStore. Idempotent: a
    second call stores the same nodes again (a few milliseconds), so that a registry entry added since
    is stored too."""
    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    for group, (registry, partial) in GROUPS.items():
        for name, where in registry.items():
            node = schema(registered_class(group, registry, name).Config, where.replace(":", "."), partial)
            store.store(group=group, name=f"{name}{SUFFIX}", node=node)
