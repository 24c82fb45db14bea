"""The LongSpec probes' and benchmark's building blocks (copy, induction, positions, temperature)."""

from __future__ import annotations

import json

import pytest
import torch

from core.engine import Engine


def test_longspec_copy_probe_guesses_and_agreement(tiny_lm):
    """The probe's lookup guesses are prompt lookup's own (a 2-gram match's next token, None without a
    match), and a draft's agreement rows line up with the continuation positions (a random draft
    rarely agrees)."""
    from decoders.longspec.draft import LongSpecDraft
    from research.probes.probe_longspec_copy import draft_agreement, ngram_guesses
    from training.longspec.steps import target_view

    seq = [1, 2, 3, 4, 1, 2, 5, 6, 1, 2]
    # t = 5..8: [1, 2] first seen at 0 -> 3; [2, 5], [5, 6] and their last tokens unseen; [6, 1] unseen,
    # so the 1-gram [1], first seen at 0 -> 2
    assert ngram_guesses(seq, 6) == [3, None, None, 2]
    eng = Engine(tiny_lm.model)
    draft = LongSpecDraft.init_for(eng, target_layer=-1, window=16, seed=3)
    tokens = torch.tensor([(5 * i + 1) % 200 for i in range(40)])
    view = target_view(eng, tokens, torch.arange(40), draft.target_layer, True)
    for lag in (1, 3):
        top1, top4 = draft_agreement(draft, tokens, view, 30, lag)
        assert top1.shape == top4.shape == (10,) and bool((top4 | ~top1).all())  # top-1 implies top-4
        assert float(top1.float().mean()) < 0.5


def test_longspec_copy_probe_on_continuation_files(tiny_lm, tmp_path, capsys):
    """`--continuations FILE:PROMPT` reads a file's first sequences from PROMPT on and prints a row per
    draft; a missing file or a spec without a prompt length is one `error:` line."""
    from decoders.longspec.draft import LongSpecDraft
    from research.probes.probe_longspec_copy import continuation_files, print_continuations

    loop = [[(3 * i) % 200 for i in range(8)] * 5, [(5 * i + 1) % 200 for i in range(10)] * 4]
    (tmp_path / "c.json").write_text(json.dumps(loop))
    files = continuation_files([f"{tmp_path / 'c.json'}:12"], 1)
    assert files == [(f"{tmp_path / 'c.json'}:12", loop[:1], 12)]
    eng = Engine(tiny_lm.model)
    drafts = {"a": LongSpecDraft.init_for(eng, target_layer=-1, window=16, seed=3)}
    print_continuations(eng, drafts, files)
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith(f"| {tmp_path}")]
    assert len(rows) == 1
    cells = rows[0].split(" | ")
    assert cells[1] == "1" and cells[3] == "a" and 0.0 <= float(cells[2]) <= 1.0
    for bad in ([str(tmp_path / "c.json")], [f"{tmp_path / 'none.json'}:12"]):
        with pytest.raises(SystemExit, match="^error: --continuations takes FILE:PROMPT"):
            continuation_files(bad, 1)


def test_longspec_copy_probe_on_random_loops(tiny_lm, capsys):
    """`--random-loops N`: N sequences of repeated random units, each of `RANDOM_LOOPS_LEN` tokens,
    read from past the longest unit; a negative count is one `error:` line."""
    from decoders.longspec.draft import LongSpecDraft
    from research.probes.probe_longspec_copy import (
        RANDOM_LOOPS_LEN,
        main,
        print_continuations,
        random_loop_set,
    )
    from training.longspec.loops import RANDOM_UNIT

    label, seqs, first = random_loop_set(tiny_lm.tokenizer, 2)
    assert label.startswith("random loops") and first == RANDOM_UNIT[1]
    assert len(seqs) == 2 and all(len(s) == RANDOM_LOOPS_LEN for s in seqs) and seqs[0] != seqs[1]
    assert random_loop_set(tiny_lm.tokenizer, 2)[1] == seqs
    eng = Engine(tiny_lm.model)
    drafts = {"a": LongSpecDraft.init_for(eng, target_layer=-1, window=16, seed=3)}
    print_continuations(eng, drafts, [(label, seqs[:1], first)])
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| random loops")]
    assert len(rows) == 1 and rows[0].split(" | ")[1] == "1"
    with pytest.raises(SystemExit, match="^error: --random-loops takes a count"):
        main(["--random-loops", "-1"])


