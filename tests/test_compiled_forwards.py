"""`run.compile`: the fixed-shape decode forwards compiled by inductor (core/decode_graph.py,
`compile_forward`). A tiny model keeps the compiles short; the lossless decoders give the eager
vanilla's greedy ids on it, each shape compiles once and its seconds are counted apart, and the
run-level option is checked before a model loads."""

from __future__ import annotations

import pytest
import torch

from core.engine import Engine
from core.replay import Replay
from core.types import Counts, HarnessError
from decoders.pld import PromptLookup
from decoders.vanilla import Vanilla
from tests.helpers import varied_prompts

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny(request):
    from core.models import load_model

    return load_model("tiny", "tiny", arch="llama", dtype="float32", device="cpu", seed=1)


@pytest.fixture(scope="module")
def compiled(tiny):
    return Engine(tiny.model, compiled=True)


def test_compiled_vanilla_and_pld_give_the_eager_greedy_ids(tiny, compiled):
    """Greedy ids through the compiled forwards equal eager vanilla's (fp32), for vanilla's one-row
    steps and for PLD's padded blocks (several compiled shapes; `make test-long` adds FAFO's and
    Lookahead's larger blocks)."""
    eager = Engine(tiny.model)
    prompts = [p + p[:12] for p in varied_prompts(2, seed=4)]  # repeats, so PLD drafts
    pld = PromptLookup(compiled, max_matching_ngram_size=3, num_tokens=3)
    for prompt in prompts:
        want = Vanilla(eager).generate(prompt, 24, set(), Counts())
        assert Vanilla(compiled).generate(prompt, 24, set(), Counts()) == want
        assert pld.generate(prompt, 24, set(), Counts()) == want
    assert len(compiled.graphs.by_rows) >= 2  # one row and at least one padded block size
    assert all(f.replay.compiled for f in compiled.graphs.by_rows.values())


def test_each_shape_compiles_once_and_its_seconds_are_counted_apart(tiny):
    """The first call at a shape is a compiling call (a clock sees it as a capture; its seconds go to
    `Replay.total_compile_s`); the same shape again compiles nothing; a larger cache compiles again."""
    eng = Engine(tiny.model, compiled=True)
    prompt = varied_prompts(1, seed=9)[0]
    captures, seconds = Replay.total_captures, Replay.total_compile_s
    Vanilla(eng).generate(prompt, 8, set(), Counts())
    assert Replay.total_captures == captures + 1 and Replay.total_compile_s > seconds
    captures, seconds = Replay.total_captures, Replay.total_compile_s
    Vanilla(eng).generate(prompt, 8, set(), Counts())  # the same allocation: nothing compiles
    assert (Replay.total_captures, Replay.total_compile_s) == (captures, seconds)
    eng.reserve(4 * eng.cache.capacity)  # another allocation: the cache's shape changed
    Vanilla(eng).generate(prompt, 8, set(), Counts())
    assert Replay.total_captures == captures + 1


def test_compiled_forward_writes_only_the_block_slots(tiny, compiled):
    """The compiled write goes into the block's slots of each layer and nowhere else (it indexes the
    whole cache rather than a layer's view, see `StaticForward._write_kv`)."""
    eager = Engine(tiny.model)
    prompt = varied_prompts(1, seed=2)[0]
    for eng in (eager, compiled):
        Vanilla(eng).generate(prompt, 6, set(), Counts())
    n = eager.length
    assert compiled.length == n
    torch.testing.assert_close(compiled.cache.k[:, :, :n], eager.cache.k[:, :, :n], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(compiled.cache.v[:, :, :n], eager.cache.v[:, :, :n], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("run", "message"),
    [
        ({"compile": "yes"}, "run.compile"),
        ({"compile": True, "linear": "onednn"}, "run.linear=aten"),
    ],
)
def test_run_compile_is_checked_before_loading(run, message):
    from omegaconf import OmegaConf

    from runners.config import run_settings

    cfg = OmegaConf.create({"run": {"out_dir": "results", **run}, "model": {"device": "cpu"}})
    with pytest.raises(HarnessError, match=message):
        run_settings(cfg)


def test_compiled_runs_have_their_own_identity_and_linear(tiny):
    """auto linear is aten for compiled forwards (inductor calls the GEMMs itself); the run identity and
    the command key carry `compile` only when it is on (earlier runs keep their ids)."""
    from runners.config import resolve_linear
    from runners.identity import IDENTITY_RUN

    assert resolve_linear("auto", tiny, compiled=True) == "aten"
    assert "compile" in IDENTITY_RUN


@pytest.mark.slow
def test_compiled_fafo_and_lookahead_give_the_eager_greedy_ids(tiny, compiled):
    """FAFO's and Lookahead's blocks (8-32 padded rows) through the compiled forwards."""
    from decoders.fafo.decoder import FAFO
    from decoders.lookahead import Lookahead

    eager = Engine(tiny.model)
    for prompt in varied_prompts(2, seed=6):
        want = Vanilla(eager).generate(prompt, 24, set(), Counts())
        assert FAFO(compiled, k=3, n=4).generate(prompt, 24, set(), Counts()) == want
        assert Lookahead(compiled).generate(prompt, 24, set(), Counts()) == want
