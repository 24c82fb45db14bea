"""Released LongSpec drafts (decoders/longspec/sail.py): a state dict with the authors' parameter names
and shapes for a tiny random target, written as their checkpoints are (config.json + model.safetensors,
pytorch_model.bin, or the trainer's draft_model_weights.pth), loads through `LongSpec(checkpoint=...)`:
every parameter is the tensor it maps from, the draft computes the released block's function (checked
against a dense re-computation from the released names and the HF model's own cache), greedy output is
vanilla's, and a bad checkpoint is one clear error line."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from core.engine import Engine
from core.types import Counts, HarnessError
from decoders.longspec.decoder import LongSpec
from decoders.longspec.draft import LongSpecDraft, RMSNorm
from decoders.longspec.sail import NAMES, UNUSED, is_sail, load_sail
from decoders.vanilla import Vanilla
from tests.helpers import varied_prompts
from tests.lossless_check import check_lossless

pytestmark = pytest.mark.usefixtures("one_thread")
N_NEW = 24


def released_state(lm, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random tensors under every released name with the released shapes (cross k/v included)."""
    cfg = lm.model.config
    hid, heads, kv_heads = cfg.hidden_size, cfg.num_attention_heads, cfg.num_key_value_heads
    d = hid // heads
    q, kv, inter = heads * d, kv_heads * d, cfg.intermediate_size
    shapes = {
        "input_layernorm.weight": (hid,),
        "post_self_attention_layernorm.weight": (hid,),
        "post_cross_attention_layernorm.weight": (hid,),
        "mlp.gate_proj.weight": (inter, hid),
        "mlp.up_proj.weight": (inter, hid),
        "mlp.down_proj.weight": (hid, inter),
    }
    for attn in ("self_attn", "cross_attn"):
        for p, n in (("q", q), ("k", kv), ("v", kv)):
            shapes[f"{attn}.{p}_proj.weight"] = (n, hid)
            shapes[f"{attn}.{p}_proj.bias"] = (n,)
        shapes[f"{attn}.o_proj.weight"] = (hid, q)
    gen = torch.Generator().manual_seed(seed)
    state = {}
    for name, shape in shapes.items():
        noise = torch.randn(shape, generator=gen)
        # norms near 1, projections large enough that the draft's choices depend on every tensor
        state[name] = 1.0 + 0.1 * noise if name.endswith("layernorm.weight") else 0.2 * noise
    return state


def released_config(lm) -> dict:
    """What save_pretrained writes for the authors' draft: the target's own config, its class named."""
    config = lm.model.config.to_dict()
    arch = "Qwen2GlideDecoderLayer" if config["model_type"] == "qwen2" else "LlamaGlideDecoderLayer"
    return {**config, "architectures": [arch]}


def write_released(folder, lm, state, fmt: str = "safetensors", config: dict | None = None):
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.contiguous() for k, v in state.items()}
    if fmt == "safetensors":
        save_file(state, str(folder / "model.safetensors"))
    elif fmt == "bin":
        torch.save(state, folder / "pytorch_model.bin")
    else:  # the reference trainer's output: no config.json
        torch.save(state, folder / "draft_model_weights.pth")
        return folder
    (folder / "config.json").write_text(json.dumps(config or released_config(lm), indent=2))
    return folder


@pytest.mark.parametrize("fmt", ["safetensors", "bin", "trainer"])
def test_every_parameter_is_the_tensor_it_maps_from(tiny_lm, tmp_path, fmt):
    eng = Engine(tiny_lm.model)
    state = released_state(tiny_lm)
    folder = write_released(tmp_path / "released", tiny_lm, state, fmt)
    assert is_sail(str(folder))
    dec = LongSpec(eng, depth=2, widths=[2, 2], checkpoint=str(folder))
    draft = dec.draft
    ours = draft.state_dict()
    assert set(ours) == set(NAMES.values())  # cross k/v dropped, no final norm
    for theirs, mine in NAMES.items():
        assert torch.equal(ours[mine], state[theirs]), (theirs, mine)
    assert all(k in state for k in UNUSED)
    assert isinstance(draft.final_norm, torch.nn.Identity)
    assert draft.target_layer == eng.w.n_layers - 1 and draft.window == 512
    assert dec.draft.label.endswith("(released LongSpec draft)")
    assert LongSpec(eng, depth=2, widths=[2, 2], checkpoint=str(folder), window=8).draft.window == 8


def test_our_own_checkpoints_are_unchanged(tiny_lm, tmp_path):
    """The options default off: our drafts keep their parameters, final norm and checkpoint format."""
    eng = Engine(tiny_lm.model)
    draft = LongSpecDraft.init_for(eng, window=16)
    assert not any(k.endswith(".bias") for k in draft.state_dict())
    assert isinstance(draft.final_norm, RMSNorm) and "final_norm.weight" in draft.state_dict()
    draft.save(tmp_path / "ours")
    assert not is_sail(str(tmp_path / "ours")) and not is_sail("random") and is_sail("sail/longspec-x")
    back = LongSpecDraft.load(tmp_path / "ours", eng)
    assert all(torch.equal(v, back.state_dict()[k]) for k, v in draft.state_dict().items())


