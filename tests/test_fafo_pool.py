"""FAFO's Find-Out pool as the decoder drives it (Alg. 2-3, App. F), the fumble streams' sliding
windows and discard buffers, and the block layout (App. E, Fig. 4) against a brute-force rule."""

from __future__ import annotations

import pytest
import torch

from decoders.fafo.layout import LayoutCache, build_layout, build_tree_layout
from decoders.fafo.streams import FumbleStreams
from decoders.ngram_pool import NGramPool


def test_prefix_caching_under_every_suffix():
    """Alg. 2: a new k-gram is cached under each suffix (1..k) of its stream's discarded tokens."""
    pool = NGramPool(capacity=4, max_key_len=3)
    pool.add_suffix_keys([5, 6, 7], (1, 2, 3))
    assert pool.get((7,)) == [(1, 2, 3)]
    assert pool.get((6, 7)) == [(1, 2, 3)]
    assert pool.get((5, 6, 7)) == [(1, 2, 3)]
    assert pool.get((5, 6)) == [] and pool.get((6,)) == []
    pool.add_suffix_keys([9], (4, 5, 6))  # a young stream: only one discarded token so far
    assert pool.get((9,)) == [(4, 5, 6)] and len(pool) == 4


def test_retrieval_backs_off_longest_suffix_first():
    """Alg. 3: longest matching suffix first, then shorter ones, distinct, up to the limit."""
    pool = NGramPool(capacity=8, max_key_len=3)
    pool.add((3,), (30, 31))  # only under the 1-token key
    pool.add((2, 3), (20, 21))  # under the 2-token key
    pool.add((1, 2, 3), (10, 11))  # under the 3-token key
    pool.add((3,), (10, 11))  # also under the 1-token key: must not come back twice
    assert pool.lookup([0, 1, 2, 3], 10) == [(10, 11), (20, 21), (30, 31)]
    assert pool.lookup([0, 1, 2, 3], 2) == [(10, 11), (20, 21)]
    assert pool.lookup([7, 2, 3], 10) == [(20, 21), (10, 11), (30, 31)]  # (7,2,3) unknown: back off
    assert pool.lookup([4], 10) == []


def test_lru_per_key_holds_n_entries():
    """App. F: at most n guesses per key, least recently used evicted; re-adding refreshes."""
    pool = NGramPool(capacity=3, max_key_len=2)
    for g in [(1,), (2,), (3,)]:
        pool.add((0,), g)
    pool.add((0,), (1,))  # refresh: (2,) is now the least recently used
    pool.add((0,), (4,))
    assert pool.get((0,)) == [(4,), (1,), (3,)]  # most recent first


def test_streams_slide_and_buffer_discards():
    init = torch.tensor([[1, 2, 3], [4, 5, 6]])
    s = FumbleStreams(init)
    assert s.flat_columns() == [1, 4, 2, 5, 3, 6]  # column-wise (App. E)

    def advance(new: list[int]) -> tuple[list, list]:
        pairs = s.advance(torch.tensor(new)).pairs()
        return [d for d, _ in pairs], [g for _, g in pairs]

    disc, grams = advance([7, 8])
    assert disc == [(1,), (4,)] and grams == [(2, 3, 7), (5, 6, 8)]
    assert s.flat_columns() == [2, 5, 3, 6, 7, 8]
    disc, grams = advance([9, 10])
    assert disc == [(1, 2), (4, 5)] and grams == [(3, 7, 9), (6, 8, 10)]
    for t in range(5):
        disc, grams = advance([20 + t, 30 + t])
    assert disc == [(9, 20, 21), (10, 30, 31)]  # the last k discarded tokens, oldest first
    assert grams == [(22, 23, 24), (32, 33, 34)]
    assert s.flat_columns() == [22, 32, 23, 33, 24, 34]


def test_stream_pairs_are_the_per_stream_windows_of_a_reference_and_stay_as_made():
    """The column list against per-stream lists (the paper's description), over many steps: each advance's
    pairs, all of them and those ending with a token, and an earlier advance's pairs read late."""
    import random

    rng = random.Random(3)
    n, k = 5, 3
    rows = [[rng.randrange(4) for _ in range(k)] for _ in range(n)]
    s = FumbleStreams(rows)
    win, disc = [list(r) for r in rows], [[] for _ in rows]
    earlier = []
    for _ in range(12):
        new = [rng.randrange(4) for _ in range(n)]
        grams = s.advance(new)
        for w, d, t in zip(win, disc, new, strict=True):
            d.append(w.pop(0))
            del d[:-k]
            w.append(t)
        want = [(tuple(d), tuple(w)) for d, w in zip(disc, win, strict=True)]
        assert grams.pairs() == want
        assert s.flat_columns() == [w[r] for r in range(k) for w in win]
        for token in range(4):
            assert grams.ending_with(token) == [p for p in want if p[0][-1] == token]
        earlier.append((grams, want))
    assert all(g.pairs() == want for g, want in earlier)
    with pytest.raises(ValueError, match="3 new tokens for 5 streams"):
        s.advance([1, 2, 3])


