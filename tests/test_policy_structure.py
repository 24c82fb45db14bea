"""A KV policy is its rule (#96): `KVPolicy` keeps the contract (what is kept, the budget, the hooks); the
slot map (`kv_policies.layout`), every layer's selection for the fixed-shape forward
(`kv_policies.stacking`) and the views decoders ask for (`core.policy_views`) are written once, outside it."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from core.compressed_region import CompressedRegion
from core.engine import Engine
from kv_policies.base import KVPolicy
from kv_policies.layout import SlotMap
from kv_policies.registry import build_policy

REPO = Path(__file__).resolve().parents[1]
# the jobs that moved out of `KVPolicy`: slot mapping, stacking for captured graphs, building views
MOVED = {
    "logical_of_slots", "physical", "in_order", "gather_keys", "physical_stack",
    "stacked_keep", "forget_stack",
    "restricted_view", "gathers", "gathered_view", "draft_view", "region_for", "decode_view", "forward_view",
}  # fmt: skip


def test_kv_policy_is_its_rule():
    """None of the moved jobs is a method of the base or of any policy, and the base stays small."""
    from kv_policies.registry import REGISTRY

    classes = [KVPolicy] + [type(build_policy(name)) for name in REGISTRY if name != "kvpress"]
    for cls in classes:
        assert not MOVED & set(dir(cls)), cls.__name__
    assert len((REPO / "kv_policies" / "base.py").read_text().splitlines()) <= 200
    for path in sorted((REPO / "kv_policies").glob("*.py")):
        assert len(path.read_text().splitlines()) <= 250, path.name
    # one implementation per rule: no second copy of a rule for the fast path (#96)
    assert not [
        p.name for p in (REPO / "kv_policies").glob("*_view.py")
    ]  # view code: view.py, *_selection.py
    assert not [p.name for p in (REPO / "kv_policies").glob("*_steady.py")]


def test_policies_ask_the_engine_for_fixed_shapes():
    """A policy asks its engine whether its forwards are fixed-shape or captured and for a replayable
    update (`Engine.fixed_shape`, `captured`, `replayable`, `rows_run`): nothing under kv_policies/
    imports the graph machinery (`core.decode_graph`, `core.replay`) nor probes `engine.graphs`."""
    for path in sorted((REPO / "kv_policies").glob("*.py")):
        text = path.read_text()
        assert not re.search(r"^\s*(from|import)\s+core\.(decode_graph|replay)\b", text, re.M), path.name
        assert not re.search(r"from\s+core\s+import\s+[^\n]*\b(decode_graph|replay)\b", text), path.name
    for name in ("h2o.py", "h2o_rule.py"):
        assert '"graphs"' not in (REPO / "kv_policies" / name).read_text(), name


def test_no_view_is_dispatched_on_by_its_attributes():
    """Views are told apart by their `kind`, never by probing them with getattr."""
    for top in ("core", "decoders", "kv_policies"):
        for path in (REPO / top).rglob("*.py"):
            assert not re.search(r"getattr\(\s*view\b", path.read_text()), path


def test_a_region_lays_out_the_policys_slot_map_for_one_generation(tiny_lm):
    """A compressed region registers with the policy's slot map (not an attribute of the policy), the
    map then finds positions through it, and the next generation starts from a new map without it."""
    eng = Engine(tiny_lm.model)
    eng.reset(64)
    eng.prefill(list(range(3, 43)))
    pol = build_policy("streaming", budget=8, sinks=2)
    pol.attach(eng)
    first = pol.slots
    assert isinstance(first, SlotMap) and first.engine is eng and first.in_order()
    region = CompressedRegion(pol, eng, backend="sliced")
    assert pol.slots is first and first.region is region and "region" not in vars(pol)
    assert not first.in_order()
    pos = torch.arange(eng.length)
    assert torch.equal(first.physical(0, pos, 1)[0], region.slots_of(0, pos[None])[0])
    pol.reset(eng.length, 64)
    assert pol.slots is not first and pol.slots.region is None and pol.slots.engine is eng
