"""Helpers shared by the test modules (no test module imports from another)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra import compose, initialize_config_dir

from core.attention import CausalView, MaskView
from core.engine import Engine
from core.kv_cache import KVCache
from decoders.longspec.tree import TreeDraft
from decoders.registry import decoder_class
from kv_policies.registry import policy_class
from runners.schemas import register_schemas

REPO = Path(__file__).resolve().parents[1]


def page_minmax(k: torch.Tensor, page_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Brute-force per-page channel min and max `[..., pages, d]` of keys `[..., L, d]` (the last page
    may be partial): the reference Quest's incremental page extremes are checked against."""
    *lead, length, d = k.shape
    pages = -(-length // page_size)
    pad = pages * page_size - length
    kp = torch.nn.functional.pad(k.float(), (0, 0, 0, pad), value=float("nan"))
    kp = kp.reshape(*lead, pages, page_size, d)
    return kp.nan_to_num(float("inf")).amin(-2), kp.nan_to_num(float("-inf")).amax(-2)


def varied_prompts(n: int, seed: int = 0) -> list[list[int]]:
    """Random token ids and byte text, short and long, so that candidates are accepted and rejected."""
    rng = random.Random(seed)
    texts = [
        "The quick brown fox jumps over the lazy dog. " * 2,
        "def f(x):\n    return x * x\n",
        "1, 2, 3, 4, 5, 6, 7, 8",
        "MT-Bench asks: compose a travel blog post about Hawaii.",
    ]
    out = []
    for i in range(n):
        if i % 2:
            out.append(list(texts[(i // 2) % len(texts)].encode()))
        else:
            out.append([rng.randrange(256) for _ in range(rng.randint(2, 60))])
    return out


def compose_config(*overrides: str):
    """The composed config of `overrides` (Hydra's own `hydra` section included)."""
    register_schemas()
    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True)


def make_cfg(tmp_path: Path, *overrides: str):
    register_schemas()
    with initialize_config_dir(str(REPO / "conf"), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "model=tiny_llama",
                "task._target_=tests.fake_task.FakeTask",
                "run.max_new_tokens=6",
                "run.limit=null",
                "run.warmup=false",
                f"run.out_dir={tmp_path}",
                *overrides,
            ],
        )
    return cfg


class FakeEngine:
    """Just the parts of `core.engine.Engine` a policy touches, over a real `KVCache`: eager forwards,
    or fixed-shape ones where a test sets `graphs` (a stand-in with `capture`), as `Engine.use_graphs`."""

    def __init__(self, layers: int = 2, hkv: int = 2, d: int = 8, capacity: int = 512) -> None:
        self.cache = KVCache(layers, hkv, d, torch.float32, torch.device("cpu"))
        self.cache.reset(capacity)
        self.scale, self.device = d**-0.5, torch.device("cpu")
        self.graphs: Any = None

    # the engine's answers about its forwards, read the same way (`core.engine.Engine`)
    fixed_shape = Engine.fixed_shape
    captured = Engine.captured
    rows_run = Engine.rows_run
    replayable = Engine.replayable

    @property
    def length(self) -> int:
        return self.cache.length

    def append(self, k: torch.Tensor, v: torch.Tensor | None = None) -> None:
        """Commit entries with keys `k [layers, hkv, m, d]` at the next positions."""
        c, m = self.cache, k.shape[2]
        c.stage_positions(torch.arange(c.length, c.length + m))
        for layer in range(c.n_layers):
            c.write(layer, k[layer], k[layer] if v is None else v[layer])
        c.commit(torch.arange(m))


def _static(tiny_lm) -> Engine:
    eng = Engine(tiny_lm.model)
    eng.use_graphs(capture=False)
    return eng


def steep(rows: int, ctx: float) -> float:  # every row costs 40% of a step
    return 1.0 + 0.4 * (rows - 1)


def flat(rows: int, ctx: float) -> float:  # a GPU-like curve: a block costs one step up to 512 rows
    return 1.0 + max(rows - 512, 0) * 0.01


class TargetDraft(TreeDraft):
    """A test draft whose logits are the target model's own, run densely on a cache of its own over the
    committed sequence plus the block rows each query may see: it proposes what the target will accept,
    so long paths are accepted. Same protocol as `LongSpecDraft` (start / begin_block / step / commit);
    it checks that the decoder gives it only committed target entries and contiguous commits."""

    vocab_ids = None  # drafts over the whole vocabulary

    def __init__(self, model, window: int = 8) -> None:
        self.eng = Engine(model)  # an engine of its own over the target's weights
        self.window, self.target_layer, self.label = window, 0, "the target as its own draft (tests)"
        self.seq: list[int] = []
        self.cached = 0

    def start(self, prompt) -> None:
        self.seq = list(prompt)
        self.eng.reset(len(prompt) + 512)
        self.eng.prefill(self.seq)
        self.cached = min(self.window, len(self.seq))
        self.begin_block()

    def begin_block(self) -> None:
        self.tokens: list[int] = []
        self.positions: list[int] = []
        self.rows: list[torch.Tensor] = []  # each staged row's visibility over the block

    def step(self, tokens, positions, visible, target_len: int) -> torch.Tensor:
        assert target_len == len(self.seq)  # the cross-attention may read committed entries only
        assert visible[:, : self.cached].all()  # the window is always visible
        self.tokens += tokens.tolist()
        self.positions += positions.tolist()
        self.rows += list(visible[:, self.cached :])
        n, total = tokens.numel(), len(self.tokens)
        block = torch.zeros(total, total, dtype=torch.bool)
        for i, row in enumerate(self.rows):
            block[i, : row.numel()] = row
        mask = torch.cat([torch.ones(total, len(self.seq), dtype=torch.bool), block], dim=1)
        logits = self.eng.step(
            torch.tensor(self.tokens), torch.tensor(self.positions), MaskView(mask, self.eng.scale)
        )
        self.eng.crop(self.eng.length)
        return logits[total - n :]

    def commit(self, tokens, first_position: int) -> None:
        assert first_position == len(self.seq)  # commits follow the committed sequence
        tokens = list(tokens)
        if tokens:
            pos = torch.arange(first_position, first_position + len(tokens))
            self.eng.step(torch.tensor(tokens), pos, CausalView(self.eng.scale))
            self.eng.commit(list(range(len(tokens))))
        self.seq += tokens
        self.cached = min(self.window, len(self.seq))


TREES = {
    "chain": (4, [1, 1, 1, 1]),
    "small": (4, [2, 2, 2, 2]),
    "paper": (5, [4, 16, 16, 16, 16]),
}


# the KV policies of kv_policies/registry.py at tiny settings (budgets below the tests' ~60-token
# prompts, so that each restricts), keyed by registry name; a policy registered without an entry is
# tested at its Config's defaults with a tiny budget (`tiny_policy`)
POLICIES = {
    "full": {},
    "streaming": {"budget": 24, "sinks": 4},
    "quest": {"budget": 32, "page_size": 8, "dense_layers": 0},
    "snapkv": {"budget": 24, "window": 4},
    "h2o": {"budget": 24},
    "retrieval": {"budget": 24, "chunk": 4},
    "topk": {"budget": 16},
    "sfi": {"k": 8, "sinks": 2, "recent": 6, "window": 3},
    "kvpress": {"press": "StreamingLLMPress", "compression_ratio": 0.6},
}


CPU_PRESET = dict(k=3, n=1, m=3, tree=True, pool_from_prompt=True, pool_capacity=16)  # conf fafo_cpu


# --- every decoder of decoders/registry.py at tiny size ------------------------------------------------
def _vanilla(eng: Any, kv: Any, sampler: Any = None, **kw: Any) -> Any:
    from decoders.vanilla import Vanilla

    return Vanilla(eng, kv, sampler, **kw)


def _pld(eng: Any, kv: Any, sampler: Any = None, **kw: Any) -> Any:
    from decoders.pld import PromptLookup

    return PromptLookup(eng, kv, sampler, **{"num_tokens": 5, **kw})


def _lookahead(eng: Any, kv: Any, sampler: Any = None, **kw: Any) -> Any:
    from decoders.lookahead import Lookahead

    return Lookahead(eng, kv, sampler, **{"N": 3, "W": 4, "G": 2, **kw})


def _fafo(eng: Any, kv: Any, sampler: Any = None, **kw: Any) -> Any:
    from decoders.fafo.decoder import FAFO

    return FAFO(eng, kv, sampler, **{"k": 2, "n": 4, **kw})


def _fafo_2forward(eng: Any, kv: Any, sampler: Any = None, **kw: Any) -> Any:
    from decoders.fafo.decoder import FAFO2Forward

    return FAFO2Forward(eng, kv, sampler, **{"k": 2, "n": 4, **kw})


def _swift(eng: Any, kv: Any, sampler: Any = None, **kw: Any) -> Any:
    from decoders.swift import Swift

    return Swift(eng, kv, sampler, **{"context_window": 4, "max_score": 1.0, **kw})


def _selfspec(eng: Any, kv: Any, sampler: Any = None, **kw: Any) -> Any:
    from decoders.selfspec import SelfSpeculative

    return SelfSpeculative(eng, kv, sampler, **{"gamma": 4, **kw})


def _triforce(eng: Any, kv: Any, sampler: Any = None, **kw: Any) -> Any:
    """TriForce with a one-layer self-draft (the draft model's own cache: 24 entries, 4 sinks)."""
    from decoders.draft_model import DraftModel
    from decoders.triforce import TriForce

    draft = DraftModel(eng.truncated(1), "self-1", eng.w.vocab_size, budget=24, sinks=4, room=12)
    return TriForce(eng, kv, sampler, **{"gamma1": 2, "gamma2": 4, "draft": draft, "rebuild_every": 1, **kw})


def _longspec(eng: Any, kv: Any, sampler: Any = None, **kw: Any) -> Any:
    from decoders.longspec import LongSpec

    if kw.pop("target_draft", False):  # the target as its own draft: long paths accepted
        return LongSpec(
            eng,
            kv,
            sampler,
            **{"depth": 3, "widths": [2, 3, 3], "draft_module": TargetDraft(eng.model), **kw},
        )
    settings = {"depth": 3, "widths": [2, 3, 3], "checkpoint": "random", "window": 16, **kw}
    return LongSpec(eng, kv, sampler, **settings)


def _sfi(eng: Any, kv: Any, sampler: Any = None, **kw: Any) -> Any:
    """SFI with every seventh token id a boundary: slow steps now and then."""
    from decoders.sfi import SlowFast

    return SlowFast(eng, kv, sampler, **{"t_max": 4, "trigger_token_ids": set(range(0, 256, 7)), **kw})


@dataclass(frozen=True)
class Tiny:
    """One decoder's tiny settings, read by tests/test_every_method.py (and the graph tests)."""

    make: Callable[..., Any]  # make(engine, kv, sampler=None, **options) -> the decoder
    policy: str = "full"  # the KV policy its one-policy checks run under (stop, syncs, fixed shapes)
    # option sets the greedy check sweeps under `policy` (the first also under every other policy)
    variants: tuple[dict, ...] = ({},)
    # the sampling check: options, policy, the `tiny_sampling_case` size, runs and the least acceptance
    # (a `sample_generations` field and count) that shows drafts accepted; None: `unsampled` says why
    sampling: dict | None = None
    unsampled: str = ""
    # host syncs per decode step (tests/test_syncs_per_step.py); None: as many as its draft loop reads
    syncs: float | None = 1.0


SAMPLER_KW = {"temperature": 1.0, "top_p": 0.95, "top_k": 6}
DECODERS: dict[str, Tiny] = {
    "vanilla": Tiny(_vanilla, sampling={"runs": 400}),
    "pld": Tiny(
        _pld,
        variants=tuple(
            {"max_matching_ngram_size": n, "num_tokens": k}
            for n, k in ((1, 1), (1, 4), (2, 10), (3, 5), (4, 20))
        ),
        sampling={"options": {"num_tokens": 3}, "runs": 800, "accepted": 120},
    ),
    "lookahead": Tiny(
        _lookahead,
        variants=tuple(
            {"N": n, "W": w, "G": g, "pool_from_prompt": pool}
            for n, w, g in ((3, 1, 1), (3, 3, 2), (4, 4, 4), (5, 7, 7), (6, 3, 10))
            for pool in (False, True)
        ),
        sampling={
            "options": {"N": 3, "W": 3, "G": 4, "pool_from_prompt": True},
            "runs": 1000,
            "accepted": 400,
        },
    ),
    "fafo": Tiny(
        _fafo,
        policy="streaming",
        variants=(
            CPU_PRESET,
            {**CPU_PRESET, "n": 2},
            {"k": 4, "n": 8},
            {"k": 3, "n": 5, "m": 2, "stream_positions": "slide"},
            {"k": 5, "n": 3, "m": 12, "fumble_sees_last": False},
            {"k": 2, "n": 16, "pool_from_prompt": True, "seed": 3},
            {"k": 4, "n": 10, "tree": True},
        ),
        sampling={"options": {"k": 3, "n": 4, "pool_from_prompt": True}, "runs": 400, "accepted": 50},
    ),
    "fafo_2forward": Tiny(
        _fafo_2forward,
        policy="streaming",
        syncs=2.0,  # its fumble forward and its verification: one read each
        variants=({"k": 4, "n": 6},),
        sampling={"options": {"k": 3, "n": 4, "pool_from_prompt": True}, "runs": 400, "accepted": 50},
    ),
    "swift": Tiny(
        _swift,
        syncs=None,  # a chain draft reads each drafted token
        # its option sweep, on a model with interior layers to skip, is tests/test_lossless_swift.py's
        variants=({"skip_ratio": 0.45, "max_draft": 4, "confidence": 0.0},),
        sampling={
            "options": {"max_draft": 2, "confidence": 0.0, "search_steps": 0, "tree": False},
            "layers": 4,  # a layer-skipping draft needs interior layers
            "runs": 800,
            "accepted": 200,
        },
    ),
    "selfspec": Tiny(
        _selfspec,
        policy="streaming",
        variants=({"gamma": 1, "rebuild_every": 3}, {"gamma": 4, "rebuild_every": 3}),
        sampling={"options": {"gamma": 2}, "kv": ("streaming", {"budget": 8}), "runs": 800, "accepted": 200},
    ),
    "triforce": Tiny(
        _triforce,
        syncs=None,  # the draft model reads each drafted token
        policy="retrieval",
        variants=({"gamma1": 1, "gamma2": 3}, {"gamma1": 2, "gamma2": 6}, {"gamma1": 3, "gamma2": 2}),
        sampling={
            "kv": ("streaming", {"budget": 8}),
            "runs": 1000,
            "accepted": 100,
            "accepted_l1": 100,  # both levels accept under sampling
            "tokens": 4,
        },
    ),
    "longspec": Tiny(
        _longspec,
        variants=(
            *({"depth": d, "widths": w} for d, w in TREES.values()),  # an untrained random draft
            # the target as its own draft, the paper's split attention: multi-token commits
            *(
                {"depth": d, "widths": w, "target_draft": True, "tree_attention": "hybrid"}
                for d, w in TREES.values()
            ),
        ),
        sampling={"options": {"depth": 2, "widths": [3, 3]}, "runs": 800},
    ),
    "sfi": Tiny(
        _sfi,
        policy="sfi",
        unsampled="lossy (decoders/sfi.py: lossless = False): its samples are not vanilla's distribution",
    ),
}


def tiny(name: str) -> Tiny:
    """The tiny settings of registered decoder `name`: its entry above, or, for a decoder registered
    without one, its Config's defaults, sampled like vanilla. So a new decoder is covered by its
    registry entry alone (docs/adding-a-decoder.md)."""
    if name in DECODERS:
        return DECODERS[name]
    cls = decoder_class(name)
    return Tiny(lambda eng, kv, sampler=None, **kw: cls(eng, kv, sampler, **kw), sampling={"runs": 400})


def tiny_policy(name: str) -> dict:
    """The tiny settings of registered policy `name`: its entry above, or, for a policy registered
    without one, its Config's defaults with a budget of 24 entries where it takes a budget."""
    if name in POLICIES:
        return POLICIES[name]
    fields = {f.name for f in dataclasses.fields(policy_class(name).Config)}
    return {"budget": 24} if "budget" in fields else {}
