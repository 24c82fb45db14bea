"""LongSpec training with a teacher cache and epochs (training/teacher_cache.py, `teacher_cache=`,
`stages.N.epochs`): the target runs once per distinct sequence, later epochs and later runs read its
view back; a stored view is what a later read gives; top-k soft labels over the whole vocabulary are the
full soft labels; an interrupted cached multi-epoch run resumes to the uninterrupted weights; bad
values are one error line."""

from __future__ import annotations

import random

import pytest
import torch

from core.engine import Engine
from decoders.longspec.draft import LongSpecDraft
from training.longspec import steps, train
from training.longspec.teacher_cache import TargetView, TeacherCache

pytestmark = pytest.mark.usefixtures("one_thread")


def cached_args(out, cache, *extra: str) -> list[str]:
    return [
        f"out={out}", "model_source=tiny", "model=tiny", "seq_len=40", "gen_prompt=20", "batch=2",
        "eval_every=100", "eval_new_tokens=6", "validation=1", "max_chars_per_source=40000",
        "checkpoint_every=1", f"teacher_cache={cache}", "teacher_topk=8", "autocast=bf16",
        "stages=[{name: soft, sequences: 4, labels: soft, lr: 0.003, epochs: 3}]", *extra,
    ]  # fmt: skip


def test_epochs_reuse_the_cached_target_view(tmp_path):
    cache = tmp_path / "cache"
    trainer = train.Trainer(train.parse(cached_args(tmp_path / "a", cache)))
    trainer.run()
    assert (trainer.cache.misses, trainer.cache.hits) == (4, 8)  # 4 sequences x 3 epochs
    assert len(list(cache.glob("*/*.pt"))) == 4 and not list(cache.glob("*/*.tmp"))
    plan = trainer.schedule()
    assert [e for *_, e in plan] == [0] * 4 + [1] * 4 + [2] * 4
    first = [index for _, index, _, e in plan if e == 0]
    assert all(sorted(index for _, index, _, e in plan if e == k) == first for k in (1, 2))
    assert len(trainer.log) == 6 and all(r["loss"] == r["loss"] for r in trainer.log)  # finite
    again = train.Trainer(train.parse(cached_args(tmp_path / "b", cache, f"init={tmp_path / 'a' / 'draft'}")))
    again.run()  # another run over the same data: the target never runs
    assert (again.cache.misses, again.cache.hits) == (0, 12)


def test_content_seeded_positions_hit_the_cache_from_other_stages(tmp_path):
    """position_seed=content: a run whose stage has another name (and so other indices) still draws
    each sequence's positions from its tokens, and hits the entries an earlier run wrote."""
    cache = tmp_path / "cache"
    first = train.Trainer(train.parse(cached_args(tmp_path / "a", cache, "position_seed=content")))
    first.run()
    assert first.cache.misses == 4
    renamed = "stages=[{name: other, sequences: 4, labels: soft, lr: 0.003, epochs: 1}]"
    again = train.Trainer(train.parse(cached_args(tmp_path / "b", cache, "position_seed=content", renamed)))
    again.run()
    assert (again.cache.misses, again.cache.hits) == (0, 4)
    by_stage = train.Trainer(train.parse(cached_args(tmp_path / "c", cache, renamed)))
    by_stage.run()  # the default seeds positions by stage and index: other offsets, other entries
    assert by_stage.cache.misses == 4


def test_a_stored_view_is_what_a_read_gives(tmp_path):
    cache = TeacherCache(tmp_path, {"model": "m"}, topk=3)
    gen = torch.Generator().manual_seed(0)
    k = torch.randn(2, 5, 4, generator=gen)
    k[0, 0, 0] = 1e6  # beyond float16: this entry keeps float32
    v = torch.randn(2, 5, 4, generator=gen) / 3
    logits = torch.randn(5, 11, generator=gen)
    tokens, positions = torch.arange(5), torch.arange(5)
    top = logits.log_softmax(-1).topk(3)
    stored = cache.put(tokens, positions, TargetView(k, v, top.indices, top.values))
    read = cache.get(tokens, positions, torch.device("cpu"))
    for a, b in zip(
        (stored.k, stored.v, stored.top_ids, stored.top_logprobs),
        (read.k, read.v, read.top_ids, read.top_logprobs),
    ):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    torch.testing.assert_close(read.k, k, rtol=0, atol=0)
    assert not torch.equal(read.v, v) and torch.allclose(read.v, v, atol=1e-3)  # float16
    assert cache.get(tokens, positions + 1, torch.device("cpu")) is None  # positions are part of the key
    other = TeacherCache(tmp_path, {"model": "other"}, topk=3)
    assert other.get(tokens, positions, torch.device("cpu")) is None  # so is the target


