"""The LongSpec authors' released drafts (`sail/longspec-*` on the Hugging Face hub) as `LongSpecDraft`s.

    # target lmsys/vicuna-7b-v1.5-16k (model=hf model.name=lmsys/vicuna-7b-v1.5-16k):
    python run.py decoder=longspec decoder.checkpoint=sail/longspec-vicuna-7b-v1.5-16k

Verified by reading sail-sg/LongSpec at commit 15e499898f40f6891c08828d0bf2bd9ecdf9c08a (its code is
not copied here):
- longspec/test/llama_glide.py and longspec/test/qwen2_glide.py (identical apart from the Llama/Qwen2
  classes; longspec/train/models/{llama,qwen2}_glide.py define the same modules): the draft is
  `LlamaGlideDecoderLayer` / `Qwen2GlideDecoderLayer`, a `PreTrainedModel` built from the TARGET's config
  and loaded with `from_pretrained(glide_path)` (`LlamaGlide.__init__`), so a released folder holds the
  target's config.json (`architectures: [<that class>]`) and save_pretrained weights. Its modules:
  `self_attn` and `cross_attn` (both `GlideAttention`: q/k/v `nn.Linear(bias=True)`, o `bias=False`,
  head_dim = hidden_size // num_attention_heads), `mlp` (the target family's MLP: gate/up/down, no bias),
  `input_layernorm`, `post_self_attention_layernorm`, `post_cross_attention_layernorm` (RMSNorm). The
  rotary module inside `GlideAttention` has no persistent weights (its inv_freq is a non-persistent
  buffer in transformers 4.46.3, the repo's pinned version); such a key is ignored if present.
- `LlamaGlideDecoderLayer.forward`: h1 = h0 + self_attn(input_layernorm(h0)); h2 = h1 +
  cross_attn(post_self_attention_layernorm(h1)); h3 = h2 + mlp(post_cross_attention_layernorm(h2)),
  h0 = the target's embedding; `LlamaGlide.forward`/`tree_spec_generate` take logits = lm_head(h3) with
  NO norm in between (the draft has no final norm).
- `GlideAttention` as cross-attention (`flash_glide_cross_attn_training`, `decoding`/`tree_decoding`
  with the target's cache passed in): only q_proj (with its bias) and o_proj are used; keys/values are
  the target's cached post-RoPE K/V (longspec/test/llama.py stores `K_Cache` after
  `apply_rotary_pos_emb`) of `self.model.layers[-1]`, the LAST layer, all committed entries (tree
  drafting: non-causal over `target_cache_lens_for_draft`), queries rotated at their positions with the
  target's rotary embedding. So `cross_attn.k_proj`/`v_proj` (weights and biases) are in the checkpoint
  but never used: they are dropped here, as our draft reads the target's cache directly.
- Self-attention: flash-attn `window_size=(512, -1)`: a query at position p sees p-512..p.
- The trainer (longspec/train/trainer_base_ds_mul_fs_tp.py `save_model`) writes the draft's state dict,
  `draft_model.` prefix stripped, as `draft_model_weights.pth` (no config.json: the target's config is
  the draft's).

Mapping (released name -> ours; shapes: H heads, K KV heads, d = hidden/H, D hidden, I intermediate):
    input_layernorm.weight [D]                  -> self_norm.weight
    self_attn.{q,k,v}_proj.{weight,bias}        -> {q,k,v}_proj.{weight,bias}   [H*d|K*d, D], [H*d|K*d]
    self_attn.o_proj.weight [D, H*d]            -> o_proj.weight
    post_self_attention_layernorm.weight        -> cross_norm.weight
    cross_attn.q_proj.{weight,bias}             -> cross_q_proj.{weight,bias}
    cross_attn.o_proj.weight                    -> cross_o_proj.weight
    cross_attn.{k,v}_proj.{weight,bias}         -> (unused by the reference: dropped)
    post_cross_attention_layernorm.weight       -> mlp_norm.weight
    mlp.{gate,up,down}_proj.weight              -> {gate,up,down}_proj.weight
    (none)                                      -> final_norm = identity (`DraftConfig.final_norm=False`)
with `DraftConfig.qkv_bias=True`, target_layer = the target's last layer, window = 512.

Differences that remain (neither affects losslessness: the target verifies every token):
- Window edge: our draft's queries see the last `window` committed tokens plus their block ancestors.
  The reference's root query sees exactly the same keys; its tree queries (flash_attn_with_kvcache,
  window (512, -1), n queries aligned at the cache's end) see up to n older committed entries more.
- Precision: the reference runs fp16 with flash-attn; we run the engine's dtype with our attention.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from core.engine import Engine
from core.types import HarnessError
from decoders.longspec.draft import DraftConfig, LongSpecDraft, check_window
from tasks.hub import hub_reachable

HUB_PREFIX = "sail/"  # the authors' hub organisation
REFERENCE = "sail-sg/LongSpec@15e499898f40f6891c08828d0bf2bd9ecdf9c08a"
SAIL_WINDOW = 512  # flash-attn window_size=(512, -1) in GlideAttention
CONFIG = "config.json"
TRAINER_WEIGHTS = "draft_model_weights.pth"  # the reference trainer's output (no config.json beside it)
PREFIXES = ("draft_model.", "glide.", "model.")  # wrappers' prefixes, stripped when every key has one

NAMES = {  # released name -> our LongSpecDraft state_dict name
    "input_layernorm.weight": "self_norm.weight",
    **{f"self_attn.{p}_proj.{t}": f"{p}_proj.{t}" for p in "qkv" for t in ("weight", "bias")},
    "self_attn.o_proj.weight": "o_proj.weight",
    "post_self_attention_layernorm.weight": "cross_norm.weight",
    "cross_attn.q_proj.weight": "cross_q_proj.weight",
    "cross_attn.q_proj.bias": "cross_q_proj.bias",
    "cross_attn.o_proj.weight": "cross_o_proj.weight",
    "post_cross_attention_layernorm.weight": "mlp_norm.weight",
    **{f"mlp.{p}_proj.weight": f"{p}_proj.weight" for p in ("gate", "up", "down")},
}
UNUSED = tuple(f"cross_attn.{p}_proj.{t}" for p in "kv" for t in ("weight", "bias"))


def released_arch(config: Mapping[str, Any]) -> bool:
    archs = config.get("architectures") or []
    return any(str(a).endswith("GlideDecoderLayer") for a in archs)


def is_sail_folder(folder: Path) -> bool:
    """A folder holding a released LongSpec draft: its config.json names a `*GlideDecoderLayer`
    architecture, or it is the reference trainer's output (`draft_model_weights.pth`, no config.json)."""
    if (folder / CONFIG).is_file():
        try:
            return released_arch(json.loads((folder / CONFIG).read_text()))
        except (ValueError, AttributeError):
            return False
    return (folder / TRAINER_WEIGHTS).is_file()


