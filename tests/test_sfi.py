"""SFI (kv=sfi + decoder=sfi): the slow/fast schedule, the sparse set a fast step sees, the Selector
fed with the slow step's exact logits, equality with dense decoding where nothing is sparse, the
sliced backend equal to the dense reference, boundary tokens from a tokenizer, and bad input."""

from __future__ import annotations

import pytest
import torch

from core.engine import Engine
from core.tokenizer import ByteTokenizer
from core.types import Counts, HarnessError
from decoders.sfi import TRIGGERS, SlowFast, trigger_ids
from decoders.vanilla import Vanilla
from kv_policies.sfi import SFI
from kv_policies.sfi_selector import PAPER, sfi_select
from tests.conftest import prefill_under
from tests.helpers import varied_prompts

pytestmark = pytest.mark.usefixtures("one_thread")
N_NEW = 40
BYTE_TRIGGERS = frozenset(ord(c) for c in TRIGGERS)


@pytest.fixture(scope="module")
def setup(tiny_lm):
    eng = Engine(tiny_lm.model)
    prompts = [p for p in varied_prompts(10, seed=11) if len(p) > 40][:4] + [list(b"Hello world. " * 8)]
    return eng, [(p, Vanilla(eng).generate(p, N_NEW, set(), Counts())) for p in prompts]


def test_equals_dense_decoding_when_nothing_is_sparse(setup):
    """k at least the context: every step (slow or fast) sees the whole cache."""
    eng, cases = setup
    for prompt, ref in cases:
        dec = SlowFast(eng, kv=SFI(k=400, sinks=2, recent=8), trigger_token_ids=BYTE_TRIGGERS)
        assert dec.generate(prompt, N_NEW, set(), Counts()) == ref
    every = frozenset(range(260))  # every token triggers: every step is slow (dense)
    for prompt, ref in cases:
        counts = Counts()
        dec = SlowFast(eng, kv=SFI(k=4, sinks=2, recent=4), trigger_token_ids=every)
        assert dec.generate(prompt, N_NEW, set(), counts) == ref
        assert counts.slow_steps == counts.forwards == N_NEW - 1


def test_slow_fast_schedule(setup):
    """Slow: the first decode step, after a boundary token, after t_max fast steps; otherwise fast."""
    eng, cases = setup
    for t_max in (1, 3, 64):
        for prompt, _ in cases:
            counts = Counts()
            dec = SlowFast(eng, kv=SFI(k=8, sinks=2, recent=8), t_max=t_max, trigger_token_ids=BYTE_TRIGGERS)
            out = dec.generate(prompt, N_NEW, set(), counts)
            expect, since = 0, 0
            for step, tok in enumerate(out[:-1]):  # step s feeds out[s]; the last token is never fed
                slow = step == 0 or tok in BYTE_TRIGGERS or since >= t_max
                expect += slow
                since = 0 if slow else since + 1
            assert counts.slow_steps == expect
            if t_max == 64 and not BYTE_TRIGGERS & set(out[:-1]):
                assert counts.slow_steps == 1


def test_fast_steps_see_sinks_recent_and_the_selection(setup):
    eng, cases = setup
    prompt = cases[0][0]
    kv = SFI(k=5, sinks=2, recent=6, window=3)
    prefill_under(eng, kv, prompt, 4)
    n = eng.length
    for layer in range(eng.cache.n_layers):
        sel = kv.select(layer, torch.zeros(1), eng.cache.k[layer, :, :n], n)
        chosen = kv._sel[layer]
        assert chosen.shape == (eng.cache.n_kv_heads, 5)
        for h in range(eng.cache.n_kv_heads):
            want = set(range(2)) | set(range(n - 6, n)) | set(chosen[h].tolist())
            assert set(sel[h].nonzero().squeeze(1).tolist()) == want
            assert all(2 <= p < n - 6 for p in chosen[h].tolist())  # chosen among the candidates


