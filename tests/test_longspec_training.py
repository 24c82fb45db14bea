"""LongSpec draft training (training/longspec/train.py): the training forward is the drafting forward (every
row, every lag, anchor-offset positions, a window shorter than the sequence); the layer initialisation
copies the target's layer; a trained draft is lossless inside `decoder=longspec`; an interrupted run
resumes to the same weights as an uninterrupted one; bad input is one clear error line; the training
text stays out of the LongSpec experiments' evaluation windows."""

from __future__ import annotations

import json
import random

import pytest
import torch

from core.engine import Engine
from core.types import Counts, HarnessError
from decoders.longspec.decoder import LongSpec
from decoders.longspec.draft import LongSpecDraft
from decoders.vanilla import Vanilla
from training.longspec import steps, train
from training.longspec.data import ESSAYS_HELD_OUT, first_unused_char

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_args(out, *extra: str) -> list[str]:
    return [
        f"out={out}", "model_source=tiny", "model=tiny", "seq_len=48", "gen_prompt=24", "batch=2",
        "eval_every=2", "eval_new_tokens=8", "validation=1", "max_chars_per_source=40000",
        "checkpoint_every=1", "stages=[{name: pretrain, sequences: 4, lr: 0.003}, "
        "{name: distill, sequences: 4, labels: target, positions: vanilla, lr: 0.001, generated: 2}]", *extra,
    ]  # fmt: skip


@pytest.mark.parametrize("lag", [1, 3])
def test_training_forward_equals_drafting(tiny_lm, lag):
    """Row t of `forward_train` = the draft's `step` for token t with the window filled by tokens < t and
    the target cache holding rows <= t - lag, at anchor-offset positions."""
    eng = Engine(tiny_lm.model)
    draft = LongSpecDraft.init_for(eng, target_layer=-1, window=5, seed=3)
    gen = torch.Generator().manual_seed(1)
    n = 18
    tokens = torch.randint(0, 250, (n,), generator=gen)
    positions = torch.tensor(steps.positions_for("anchor_offset", n, 4, 100, random.Random(7)))
    assert positions[:4].tolist() == [0, 1, 2, 3] and positions[4] > 4  # offset o drawn > 0 here
    k, v, _ = steps.target_view(eng, tokens, positions, draft.target_layer, False)
    with torch.no_grad():
        trained = draft.forward_train(tokens, positions, k, v, lag)
    assert trained.shape[0] == n - 1 - lag
    for t in range(lag, n - 1):  # the step reads target rows < its target_len only
        draft.cached = 0
        draft.begin_block()
        draft.commit(tokens[: min(t, 4)].tolist(), 0)
        if t > 4:
            draft.commit(tokens[4:t].tolist(), int(positions[4]))
        visible = torch.ones(1, draft.cached + 1, dtype=torch.bool)
        step = draft.step(tokens[t : t + 1], positions[t : t + 1], visible, t - lag + 1)
        torch.testing.assert_close(trained[t - lag], step[0], rtol=1e-5, atol=1e-5)


def test_layer_init_copies_the_target_layer(tiny_lm):
    eng = Engine(tiny_lm.model)
    draft = LongSpecDraft.init_from_layer(eng, target_layer=-1, window=8)
    attn = tiny_lm.model.model.layers[-1].self_attn
    mlp = tiny_lm.model.model.layers[-1].mlp
    assert torch.equal(draft.q_proj.weight, attn.q_proj.weight)
    assert torch.equal(draft.cross_q_proj.weight, attn.q_proj.weight)
    assert torch.equal(draft.v_proj.weight, attn.v_proj.weight)
    assert torch.equal(draft.down_proj.weight, mlp.down_proj.weight)
    assert torch.equal(draft.final_norm.weight, tiny_lm.model.model.norm.weight)


def test_positions():
    rng = random.Random(0)
    assert steps.positions_for("vanilla", 6, 4, 100, rng) == list(range(6))
    for _ in range(20):
        pos = steps.positions_for("anchor_offset", 10, 4, 50, rng)
        o = pos[4] - 4
        assert pos[:4] == [0, 1, 2, 3] and 0 <= o <= 50 and pos[4:] == [o + i for i in range(4, 10)]