def is_sail(checkpoint: object) -> bool:
    """`decoder.checkpoint` names a released draft: a `sail/...` hub id, or a local folder of one."""
    text = str(checkpoint)
    folder = Path(text).expanduser()
    if folder.is_dir():
        return is_sail_folder(folder)
    return text.startswith(HUB_PREFIX)


def expected_shapes(c: DraftConfig) -> dict[str, tuple[int, ...]]:
    """Our state_dict's shapes for config `c` (with qkv_bias=True, final_norm=False)."""
    hid, q, kv, inter = c.hidden_size, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.intermediate_size
    return {
        "self_norm.weight": (hid,), "cross_norm.weight": (hid,), "mlp_norm.weight": (hid,),
        "q_proj.weight": (q, hid), "q_proj.bias": (q,), "k_proj.weight": (kv, hid), "k_proj.bias": (kv,),
        "v_proj.weight": (kv, hid), "v_proj.bias": (kv,), "o_proj.weight": (hid, q),
        "cross_q_proj.weight": (q, hid), "cross_q_proj.bias": (q,), "cross_o_proj.weight": (hid, q),
        "gate_proj.weight": (inter, hid), "up_proj.weight": (inter, hid), "down_proj.weight": (hid, inter),
    }  # fmt: skip


def sail_config(
    released: Mapping[str, Any], engine: Engine, where: str, window: int | None = None
) -> DraftConfig:
    """Our `DraftConfig` for a released draft whose config.json (the target's own config) is `released`,
    checked against `engine`'s model."""

    def get(key: str) -> Any:
        if key not in released:
            raise HarnessError(f"released LongSpec draft {where}: its {CONFIG} lacks {key!r}")
        return released[key]

    hidden, heads = int(get("hidden_size")), int(get("num_attention_heads"))
    if hidden % heads:
        raise HarnessError(
            f"released LongSpec draft {where}: hidden_size {hidden} is not a multiple of "
            f"num_attention_heads {heads} (its attention needs head_dim = hidden_size // heads)"
        )
    if released.get("mlp_bias"):
        raise HarnessError(f"released LongSpec draft {where}: mlp_bias=true is not supported (ours has none)")
    target = engine.model.config
    for key in ("num_hidden_layers", "hidden_act"):  # the block reads the LAST layer; the MLP is the target's
        mine, theirs = released.get(key), getattr(target, key, None)
        if mine is not None and theirs is not None and mine != theirs:
            raise HarnessError(
                f"released LongSpec draft {where} was released for another target: its {key} is {mine!r}, "
                f"the target's is {theirs!r}"
            )
    config = DraftConfig(
        vocab_size=int(get("vocab_size")),
        hidden_size=hidden,
        n_heads=heads,
        n_kv_heads=int(released.get("num_key_value_heads") or heads),
        head_dim=hidden // heads,
        intermediate_size=int(get("intermediate_size")),
        target_model=str(released.get("_name_or_path") or where),
        target_layer=engine.w.n_layers - 1,  # the reference reads self.model.layers[-1]
        window=SAIL_WINDOW if window is None else check_window(window),
        rms_norm_eps=float(released.get("rms_norm_eps", 1e-6)),
        qkv_bias=True,
        final_norm=False,
    )
    config.check_target(engine, where)
    return config