def test_top_k_of_the_whole_vocabulary_is_the_full_soft_loss(tiny_lm, tmp_path):
    eng = Engine(tiny_lm.model)
    draft = LongSpecDraft.init_for(eng, target_layer=-1, window=6, seed=1)
    gen = torch.Generator().manual_seed(2)
    tokens = torch.randint(0, 250, (24,), generator=gen).tolist()
    positions = steps.positions_for("anchor_offset", 24, 4, 50, random.Random(3))
    vocab = draft.config.vocab_size
    cache = TeacherCache(tmp_path, {"model": "tiny"}, topk=vocab)
    with torch.no_grad():
        full = steps.sequence_loss(draft, eng, tokens, positions, "soft", 2)
        first = steps.sequence_loss(draft, eng, tokens, positions, "soft", 2, cache)
        second = steps.sequence_loss(draft, eng, tokens, positions, "soft", 2, cache)
        target = steps.sequence_loss(draft, eng, tokens, positions, "target", 2)
        target_cached = steps.sequence_loss(draft, eng, tokens, positions, "target", 2, cache)
    assert (cache.misses, cache.hits) == (1, 2)
    assert float(first) == float(second)  # the first epoch trains on the stored (rounded) view
    torch.testing.assert_close(first, full, rtol=2e-3, atol=0)
    torch.testing.assert_close(target_cached, target, rtol=2e-3, atol=0)


def test_an_interrupted_cached_run_resumes_to_the_same_weights(tmp_path, monkeypatch):
    whole = tmp_path / "whole"
    assert train.main(cached_args(whole, tmp_path / "c1", "autocast=none")) == 0
    real_save = train.Trainer.save_state

    def save_then_crash(self):
        real_save(self)
        if self.step == 3:  # inside the second epoch
            raise KeyboardInterrupt

    monkeypatch.setattr(train.Trainer, "save_state", save_then_crash)
    cut = tmp_path / "cut"
    with pytest.raises(KeyboardInterrupt):
        train.main(cached_args(cut, tmp_path / "c2", "autocast=none"))
    monkeypatch.setattr(train.Trainer, "save_state", real_save)
    assert train.main(cached_args(cut, tmp_path / "c2", "autocast=none")) == 0
    a = torch.load(whole / "state.pt", weights_only=False)
    b = torch.load(cut / "state.pt", weights_only=False)
    assert a["step"] == b["step"] == 6
    assert [r["lr"] for r in a["log"]] == [r["lr"] for r in b["log"]]
    for key in a["draft"]:
        torch.testing.assert_close(a["draft"][key], b["draft"][key], rtol=0, atol=0)


@pytest.mark.parametrize(
    "bad, words",
    [
        ("stages.0.epochs=0", "epochs must be >= 1"),
        ("autocast=fp8", "autocast must be none or bf16"),
        ("teacher_topk=0", "teacher_topk must be >= 1"),
        ("position_seed=random", "position_seed must be stage or content"),
        ("continuations=beam", "continuations must be greedy, prompt_lookup or batched"),
        ("gen_batch=0", "gen_batch >= 1"),
        ("max_minutes=-1", "max_minutes must be >= 0"),
    ],
)
def test_bad_values_are_one_line(tmp_path, capsys, bad, words):
    assert train.main([f"out={tmp_path / 'a'}", bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: training.longspec:") and words in err and err.count("\n") == 1
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_prompt_lookup_continuations_are_the_greedy_ones(tiny_lm, seed):
    """continuations=prompt_lookup: the target's continuation decoded by prompt lookup equals plain greedy
    decoding (fp32), on prompts that repeat (so drafts are proposed and accepted) and on random ones."""
    eng = Engine(tiny_lm.model)
    gen = torch.Generator().manual_seed(seed)
    phrase = torch.randint(0, 250, (7,), generator=gen).tolist()
    prompts = [phrase * 5, torch.randint(0, 250, (30,), generator=gen).tolist()]
    for prompt in prompts:
        plain = steps.greedy_continuation(eng, prompt, 40)
        assert steps.greedy_continuation(eng, prompt, 40, "prompt_lookup") == plain
        assert len(plain) == 40


def test_batched_continuations_are_the_greedy_ones(tiny_lm):
    """continuations=batched: five prompts decoded together through the model's own code give each
    prompt's plain greedy continuation (fp32, tiny models: no near-ties there); prompts of unequal
    length are refused (no padding)."""
    eng = Engine(tiny_lm.model)
    gen = torch.Generator().manual_seed(4)
    phrase = torch.randint(0, 250, (6,), generator=gen).tolist()
    prompts = [phrase * 4] + [torch.randint(0, 250, (24,), generator=gen).tolist() for _ in range(4)]
    together = steps.continuations(eng, prompts, 30, "batched")
    assert together == [steps.greedy_continuation(eng, p, 30) for p in prompts]
    assert steps.continuations(eng, prompts[:2], 30, "greedy") == together[:2]
    with pytest.raises(ValueError, match="one length"):
        steps.batched_continuations(eng, [prompts[0], prompts[1][:-1]], 4)