def test_train_resume_and_decode(tmp_path, monkeypatch):
    """A run interrupted after 2 optimizer steps and rerun ends with the weights of an uninterrupted
    run; its exported draft loads into decoder=longspec, which stays token-identical to vanilla."""
    whole = tmp_path / "whole"
    train.main(tiny_args(whole))
    cut = tmp_path / "cut"
    real_save = train.Trainer.save_state

    def save_then_crash(self):
        real_save(self)
        if self.step == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(train.Trainer, "save_state", save_then_crash)
    with pytest.raises(KeyboardInterrupt):
        train.main(tiny_args(cut))
    monkeypatch.setattr(train.Trainer, "save_state", real_save)
    assert train.main(tiny_args(cut)) == 0
    a = torch.load(whole / "state.pt", weights_only=False)
    b = torch.load(cut / "state.pt", weights_only=False)
    assert a["step"] == b["step"] == 4
    for key in a["draft"]:
        torch.testing.assert_close(a["draft"][key], b["draft"][key], rtol=0, atol=0)
    assert [r["loss"] for r in a["log"]] == [r["loss"] for r in b["log"]]
    for name in ("model.safetensors", "config.json", "training.json", "loss.png", "token_counts.safetensors"):
        assert (whole / "draft" / name).is_file()

    trainer = train.Trainer(train.parse(tiny_args(whole)))  # the same target model
    eng = trainer.engine
    saved = LongSpecDraft.load(whole / "draft", eng)  # token counts: this run's training sequences
    trainer.prepare_data()
    assert int(saved.token_counts.sum()) == sum(len(t) for _, _, t, _ in trainer.schedule())
    prompt = list(range(40, 70))
    vanilla = Vanilla(eng).generate(prompt, 24, set(), Counts())
    dec = LongSpec(eng, depth=4, widths=[2, 2, 2, 2], checkpoint=str(whole / "draft"))
    assert dec.generate(prompt, 24, set(), Counts()) == vanilla