def test_longspec_copy_probe_ablations(tiny_lm):
    """A cross window as long as the sequence is the causal cross-attention; a window of one makes a row
    blind to older target entries; the short-context ablation matches the full one when the prompt is
    no longer than the cut; zeroed values change what a draft predicts; an unknown ablation is an
    error."""
    from decoders.longspec.draft import LongSpecDraft
    from research.probes.probe_longspec_copy import (
        ABLATIONS,
        SHORT_CONTEXT,
        ablation_agreement,
        draft_agreement,
    )
    from training.longspec.steps import target_view

    eng = Engine(tiny_lm.model)
    draft = LongSpecDraft.init_for(eng, target_layer=-1, window=16, seed=3)
    tokens, pos = torch.tensor([(7 * i + 2) % 200 for i in range(48)]), torch.arange(48)
    k, v, logits = view = target_view(eng, tokens, pos, draft.target_layer, True)
    with torch.no_grad():
        causal = draft.forward_train(tokens, pos, k, v, 1)
        assert torch.allclose(draft.forward_train(tokens, pos, k, v, 1, cross_window=48), causal)
        one = draft.forward_train(tokens, pos, k, v, 1, cross_window=1)
        v_old = v.clone()
        v_old[:, :10] = 0  # the only entries rows 0..9 (positions 1..10) see
        blind = draft.forward_train(tokens, pos, k, v_old, 1, cross_window=1)
        assert torch.allclose(one[10:], blind[10:]) and not torch.allclose(one[:10], blind[:10])
        assert not torch.allclose(causal, draft.forward_train(tokens, pos, k, torch.zeros_like(v), 1))
        with pytest.raises(ValueError, match="cross_window"):
            draft.forward_train(tokens, pos, k, v, 1, cross_window=0)
    first = 40
    assert first <= SHORT_CONTEXT
    short = ablation_agreement(draft, eng, tokens, view, first, "short context")
    assert torch.equal(short, draft_agreement(draft, tokens, view, first, 1)[0])
    for kind in ABLATIONS:
        assert ablation_agreement(draft, eng, tokens, view, first, kind).shape == (8,)
    with pytest.raises(ValueError, match="unknown ablation"):
        ablation_agreement(draft, eng, tokens, view, first, "nothing")


def test_bench_longspec_selects_methods_and_names_the_output_apart():
    from benchmarks.bench_longspec import output_name, selected

    makers = {"vanilla": 0, "LongSpec chain": 1, "LongSpec chain, block=auto": 2, "prompt lookup": 3}
    assert selected(makers, None) is makers  # type: ignore[arg-type]
    got = selected(makers, ["block=auto", "lookup"])  # type: ignore[arg-type]
    assert list(got) == ["vanilla", "LongSpec chain, block=auto", "prompt lookup"]
    with pytest.raises(SystemExit, match="matches no method"):
        selected(makers, ["nothing"])  # type: ignore[arg-type]
    assert output_name([]) == "bench_longspec"
    assert output_name(["--methods", "lookup"]) == "bench_longspec-selected"


def test_temperature_probe_writes_other_prompt_slices_apart():
    from research.probes.probe_longspec_temperature import output_name

    assert output_name([]) == output_name(["--temperatures", "1", "2"]) == "probe_longspec_temperature"
    assert output_name(["--skip", "0"]) == "probe_longspec_temperature-skip0"


def test_induction_probe_finds_every_copy_source():
    """A copy position is one where the earliest earlier 2-gram match predicts the next token; its
    sources are every earlier position after that 2-gram holding that token (not those holding
    another)."""
    from research.probes.probe_induction_layers import copy_sources

    seq = [1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 7, 1, 2, 3]
    # t = 9 ([1, 2], next 7: earliest match says 3, no copy); t = 12 ([1, 2], next 3: copy from 2 and 6,
    # not from 10, which holds 7); t = 5 and 6 also copy (prompt starts at 5)
    rows, sources = copy_sources(seq, 6)
    assert rows == [5, 12]
    assert sources[0].nonzero().flatten().tolist() == [2]
    assert sources[1].nonzero().flatten().tolist() == [2, 6]
    assert copy_sources([4, 5, 6], 1)[0] == []