def test_streams_feed_pool_like_the_paper():
    """One step of Eq. 1 + Alg. 2 with k=2: the new 2-gram is keyed by the discarded token(s)."""
    pool = NGramPool(capacity=4, max_key_len=2)
    s = FumbleStreams(torch.tensor([[1, 2]]))
    for new in (3, 4):
        for disc, gram in s.advance(torch.tensor([new])).pairs():
            pool.add_suffix_keys(disc, gram)
    assert pool.get((1,)) == [(2, 3)] and pool.get((2,)) == [(3, 4)] and pool.get((1, 2)) == [(3, 4)]
    assert pool.lookup([9, 1, 2], 4) == [(3, 4)]
    deferred = NGramPool(capacity=4, max_key_len=2)
    s = FumbleStreams(torch.tensor([[1, 2]]))
    for new in (3, 4):
        deferred.defer(s.advance([new]))  # the pairs made only when read
    assert deferred.lookup([9, 1, 2], 4) == [(3, 4)] and deferred.get((1,)) == [(2, 3)]
    deferred.flush()
    assert deferred._store == pool._store


def brute_force_visible(k: int, g: int, n: int, sees_last: bool, q: int, c: int) -> bool:
    """Visibility rule of the paper from the row descriptions alone."""

    def describe(row):
        if row == 0:
            return ("root", 0, 0)
        if row <= g * k:
            return ("cand", (row - 1) // k, (row - 1) % k)
        r, i = divmod(row - 1 - g * k, n)
        return ("stream", i, r)

    kq, iq, tq = describe(q)
    kc, ic, tc = describe(c)
    if kc == "root":
        return kq != "stream" or sees_last
    return kq == kc and iq == ic and tc <= tq


def test_layout_matches_brute_force():
    for k, g, n, sees_last in [(3, 2, 4, True), (4, 0, 3, False), (2, 5, 0, True), (1, 1, 1, True)]:
        lay = build_layout(k, g, n, sees_last)
        size = 1 + (g + n) * k
        assert lay.block_mask.shape == (size, size)
        want = torch.tensor(
            [[brute_force_visible(k, g, n, sees_last, q, c) for c in range(size)] for q in range(size)]
        )
        assert torch.equal(lay.block_mask, want)
        # positions: root 0, candidate token t at 1 + t, stream row r at 1 + r
        assert lay.offsets[0] == 0
        assert lay.offsets[1 : 1 + g * k].tolist() == list(range(1, k + 1)) * g
        assert lay.offsets[1 + g * k :].tolist() == [r + 1 for r in range(k) for _ in range(n)]
        assert lay.is_stream.sum() == n * k and not lay.is_stream[: 1 + g * k].any()
        assert lay.is_stream[
            lay.stream_row :
        ].all()  # the restricted rows are one range (the views rely on it)
        # logits: every verification row + the last row of each stream, in stream order
        assert lay.logits_rows.tolist() == list(range(1 + g * k)) + [
            1 + g * k + (k - 1) * n + i for i in range(n)
        ]


def test_tree_layout_shares_prefixes():
    cands = torch.tensor([[5, 6, 7], [5, 6, 8], [5, 9, 7], [4, 6, 7]])
    lay = build_tree_layout(cands, n=2)
    assert lay.stream_row == 1 + 9  # nodes 5, 56, 567, 568, 59, 597, 4, 46, 467
    rows = lay.cand_rows
    assert rows[0, 0] == rows[1, 0] == rows[2, 0] and rows[0, 1] == rows[1, 1] and rows[0, 2] != rows[1, 2]
    assert rows[3, 0] != rows[0, 0]
    for j in range(4):
        for t in range(3):
            r = int(rows[j, t])
            assert lay.cand_tokens[r - 1] == cands[j, t] and lay.offsets[r] == t + 1
            seen = set(lay.block_mask[r].nonzero().flatten().tolist())
            assert seen == {0, *(int(x) for x in rows[j, : t + 1])}  # root + own prefix, nothing else


def test_layout_cache_reuses_a_tree_structure_with_this_steps_candidates(monkeypatch):
    """Tree layouts are cached by trie structure: a step whose candidates share another step's
    structure gets that step's mask and positions with its own tokens and rows, exactly what a fresh
    build gives; the cache stays bounded."""
    from decoders.fafo import layout as fafo_layout

    cache = LayoutCache(3, True, "cpu", tree=True)
    gen = torch.Generator().manual_seed(0)
    for _ in range(60):
        g = int(torch.randint(1, 5, (1,), generator=gen))
        cands = torch.randint(0, 3, (g, 3), generator=gen)  # 3 symbols: prefixes often shared
        got, fresh = cache.get(cands, 2), build_tree_layout(cands, 2)
        for field in ("block_mask", "offsets", "is_stream", "logits_rows", "cand_rows"):
            assert torch.equal(getattr(got, field), getattr(fresh, field)), field
        assert got.cand_tokens == fresh.cand_tokens
    assert 1 < len(cache._trees) < 60  # structures repeat
    monkeypatch.setattr(fafo_layout, "MAX_TREE_LAYOUTS", 2)
    small = LayoutCache(3, True, "cpu", tree=True)
    for cands in ([[1, 2, 3]], [[1, 2, 3], [1, 2, 4]], [[1, 2, 3], [4, 5, 6]]):
        small.get(torch.tensor(cands), 1)
    assert [parent for parent, _ in small._trees] == [(-1, 0, 1, 1), (-1, 0, 1, -1, 3, 4)]


def test_tree_and_flat_layouts_give_the_same_logits():
    """Each candidate row's context is its own prefix in both layouts: same logits, fewer rows."""
    from core.attention import MaskView
    from core.engine import Engine
    from core.models import load_model

    lm = load_model("tiny", "tiny", arch="llama", dtype="float32", device="cpu", seed=2)
    eng = Engine(lm.model)
    prompt = list(range(40, 70))
    cands = torch.tensor([[1, 2, 3], [1, 2, 4], [1, 5, 6], [7, 8, 9]])
    streams = torch.tensor([[10, 11, 12], [13, 14, 15]])
    out = {}
    for name, lay in (("flat", build_layout(3, 4, 2)), ("tree", build_tree_layout(cands, 2))):
        eng.reset(len(prompt) + 40)
        eng.prefill(prompt)
        cache_len = eng.length
        toks = torch.cat(
            [
                torch.tensor([99]),
                cands.reshape(-1) if name == "flat" else torch.tensor(lay.cand_tokens),
                streams.t().reshape(-1),
            ]
        )
        pos = lay.offsets + cache_len
        mask = torch.ones(lay.size, cache_len + lay.size, dtype=torch.bool)
        mask[:, cache_len:] = lay.block_mask
        logits = eng.step(toks, pos, MaskView(mask, eng.scale), logits_rows=lay.logits_rows)
        out[name] = (logits[lay.cand_rows.reshape(-1)], logits[0], logits[lay.stream_row :], lay.size)
    flat, tree = out["flat"], out["tree"]
    for a, b in zip(flat[:3], tree[:3]):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert tree[3] == flat[3] - 3  # rows "1", "1 2" shared: 12 -> 9 candidate rows


def test_aligned_layout_pads_to_query_tiles():
    """flex backend: verification rows and streams start on 16-row tiles; padding rows are inert."""
    k, g, n = 3, 2, 4
    plain, lay = build_layout(k, g, n), build_layout(k, g, n, align=16)
    assert lay.size % 16 == 0 and lay.stream_row == 16 and lay.size == 32
    real = list(range(1 + g * k)) + list(range(16, 16 + n * k))
    assert torch.equal(lay.block_mask[real][:, real], plain.block_mask)
    assert torch.equal(lay.offsets[real], plain.offsets)
    pads = sorted(set(range(lay.size)) - set(real))
    assert torch.equal(lay.block_mask[pads][:, pads], torch.eye(len(pads), dtype=torch.bool))
    assert not lay.block_mask[real][:, pads].any()
    assert lay.is_stream[16:].all() and not lay.is_stream[:16].any() and lay.stream_row == 16
    toks = lay.tokens(7, list(range(100, 100 + n * k)))
    assert len(toks) == 32 and toks[16:28] == list(range(100, 112)) and toks[28:] == [7] * 4
    assert lay.logits_rows.tolist() == list(range(7)) + [16 + (k - 1) * n + i for i in range(n)]