def test_fast_steps_count_what_their_selection_keeps_without_reducing_it(setup):
    """A fast step's selection comes with its count per layer (`view_memo.kept_of`: read from the
    stack's counts below the window, plus the window): the same as summing the selection, which the
    view then skips."""
    eng, cases = setup
    hkv, checked = eng.cache.n_kv_heads, []
    for prompt, _ in cases:
        pol = SFI(k=5, sinks=2, recent=6, window=3)
        stacked = pol.layer_selections

        def spy(cache_len, pol=pol, stacked=stacked):
            got = stacked(cache_len)
            memo = pol.view_memo.kept_of
            if memo is not None and memo[0] is got:
                checked.append(torch.equal(memo[1] + memo[2], got.sum(dim=(1, 2)) // hkv))
            return got

        pol.layer_selections = spy
        SlowFast(eng, kv=pol, t_max=4, trigger_token_ids=BYTE_TRIGGERS).generate(
            prompt, N_NEW, set(), Counts()
        )
    assert len(checked) > N_NEW and all(checked)


def test_slow_step_selector_sees_the_exact_logits(setup):
    """A slow step's selection equals sfi_select on q.k / sqrt(d) computed by hand from the cache."""
    eng, cases = setup
    prompt = cases[1][0]
    kv = SFI(k=6, sinks=2, recent=5, window=2)
    prefill_under(eng, kv, prompt, 4)
    n = eng.length
    torch.manual_seed(0)
    q = torch.randn(eng.w.n_heads, 1, eng.w.head_dim)
    kv.begin_slow()
    kv.observe(1, q)
    kv.end_slow()
    j = torch.arange(2, n - 5)
    keys = eng.cache.k[1, :, 2 : n - 5].float()
    hkv = keys.shape[0]
    logits = q.reshape(hkv, -1, q.shape[-1]) @ keys.transpose(1, 2) * eng.scale
    want = j[sfi_select(logits, keys.norm(dim=-1), j, 6, PAPER).selected]
    assert torch.equal(kv._sel[1], want)


def test_slow_steps_of_every_layer_at_once_select_what_layer_by_layer_does(setup):
    """A slow step shown every layer's queries at once (the fixed-shape forward's `observe_layers`)
    gathers the evidence in one batch; its selections, and the key norms it keeps, are those of the
    same queries shown layer by layer, slow step after slow step as the cache grows."""
    from core.attention import CausalView

    eng, cases = setup
    prompt = cases[1][0]
    n_layers, heads, d = eng.cache.n_layers, eng.w.n_heads, eng.w.head_dim
    batched, by_layer = SFI(k=6, sinks=2, recent=5, window=2), SFI(k=6, sinks=2, recent=5, window=2)
    eng.reset(len(prompt) + 8)
    for kv in (batched, by_layer):  # both over the one cache
        kv.attach(eng)
        kv.reset(len(prompt), len(prompt) + 8)
    eng.prefill(prompt, hooks=batched.prefill_hooks() + by_layer.prefill_hooks())
    for kv in (batched, by_layer):
        kv.after_prefill(eng)
    calls, rule = [], batched.gather_evidence

    def counted(first, q, length, logits=None):
        calls.append((first, q.shape[0]))
        rule(first, q, length, logits)

    batched.gather_evidence = counted  # the batch, not a layer at a time
    gen = torch.Generator().manual_seed(5)
    for step in range(4):
        queries = torch.randn(n_layers, heads, 2, d, generator=gen)
        batched.begin_slow()
        batched.observe_layers(queries)
        batched.end_slow()
        by_layer.begin_slow()
        for layer in range(n_layers):
            by_layer.observe(layer, queries[layer])
        by_layer.end_slow()
        assert calls == [(0, n_layers)] * (step + 1)
        assert batched._sel.keys() == by_layer._sel.keys() == set(range(n_layers))
        for layer in range(n_layers):
            assert torch.equal(batched._sel[layer], by_layer._sel[layer]), (step, layer)
        n = eng.length
        assert torch.equal(batched._norms[:, :, :n], by_layer._norms[:, :, :n])
        for _ in range(step + 1):  # the cache grows between slow steps
            eng.step(torch.tensor([7]), torch.tensor([eng.length]), CausalView(eng.scale))
            eng.commit([0])


def test_sliced_backend_equals_the_dense_reference(setup):
    eng, cases = setup
    for prompt, _ in cases:
        dense = SlowFast(eng, kv=SFI(k=6, sinks=2, recent=6), t_max=4, trigger_token_ids=BYTE_TRIGGERS)
        sliced = SlowFast(
            eng, kv=SFI(k=6, sinks=2, recent=6, backend="sliced"), t_max=4, trigger_token_ids=BYTE_TRIGGERS
        )
        c1, c2 = Counts(), Counts()
        assert dense.generate(prompt, N_NEW, set(), c1) == sliced.generate(prompt, N_NEW, set(), c2)
        assert c1.kv_activity.restricted_frac > 0 and c1.slow_steps == c2.slow_steps


def test_sliced_fast_steps_move_nothing_and_read_the_recent_window_in_place(setup):
    """Fast steps on the sliced backend: the long-range set is packed once per slow step (no entry
    moves between slow steps), the recent window and new token stay at slot == position, and each fast
    step reads sinks + chosen + recent entries per KV head."""
    from kv_policies.sfi_slow import SFIFastView

    eng, cases = setup
    prompt = cases[0][0]
    kv = SFI(k=6, sinks=2, recent=6, backend="sliced")
    dec = SlowFast(eng, kv=kv, t_max=4, trigger_token_ids=frozenset({10**6}))  # slow every 5th step
    fast, real_step = [], eng.step

    def spy(tokens, positions, view, *args, **kwargs):
        before = kv.slots.region.swaps if kv.slots.region is not None else 0
        out = real_step(tokens, positions, view, *args, **kwargs)
        if isinstance(view, SFIFastView):
            length, reg = eng.length, kv.slots.region
            reg.sync(length + 1)
            tail = torch.arange(length - kv.recent, length + 1)
            assert torch.equal(reg.pos[:, :, tail], tail.expand_as(reg.pos[:, :, tail]))
            assert view.kv_read(length) == kv.sinks + kv.k + kv.recent
            fast.append(reg.swaps - before)
        return out

    eng.step = spy
    try:
        dec.generate(prompt, N_NEW, set(), Counts())
    finally:
        del eng.step
    assert len(fast) > N_NEW // 2
    moved = [m for m in fast if m]  # entries move only on the first fast step after a choice
    assert len(moved) <= N_NEW // 5 + 1 and sum(fast) > 0


def test_boundary_tokens_from_a_tokenizer():
    assert trigger_ids(ByteTokenizer()) == BYTE_TRIGGERS

    class Tok:
        vocab = ["a", ". ", ".a", "?\n", " x!", "\n", ";\t", "end"]

        def get_vocab(self):
            return {t: i for i, t in enumerate(self.vocab)}

        def batch_decode(self, ids):
            return [self.vocab[i[0]] for i in ids]

    assert trigger_ids(Tok()) == {1, 3, 4, 5, 6}
    assert trigger_ids(Tok(), ("x",)) == frozenset()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"k": 0}, "k \\(entries selected per KV head\\) must be a positive integer"),
        ({"sinks": -1}, "sinks must be a non-negative integer"),
        ({"recent": -2}, "recent must be a non-negative integer"),
        ({"window": -1}, "window must be a non-negative integer"),
        ({"lambda_clip": 1.5}, "lambda_clip must be in \\[0, 1\\]"),
        ({"alpha_cross": -0.1}, "alpha_cross must be"),
        ({"preset": "nope"}, "preset must be one of paper, repo"),
    ],
)
def test_bad_policy_input_is_one_clear_error(kwargs, message):
    with pytest.raises(HarnessError, match=message):
        SFI(**kwargs)