def convert_sail(
    state: Mapping[str, torch.Tensor],
    released: Mapping[str, Any],
    engine: Engine,
    where: str,
    window: int | None = None,
) -> tuple[dict[str, torch.Tensor], DraftConfig]:
    """A released draft's state dict (released names) as our `LongSpecDraft` state dict, and its
    `DraftConfig`; any missing, unexpected or mis-shaped tensor is one `HarnessError` line."""
    config = sail_config(released, engine, where, window)
    keys = list(state)
    for prefix in PREFIXES:
        if keys and all(k.startswith(prefix) for k in keys):
            keys = [k[len(prefix) :] for k in keys]
            state = {k[len(prefix) :]: v for k, v in state.items()}
            break
    ignored = (*NAMES, *UNUSED)
    unexpected = [k for k in keys if k not in ignored and not k.endswith("rotary_emb.inv_freq")]
    if unexpected:
        raise HarnessError(
            f"released LongSpec draft {where}: unexpected tensor {unexpected[0]!r} (not in the released "
            f"architecture, {REFERENCE}; {len(unexpected)} unexpected in all)"
        )
    missing = [k for k in NAMES if k not in state]
    if missing:
        raise HarnessError(
            f"released LongSpec draft {where}: tensor {missing[0]!r} is missing "
            f"({len(missing)} missing in all)"
        )
    shapes = expected_shapes(config)
    ours: dict[str, torch.Tensor] = {}
    for theirs, mine in NAMES.items():
        tensor = state[theirs]
        if tuple(tensor.shape) != shapes[mine]:
            raise HarnessError(
                f"released LongSpec draft {where}: {theirs} has shape {tuple(tensor.shape)}, the target "
                f"({config.target_model}) needs {shapes[mine]}"
            )
        ours[mine] = tensor
    return ours, config