def test_induction_probe_attention_sums_to_one_over_the_visible_positions(tiny_lm):
    """With every visible position marked as a source, each row's mass sums to 1 per head: the hook's
    softmax is causal and reads the engine's own queries and keys; the predecessor column is the same
    mask moved one position back."""
    from core.attention import CausalView
    from research.probes.probe_induction_layers import AttentionOnSources

    eng = Engine(tiny_lm.model)
    seq = torch.tensor([(7 * i + 3) % 200 for i in range(24)])
    rows = [10, 17, 23]
    sources = torch.arange(24)[None, :] <= torch.tensor(rows)[:, None]
    hook = AttentionOnSources(eng, rows, sources)
    eng.reset(24)
    eng.step(seq, torch.arange(24), CausalView(eng.scale), [23], (hook,))
    assert torch.allclose(hook.copied, torch.full_like(hook.copied, 3.0), atol=1e-4)
    # every position but the row's own is just before a source: 1 - (mass on the row itself)
    assert bool((hook.predecessor < hook.copied).all())


def test_longspec_probes_refuse_bad_prompt_arguments_before_loading_the_model():
    from research.probes import probe_induction_layers, probe_longspec_copy, probe_longspec_positions

    for probe in (probe_induction_layers, probe_longspec_copy, probe_longspec_positions):
        for bad in (["--prompts", "0"], ["--new", "4"], ["--context", "32"]):
            if probe is probe_longspec_positions and bad[0] == "--new":
                continue  # it reads the prompts only
            with pytest.raises(SystemExit, match="^error: --prompts must be positive"):
                probe.main(bad)
    with pytest.raises(SystemExit, match="^error: no LongSpec draft in nowhere"):
        probe_longspec_positions.main(["--draft", "nowhere"])
    assert probe_longspec_copy.output_name(["--draft", "auto"]) == "probe_longspec_copy"
    assert probe_longspec_copy.output_name(["--tag", "layer17"]) == "probe_longspec_copy-layer17"
    with pytest.raises(SystemExit, match="^error: --edges must be positive"):
        probe_longspec_positions.main(["--edges", "0"])


def test_positions_probe_buckets_and_scores(tiny_lm):
    """Buckets cover 0..context once, split at the edges inside it; each query position's loss is the
    draft's cross-entropy against the next token of the text, its top-1 compared with the target's
    argmax at the same position."""
    from decoders.longspec.draft import LongSpecDraft
    from research.probes.probe_longspec_positions import LAG, buckets, position_scores
    from training.longspec.steps import target_view

    assert buckets([1024, 2048], 4096) == [(0, 1024), (1024, 2048), (2048, 4096)]
    assert buckets([2048, 1024, 9000, 1024], 1500) == [(0, 1024), (1024, 1500)]
    eng = Engine(tiny_lm.model)
    draft = LongSpecDraft.init_for(eng, target_layer=-1, window=16, seed=3)
    tokens, pos = torch.tensor([(7 * i + 2) % 200 for i in range(32)]), torch.arange(32)
    k, v, logits = view = target_view(eng, tokens, pos, draft.target_layer, True)
    where, loss, agree = position_scores(draft, tokens, view)
    assert where.tolist() == list(range(LAG, 31))
    with torch.no_grad():
        row = draft.forward_train(tokens, pos, k, v, LAG)[5]  # query position LAG + 5
    want = torch.nn.functional.cross_entropy(row[None], tokens[LAG + 6 : LAG + 7])
    assert float(loss[5]) == pytest.approx(float(want), rel=1e-5)
    assert bool(agree[5]) == (int(row.argmax()) == int(logits[LAG + 5].argmax()))


def test_needle_probe_top_keys_and_share():
    """The probe's exact top-B (the group's mean softmax) and its per-(layer, head) hit count."""
    from research.probes.probe_retrieval_needle import share, top_keys

    k = torch.zeros(2, 6, 2)
    k[0, 4], k[1, 1] = torch.tensor([5.0, 0.0]), torch.tensor([0.0, 5.0])
    q = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])  # 2 query heads per KV head
    keep = top_keys(q, k, 1, 1.0)
    assert keep[0].nonzero().flatten().tolist() == [4] and keep[1].nonzero().flatten().tolist() == [1]
    assert share({0: keep, 1: keep}, [4]) == (2, 4)  # KV head 0 of both layers holds position 4
    assert share({0: keep}, [2, 3]) == (0, 2)


def test_probe_output_is_named_per_model():
    from research.probes.probe_retrieval_needle import output_name

    assert output_name([]) == output_name(["--model", "smollm2-135m"]) == "probe_retrieval_needle"
    name = "probe_retrieval_needle-qwen25-coder-0.5b"
    assert output_name(["--samples", "2", "--model", "qwen25-coder-0.5b"]) == name
    assert output_name(["--model=qwen25-coder-0.5b"]) == name