def test_bad_decoder_input_is_one_clear_error(setup):
    eng = setup[0]
    with pytest.raises(HarnessError, match="triggers must be a non-empty list"):
        SlowFast(eng, kv=SFI(), triggers=[], tokenizer=ByteTokenizer())
    with pytest.raises(HarnessError, match="no token of the vocabulary ends with"):
        SlowFast(eng, kv=SFI(), triggers=["\u00a7"], tokenizer=ByteTokenizer())
    with pytest.raises(HarnessError, match="decoder.t_max must be an integer >= 1"):
        SlowFast(eng, kv=SFI(), t_max=0, tokenizer=ByteTokenizer())
    with pytest.raises(HarnessError, match="decoder=sfi needs kv=sfi"):
        SlowFast(eng, tokenizer=ByteTokenizer())


def test_slow_view_reuses_its_attention_logits_and_selects_as_the_generic_path(tiny_lm):
    """On a cache long enough for the split decode attention, `SFISlowView` hands the attention's own
    logits to the Selector: same attention output and same selection as computing them again."""
    from core.attention import CausalView
    from kv_policies.layer_selection import ObservedCausalView
    from kv_policies.sfi_slow import SFISlowView

    eng = Engine(tiny_lm.model)
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 250, (2300,), generator=gen).tolist()
    kv = SFI(k=300, sinks=4, recent=64)
    prefill_under(eng, kv, prompt, 2)
    tok, pos = torch.tensor([prompt[-1]]), torch.tensor([len(prompt)])
    chosen = []  # nothing is committed: each step overwrites the same uncommitted slot
    for view in (kv.slow_view(eng), ObservedCausalView(eng.scale, kv)):
        kv.begin_slow()
        logits = eng.step(tok, pos, view)
        kv.end_slow()
        chosen.append(({layer: sel.clone() for layer, sel in kv._sel.items()}, logits))
    assert isinstance(kv.slow_view(eng), SFISlowView)
    torch.testing.assert_close(chosen[0][1], chosen[1][1])
    torch.testing.assert_close(chosen[0][1], eng.step(tok, pos, CausalView(eng.scale)))
    assert chosen[0][0].keys() == chosen[1][0].keys() == set(range(eng.cache.n_layers))
    for layer, sel in chosen[0][0].items():
        assert torch.equal(sel, chosen[1][0][layer])