def _download(repo_id: str) -> Path:
    """A local snapshot of hub repo `repo_id` (config + weights only), or one `HarnessError` line."""
    offline = not hub_reachable()
    try:
        from huggingface_hub import snapshot_download

        def get(patterns: list[str]) -> Path:
            return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=offline))

        folder = get([CONFIG, "*.safetensors*"])
        if not any(folder.glob("*.safetensors")):  # an older upload: pytorch .bin / .pth weights
            folder = get([CONFIG, "*.bin", "*.bin.index.json", "*.pth"])
    except Exception as exc:  # every hub failure maps to one user-facing line
        why = "hub unreachable or HF_HUB_OFFLINE set, and no cached copy" if offline else "download failed"
        reason = f"{exc.__class__.__name__}: " + (str(exc).splitlines() or [""])[0][:120]
        raise HarnessError(
            f"decoder=longspec: cannot get the released draft {repo_id} from the Hugging Face hub ({why}; "
            f"{reason}): run `hf download {repo_id} --local-dir <folder>` where there is network and pass "
            "decoder.checkpoint=<folder>"
        ) from None
    return folder


def _read_weights(folder: Path, where: str) -> dict[str, torch.Tensor]:
    """The state dict in `folder`: model.safetensors (or its shards), pytorch_model.bin (or its shards),
    or the reference trainer's draft_model_weights.pth."""
    from safetensors.torch import load_file

    def safetensors(path: Path) -> dict[str, torch.Tensor]:
        return load_file(str(path))

    def pickled(path: Path) -> dict[str, torch.Tensor]:
        return torch.load(path, map_location="cpu", weights_only=True)

    single = [("model.safetensors", safetensors), ("pytorch_model.bin", pickled), (TRAINER_WEIGHTS, pickled)]
    sharded = [("model.safetensors.index.json", safetensors), ("pytorch_model.bin.index.json", pickled)]
    try:
        for name, load in single:
            if (folder / name).is_file():
                return dict(load(folder / name))
        for name, load in sharded:
            if (folder / name).is_file():
                state: dict[str, torch.Tensor] = {}
                for shard in sorted(set(json.loads((folder / name).read_text())["weight_map"].values())):
                    state.update(load(folder / shard))
                return state
    except Exception as exc:  # unreadable or truncated weights: one line
        raise HarnessError(
            f"released LongSpec draft {where}: unreadable weights ({exc.__class__.__name__}: "
            + (str(exc).splitlines() or [""])[0][:120]
            + ")"
        ) from None
    raise HarnessError(
        f"released LongSpec draft {where}: no weights in {folder} (model.safetensors, pytorch_model.bin "
        f"or {TRAINER_WEIGHTS})"
    )


def load_sail(checkpoint: str | Path, engine: Engine, window: int | None = None) -> LongSpecDraft:
    """The released draft at `checkpoint` (a local folder, or a hub id such as
    sail/longspec-vicuna-7b-v1.5-16k) as a `LongSpecDraft` for `engine`'s model (`window` overrides 512)."""
    where = str(checkpoint)
    folder = Path(where).expanduser()
    if not folder.is_dir():
        if where.startswith(("/", ".", "~")) or where.count("/") != 1:
            raise HarnessError(f"released LongSpec draft {where}: no such folder (and not a hub id)")
        folder = _download(where)
    if (folder / CONFIG).is_file():
        try:
            released = json.loads((folder / CONFIG).read_text())
        except ValueError as exc:
            raise HarnessError(f"released LongSpec draft {where}: unreadable {CONFIG} ({exc})") from None
    else:  # the trainer's output: the draft was built from the target's own config
        released = engine.model.config.to_dict()
    state = _read_weights(folder, where)
    ours, config = convert_sail(state, released, engine, where, window)
    draft = LongSpecDraft(config, engine, f"{where} (released LongSpec draft)")
    if set(draft.state_dict()) != set(ours):  # our module and `expected_shapes` disagree: a bug here
        raise RuntimeError(f"longspec_sail: mapping out of date with LongSpecDraft ({sorted(ours)})")
    draft.load_state_dict({k: v.to(device=engine.device, dtype=engine.dtype) for k, v in ours.items()})
    return draft