def test_continue_from_a_saved_draft(tmp_path, capsys):
    """init=<draft folder> starts from that draft's weights, counts its training tokens before this
    run's, and records where it started; a draft for another window is refused in one line."""
    first = tmp_path / "first"
    assert train.main(tiny_args(first)) == 0
    saved = json.loads((first / "draft" / "training.json").read_text())
    trainer = train.Trainer(train.parse(tiny_args(tmp_path / "next", f"init={first / 'draft'}")))
    start = LongSpecDraft.load(first / "draft", trainer.engine)
    for key, value in start.state_dict().items():
        torch.testing.assert_close(trainer.draft.state_dict()[key], value, rtol=0, atol=0)
    folder = trainer.run()
    summary = json.loads((folder / "training.json").read_text())
    assert summary["continued_from"]["training_tokens"] == saved["training_tokens"] > 0
    own = sum(r["tokens"] for r in trainer.log)
    assert summary["training_tokens"] == saved["training_tokens"] + own
    assert trainer.evals[0]["tokens_total"] == saved["training_tokens"]
    assert summary["evals"] == saved["evals"] + trainer.evals  # one validation curve over both runs
    capsys.readouterr()
    assert train.main(tiny_args(tmp_path / "other", f"init={first / 'draft'}", "window=3")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "set them to the draft's" in err
    assert not (tmp_path / "other").exists()
    assert train.main(tiny_args(tmp_path / "other", f"init={first / 'draft'}", "target_layer=0")) == 2
    assert "retarget=true" in capsys.readouterr().err and not (tmp_path / "other").exists()


def test_retarget_moves_a_draft_to_another_layer(tmp_path, tiny_lm):
    """retarget=true: the continued draft reads target_layer, its cross-attention a copy of that layer's
    attention, the rest of its block as saved; the run records the layer it read before."""
    first = tmp_path / "first"
    LongSpecDraft.init_for(Engine(tiny_lm.model), target_layer=-1, window=512, seed=2).save(first)
    args = tiny_args(tmp_path / "moved", f"init={first}", "target_layer=0", "retarget=true")
    trainer = train.Trainer(train.parse(args))
    start, moved = LongSpecDraft.load(first, trainer.engine), trainer.draft
    attn = trainer.engine.model.model.layers[0].self_attn
    assert moved.target_layer == moved.config.target_layer == 0 != start.target_layer
    assert torch.equal(moved.cross_q_proj.weight, attn.q_proj.weight)
    assert torch.equal(moved.cross_o_proj.weight, attn.o_proj.weight)
    for name in ("q_proj", "k_proj", "v_proj", "o_proj", "down_proj", "self_norm", "final_norm"):
        assert torch.equal(getattr(moved, name).weight, getattr(start, name).weight)
    assert trainer.init_from["target_layer"] == start.target_layer
    zeroed = train.Trainer(train.parse([*args, "retarget_output=zero"])).draft
    assert torch.equal(zeroed.cross_q_proj.weight, attn.q_proj.weight)
    assert not zeroed.cross_o_proj.weight.any()


def test_retarget_takes_the_layers_query_bias(tiny_lm):
    """A draft with query biases (the released drafts' layout) moved to a layer takes that layer's query
    bias (Qwen2), or none (Llama)."""
    from dataclasses import replace

    from decoders.longspec.draft import DraftConfig

    eng = Engine(tiny_lm.model)
    draft = LongSpecDraft(replace(DraftConfig.for_target(eng, -1, 8), qkv_bias=True), eng, "biased")
    draft.cross_q_proj.bias.data.fill_(1.0)
    draft.retarget(0)
    want = tiny_lm.model.model.layers[0].self_attn.q_proj.bias
    torch.testing.assert_close(
        draft.cross_q_proj.bias, want if want is not None else torch.zeros_like(draft.cross_q_proj.bias)
    )


def test_overrides():
    cfg = train.parse(["out=x", "stages.0.positions=vanilla", "batch=3"])
    assert cfg.stages[0].positions == "vanilla" and cfg.stages[1].name == "distill" and cfg.batch == 3
    cfg = train.parse(["stages=[{name: a, sequences: 8, labels: soft}]"])
    assert [(s.name, s.sequences, s.labels) for s in cfg.stages] == [("a", 8, "soft")]


def test_an_out_of_range_list_index_is_one_clear_line(tmp_path, capsys):
    assert train.main([f"out={tmp_path / 'a'}", "stages.5.lr=1e-3"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "stages.5.lr: stages has 2 items, indices 0..1" in err
    assert not (tmp_path / "a").exists()


def test_bad_input(tmp_path, capsys):
    assert train.main([f"out={tmp_path / 'a'}", "no_such_field=1"]) == 2
    assert capsys.readouterr().err.startswith("error: training.longspec: bad override")
    assert train.main([f"out={tmp_path / 'a'}", "init=zeros"]) == 2
    assert "init must be layer, random or a draft folder" in capsys.readouterr().err
    assert train.main([f"out={tmp_path / 'a'}", "retarget=true"]) == 2
    assert "retarget=true moves a trained draft" in capsys.readouterr().err
    assert train.main([f"out={tmp_path / 'a'}", "retarget_output=half"]) == 2
    assert "retarget_output must be layer or zero" in capsys.readouterr().err
    assert train.main([f"out={tmp_path / 'a'}", "random_loops_per_window=0"]) == 2
    assert "random_loops_per_window must be >= 1" in capsys.readouterr().err
    for bad in (["batch=abc"], ["stages.0.positions"], ["stages.0.labels=guess"]):
        assert train.main([f"out={tmp_path / 'a'}", *bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: training.longspec:") and err.count("\n") == 1
    train.main(tiny_args(tmp_path / "b"))
    assert train.main(tiny_args(tmp_path / "b", "seed=5")) == 2
    assert "holds a run with another config" in capsys.readouterr().err


def test_training_text_is_not_evaluated():
    """The LongSpec experiments read PG-19 package windows below the essays' held-out boundary."""
    from omegaconf import OmegaConf

    names = ("longspec_table1_cpu", "longspec_table1_magicdec_cpu", "longspec_table1_draftless_cpu",
             "longspec_table2_cpu", "longspec_tau_prompts_cpu")  # fmt: skip
    for name in names:
        exp = OmegaConf.load(f"conf/experiment/{name}.yaml")
        assert exp.task.source == "package"
        assert first_unused_char(int(exp.task.context_length), int(exp.run.limit)) < ESSAYS_HELD_OUT


def test_no_trained_draft_for_another_model(tiny_lm):
    with pytest.raises(HarnessError, match="no shipped LongSpec draft"):
        LongSpec(Engine(tiny_lm.model), checkpoint="auto")


def test_extra_sources_come_after_the_same_validation(tmp_path, capsys):
    """extra_sources=[hotpotqa_more]: the validation sequences stay those of a run without it, the fresh
    text comes next, and its HotpotQA rows follow those `hotpotqa` takes; a name twice is one line."""
    from training.longspec.data import source_text

    base = train.Trainer(train.parse(tiny_args(tmp_path / "a")))
    base.resume()
    base.prepare_data()
    more = train.Trainer(train.parse(tiny_args(tmp_path / "b", "extra_sources=[hotpotqa_more]")))
    more.resume()
    more.prepare_data()
    assert more.validation == base.validation
    first, fresh = source_text("hotpotqa", 40000), source_text("hotpotqa_more", 40000)
    assert fresh and fresh[:200] not in first
    recipe = json.loads((tmp_path / "b" / "data.json").read_text())
    assert recipe["extra_sources"] == ["hotpotqa_more"] and recipe["sequences"]["hotpotqa_more"] > 0
    n_gen = sum(s.generated for s in more.cfg.stages)
    extra_ids = set(map(tuple, more.data[: recipe["sequences"]["hotpotqa_more"] - n_gen]))
    assert not extra_ids & set(map(tuple, base.data + base.validation))
    capsys.readouterr()
    assert train.main(tiny_args(tmp_path / "c", "extra_sources=[squad]")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "distinct names" in err and not (tmp_path / "c").exists()


def test_generated_continuations_copied_from_another_run(tmp_path, capsys):
    """A generated.json copied from a run of the same recipe is reused (the copy is how a longer run
    skips re-decoding continuations it shares); one made from other prompts is refused in one line."""
    first = tmp_path / "first"
    assert train.main(tiny_args(first)) == 0
    same = tmp_path / "same"
    same.mkdir()
    (same / "generated.json").write_text((first / "generated.json").read_text())
    trainer = train.Trainer(train.parse(tiny_args(same)))
    trainer.resume()
    trainer.prepare_data()
    assert trainer.generated == train.load_sequences(first / "generated.json")
    other = tmp_path / "other"
    other.mkdir()
    (other / "generated.json").write_text((first / "generated.json").read_text())
    capsys.readouterr()
    assert train.main(tiny_args(other, "seed=5")) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not continue this run's prompt 0" in err


def test_a_time_limited_invocation_continues_to_the_same_weights(tmp_path, capsys):
    """max_minutes stops after the optimizer step that passes it, saves, exports a draft marked unfinished;
    the same command without the limit continues to an uninterrupted run's weights (the limit is not
    part of the run's identity). Continuations decoded in batches are the run's generated sequences."""
    args = ("continuations=batched", "gen_batch=3")
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    assert train.main(tiny_args(whole, *args)) == 0
    assert len(train.load_sequences(whole / "generated.json")) == 2
    assert train.main(tiny_args(cut, *args, "max_minutes=1e-9")) == 0
    assert "reached at optimizer step 1 of 4" in capsys.readouterr().err
    summary = json.loads((cut / "draft" / "training.json").read_text())
    assert summary["optimizer_steps"] == 1 and summary["finished"] is False
    assert train.main(tiny_args(cut, *args)) == 0
    a = torch.load(whole / "state.pt", weights_only=False)
    b = torch.load(cut / "state.pt", weights_only=False)
    for key in a["draft"]:
        torch.testing.assert_close(a["draft"][key], b["draft"][key], rtol=0, atol=0)
    assert json.loads((cut / "draft" / "training.json").read_text())["finished"] is True