def test_key_norms_follow_logical_positions_when_the_region_moves_entries(setup):
    """The per-generation key-norm cache (by logical position) equals the norms of the keys found
    through the region, after slow steps have packed (moved) entries on the sliced backend."""
    eng, cases = setup
    kv = SFI(k=6, sinks=2, recent=6, backend="sliced")
    dec = SlowFast(eng, kv=kv, t_max=3, trigger_token_ids=frozenset({10**6}))
    dec.generate(cases[0][0], N_NEW, set(), Counts())
    assert kv.slots.region.swaps > 0
    n = eng.cache.length
    for layer in range(eng.cache.n_layers):
        keys = kv.slots.gather_keys(layer, eng.cache.k[layer, :, :n], torch.arange(n))
        done = kv._normed[layer]
        torch.testing.assert_close(kv._key_norms(layer, 1, done)[0, :, :done], keys[:, :done].norm(dim=-1))


def test_sliced_fast_steps_read_nothing_back_but_the_token(setup):
    """The packed region's lengths are read once per packing (one slow step): a generation with one
    slow step reads the device once per step, plus that packing's reads."""
    from runners.host_syncs import HostSyncs

    eng, cases = setup
    prompt = cases[0][0]
    kv = SFI(k=6, sinks=2, recent=6, backend="sliced")
    dec = SlowFast(eng, kv=kv, t_max=10**6, trigger_token_ids=frozenset({10**6}))  # only the first is slow
    syncs = HostSyncs(eng.device)
    counts = Counts(on_prefill_done=syncs.mark, on_decode_done=syncs.stop)
    with syncs:
        dec.generate(prompt, N_NEW, set(), counts)
    layers = eng.cache.n_layers
    assert counts.slow_steps == 1 and syncs.since_mark <= counts.forwards + 4 * layers + 4
