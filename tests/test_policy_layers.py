"""`KVPolicy.keeps_every_layer`: the one question a step asks before building a view (does the policy
keep every entry of every layer?) answers as `keeps_all` asked layer by layer, whichever layer is the
one that restricts."""

from __future__ import annotations

import pytest

from core.engine import Engine
from kv_policies.registry import build_policy
from kv_policies.streaming import StreamingLLM
from tests.conftest import prefill_under

PROMPT = list(range(3, 43))


class OneLayerRestricts(StreamingLLM):
    """Restricts layer `layer` only: neither the first nor the last layer tells the answer."""

    def __init__(self, layer: int) -> None:
        super().__init__(budget=8, sinks=2)
        self.layer = layer

    def keeps_all(self, layer: int, cache_len: int) -> bool:
        return layer != self.layer or cache_len <= self.budget


def layer_by_layer(policy, n_layers: int, cache_len: int) -> bool:
    return all(policy.keeps_all(li, cache_len) for li in range(n_layers))


# (policy for a model of n layers, whether its answer follows the cache length: retrieval's follows its
# last build, H2O's its evictions, which the prefill of a prompt over the budget has made)
POLICIES = [
    (lambda n: build_policy("streaming", budget=12, sinks=2), True),
    (lambda n: build_policy("streaming", budget=12, sinks=2, dense_layers=n - 1), True),
    (lambda n: build_policy("quest", budget=16, page_size=4, dense_layers=1), True),
    (lambda n: build_policy("snapkv", budget=12, window=4), True),
    (lambda n: build_policy("retrieval", budget=12, chunk=4, dense_layers=1), False),
    (lambda n: build_policy("h2o", budget=12), False),
    (lambda n: OneLayerRestricts(0), True),
    (lambda n: OneLayerRestricts(n // 2), True),
    (lambda n: OneLayerRestricts(n - 1), True),
]


@pytest.mark.parametrize("make, by_length", POLICIES)
def test_every_layer_is_asked_as_each_layer_would_answer(tiny_lm, make, by_length):
    eng = Engine(tiny_lm.model)
    n_layers = len(eng.w.layers)
    policy = make(n_layers)
    prefill_under(eng, policy, PROMPT, 8)
    answers = set()
    for cache_len in (1, 8, 12, 13, 30, eng.length):
        expected = layer_by_layer(policy, n_layers, cache_len)
        assert policy.keeps_every_layer(n_layers, cache_len) == expected, cache_len
        answers.add(expected)
    assert answers == ({True, False} if by_length else {False})  # restricted, and not (by length)


def test_a_policy_whose_layers_answer_alike_is_asked_once_and_one_with_its_own_rule_layer_by_layer():
    """`keeps_alike`: the one-call answer is taken only where `keeps_all` is one rule past the dense
    layers; a subclass with its own `keeps_all` is asked layer by layer unless it declares otherwise."""
    from kv_policies.retrieval import Retrieval

    assert not OneLayerRestricts.keeps_alike and not Retrieval.keeps_alike
    alike = [build_policy(n, budget=40) for n in ("streaming", "quest", "snapkv", "h2o")]
    assert all(p.keeps_alike for p in alike)
    asked: list[int] = []

    class Counted(StreamingLLM):
        keeps_alike = True

        def keeps_all(self, layer: int, cache_len: int) -> bool:
            asked.append(layer)
            return super().keeps_all(layer, cache_len)

    assert Counted(budget=8, sinks=2).keeps_every_layer(30, 5) and asked == [29]