def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q `[H, n, d]` over k/v `[H_kv, m, d]`, no mask."""
    rep = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
    w = torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1)
    return w @ v


def test_draft_computes_the_released_block(tiny_lm, tmp_path):
    """The root query's logits equal the released block recomputed densely from the released tensors:
    self-attention (biased q/k/v) over the prompt and itself, cross-attention (biased q) over the HF
    model's own last-layer cache, the MLP, then the LM head with no final norm."""
    lm, cfg = tiny_lm, tiny_lm.model.config
    eng = Engine(lm.model)
    s = released_state(lm, seed=3)
    dec = LongSpec(eng, depth=1, widths=[1], checkpoint=str(write_released(tmp_path / "r", lm, s)))
    prompt, root = [5, 17, 99, 3, 42, 7, 250, 11], 64
    n_len = len(prompt)
    eng.reset(n_len + 8)
    eng.prefill(prompt)
    dec.draft.start(prompt)
    dec.draft.begin_block()
    got = dec.draft.step(
        torch.tensor([root]), torch.tensor([n_len]), torch.ones(1, n_len + 1, dtype=torch.bool), n_len
    )[0]

    hf = lm.model
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    d, eps = cfg.hidden_size // heads, cfg.rms_norm_eps
    with torch.no_grad():
        ids = torch.tensor([prompt + [root]])
        pos = torch.arange(n_len + 1)[None]
        h0 = hf.model.embed_tokens(ids)[0]
        cos, sin = (t[0] for t in hf.model.rotary_emb(h0[None], pos))
        x = rms(h0, s["input_layernorm.weight"], eps)

        def proj(name, inp, n_heads):
            y = inp @ s[f"{name}.weight"].T + s[f"{name}.bias"]
            return y.view(inp.shape[0], n_heads, d).transpose(0, 1)

        q = rotate(proj("self_attn.q_proj", x, heads), cos, sin)[:, -1:]
        k = rotate(proj("self_attn.k_proj", x, kv_heads), cos, sin)
        v = proj("self_attn.v_proj", x, kv_heads)
        h1 = h0[-1:] + attend(q, k, v).transpose(0, 1).reshape(1, -1) @ s["self_attn.o_proj.weight"].T
        cache = hf(torch.tensor([prompt]), use_cache=True).past_key_values
        kt, vt = cache.layers[-1].keys[0], cache.layers[-1].values[0]  # post-RoPE, [H_kv, L, d]
        qc = proj("cross_attn.q_proj", rms(h1, s["post_self_attention_layernorm.weight"], eps), heads)
        qc = rotate(qc, cos[-1:], sin[-1:])
        h2 = h1 + attend(qc, kt, vt).transpose(0, 1).reshape(1, -1) @ s["cross_attn.o_proj.weight"].T
        xm = rms(h2, s["post_cross_attention_layernorm.weight"], eps)
        mlp = (F.silu(xm @ s["mlp.gate_proj.weight"].T) * (xm @ s["mlp.up_proj.weight"].T)) @ s[
            "mlp.down_proj.weight"
        ].T
        want = hf.lm_head(h2 + mlp)[0].float()
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), float((got - want).abs().max())


@pytest.mark.parametrize("tree,window", [((4, [2, 2, 2, 2]), None), ((5, [4, 16, 16, 16, 16]), 6)])
def test_greedy_equals_vanilla(tiny_lm, tmp_path, tree, window):
    eng = Engine(tiny_lm.model)
    folder = write_released(tmp_path / "r", tiny_lm, released_state(tiny_lm, seed=1))
    depth, widths = tree
    dec = LongSpec(eng, depth=depth, widths=widths, checkpoint=str(folder), window=window)
    for prompt in varied_prompts(3, seed=7):
        ref = Vanilla(eng).generate(prompt, N_NEW, set(), Counts())
        got = dec.generate(prompt, N_NEW, set(), Counts())
        check_lossless(eng, prompt, ref, got)


def one_line_error(fn) -> str:
    with pytest.raises(HarnessError) as err:
        fn()
    msg = str(err.value)
    assert "\n" not in msg and msg
    return msg


def test_bad_released_checkpoint_is_one_error_line(tiny_lm, tmp_path, monkeypatch):
    eng = Engine(tiny_lm.model)
    good = released_state(tiny_lm)

    def load(state=None, config=None, **kw):
        folder = tmp_path / f"c{len(list(tmp_path.iterdir()))}"
        write_released(folder, tiny_lm, good if state is None else state, config=config)
        return lambda: LongSpec(eng, checkpoint=str(folder), **kw)

    wrong = {**good, "mlp.up_proj.weight": good["mlp.up_proj.weight"][:-1]}
    assert "mlp.up_proj.weight has shape" in one_line_error(load(wrong))
    missing = {k: v for k, v in good.items() if k != "cross_attn.q_proj.bias"}
    assert "'cross_attn.q_proj.bias' is missing" in one_line_error(load(missing))
    extra = {**good, "final_norm.weight": good["input_layernorm.weight"].clone()}
    assert "unexpected tensor 'final_norm.weight'" in one_line_error(load(extra))
    other = {**released_config(tiny_lm), "vocab_size": 999}
    assert "vocab_size is 999" in one_line_error(load(config=other))
    deeper = {**released_config(tiny_lm), "num_hidden_layers": 40}
    assert "num_hidden_layers is 40" in one_line_error(load(config=deeper))
    assert "reads target layer" in one_line_error(load(target_layer=0))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text(json.dumps(released_config(tiny_lm)))
    assert "no weights" in one_line_error(lambda: load_sail(tmp_path / "empty", eng))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    msg = one_line_error(lambda: LongSpec(eng, checkpoint="sail/longspec-not-cached"))
    assert "cannot get the released draft sail/longspec-not-cached" in msg and "hf download" in msg
