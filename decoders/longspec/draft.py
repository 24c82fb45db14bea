"""LongSpec's draft model (LongSpec Sec. 3.1): one transformer block on top of the
target's frozen embedding and LM head, reading the target's KV cache.

    h0 = Emb_target(x)
    h1 = h0 + SelfAttn(Norm(h0))        causal over the draft's own window cache + the block; RoPE with
                                        the target's settings (its own rotary embedding, positions absolute)
    h2 = h1 + CrossAttn(Norm(h1); K_T, V_T)   K_T/V_T: the target's cached (post-RoPE) keys/values of
                                        layer `target_layer`, committed entries only; queries rotated at
                                        their absolute positions; the target's KV heads (GQA)
    h3 = h2 + MLP(Norm(h2))             gated (the target's activation)
    logits = LMHead_target(Norm(h3))

Only the block's weights are the draft's (`state_dict()`): the embedding and LM head are the target's,
shared, never saved. Heads, KV heads and head_dim are the target's (the cross-attention reads its cache).

Window cache (constant memory): the keys/values of the last `window` committed tokens, `[H_kv, window,
d]` allocated once. In a one-block draft a token's self-attention K/V depend only on the token and its
position (h0 is the embedding), so committed tokens' K/V are computed directly from them, with no
context (`commit`). Every block query sees the whole window cache plus what its visibility allows in
the block (the paper's sliding window: the query at position p sees the window's `window` committed
tokens and its own ancestors, a few more than a strict `window` keys; stated here as our choice).

Block protocol (mirrors the target's `Engine.step`): `begin_block()`, then `step(tokens, positions,
visible, target_len)` any number of times: each call's rows are appended to the staged block and
attend with `visible` `[n, cached + staged + n]` over [window cache | block so far]. The staged block is
forgotten at the next `begin_block()`; the window only changes on `start` / `commit`.

Restricted draft vocabulary (`restrict_vocab`, our CPU option, not the paper's; the idea of FR-Spec,
Zhao et al. 2025): the draft's logits cover only the `size` tokens most frequent in its training data
(`token_counts.safetensors`, written by `training.longspec`), so its LM-head GEMM, softmax and top-k
shrink by vocab/size. It only narrows what the draft can propose: the target still verifies every token.

Checkpoints: a folder with `model.safetensors` (the block's weights) and `config.json` (`DraftConfig`),
optionally `token_counts.safetensors` (`counts`: how often each token id occurs in the training data).
Two config options (their defaults give the block above) serve the LongSpec authors' released drafts
(`decoders.longspec.sail`): `qkv_bias=True` (biases on q/k/v and the cross-attention's q projection)
and `final_norm=False` (logits = LMHead(h3), no norm in between).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from core.attention import one_row_attention, sdpa
from core.engine import Engine, _rotate_half
from core.hf_compat import rope_cos_sin
from core.types import HarnessError
from decoders.longspec.draft_config import (
    CONFIG,
    COUNTS,
    DEFAULT_WINDOW,
    WEIGHTS,
    DraftConfig,
    check_window,
    resolve_layer,
    target_name,
    weights_digest,
)
from decoders.longspec.static_draft import StaticDraftForwards, commit_fits
from decoders.longspec.tree import DraftedTree, TreeDraft

__all__ = [  # the checkpoint's identity, re-exported where the draft's users import it
    "CONFIG",
    "COUNTS",
    "DEFAULT_WINDOW",
    "WEIGHTS",
    "DraftConfig",
    "LongSpecDraft",
    "check_window",
    "resolve_layer",
    "target_name",
    "weights_digest",
]


class RMSNorm(torch.nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class LongSpecDraft(TreeDraft, torch.nn.Module):
    def __init__(self, config: DraftConfig, engine: Engine, label: str) -> None:
        super().__init__()
        c = config
        config.check_target(engine, label)
        self.config, self.engine, self.label = c, engine, label
        self.target_layer, self.window = c.target_layer, c.window
        hid, q_size, kv_size = c.hidden_size, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim

        def lin(n_out: int, n_in: int, bias: bool = False) -> torch.nn.Linear:
            return torch.nn.Linear(n_in, n_out, bias=bias)

        bias = c.qkv_bias
        self.self_norm = RMSNorm(hid, c.rms_norm_eps)
        self.q_proj, self.k_proj = lin(q_size, hid, bias), lin(kv_size, hid, bias)
        self.v_proj = lin(kv_size, hid, bias)
        self.o_proj = lin(hid, q_size)
        self.cross_norm = RMSNorm(hid, c.rms_norm_eps)
        self.cross_q_proj, self.cross_o_proj = lin(q_size, hid, bias), lin(hid, q_size)
        self.mlp_norm = RMSNorm(hid, c.rms_norm_eps)
        self.gate_proj, self.up_proj = lin(c.intermediate_size, hid), lin(c.intermediate_size, hid)
        self.down_proj = lin(hid, c.intermediate_size)
        self.final_norm = RMSNorm(hid, c.rms_norm_eps) if c.final_norm else torch.nn.Identity()
        self.to(device=engine.device, dtype=engine.dtype)
        self.requires_grad_(False)
        shape = (c.n_kv_heads, c.window, c.head_dim)
        self.win_k = torch.zeros(shape, dtype=engine.dtype, device=engine.device)
        self.win_v = torch.zeros(shape, dtype=engine.dtype, device=engine.device)
        self.cached = 0  # committed tokens in the window cache (<= window)
        self.token_counts: torch.Tensor | None = None  # `[vocab]` training-data counts, if saved
        self.vocab_ids: torch.Tensor | None = None  # the restricted vocabulary (None: the whole one)
        self._head: Callable[[torch.Tensor], torch.Tensor] | None = None
        self._packed: dict[str, tuple[tuple[int, int], Callable[[torch.Tensor], torch.Tensor]]] = {}
        # the staged block's K/V `[H_kv, slots, d]`, grown on demand and kept between blocks
        self.block_k = torch.zeros(c.n_kv_heads, 0, c.head_dim, dtype=engine.dtype, device=engine.device)
        self.block_v = torch.zeros_like(self.block_k)
        self.static: StaticDraftForwards | None = None  # fixed-shape steps, while the target has graphs
        self.fixed_shape_steps = 0  # draft forwards that took them or would (runners.timing.DraftClock)
        self.begin_block()

    # --- construction ---------------------------------------------------------------------------
    @classmethod
    def init_for(
        cls, engine: Engine, target_layer: int = -1, window: int = DEFAULT_WINDOW, seed: int = 0
    ) -> LongSpecDraft:
        """An untrained draft for `engine`'s model, random-initialised deterministically from `seed`
        (normal(0, 0.02) projections, unit norms)."""
        config = DraftConfig.for_target(engine, target_layer, window)
        draft = cls(config, engine, "untrained random draft: lossless, tau near 1")
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in draft.named_parameters():
                if not name.endswith("norm.weight"):
                    p.copy_(torch.randn(p.shape, generator=gen) * 0.02)
        return draft

    @classmethod
    def init_from_layer(
        cls, engine: Engine, target_layer: int = -1, window: int = DEFAULT_WINDOW, source_layer: int = -1
    ) -> LongSpecDraft:
        """A draft whose block starts as a copy of the target's layer `source_layer` (our choice of
        initialisation, not the paper's, which does not say): self-attention and MLP from that layer,
        the cross-attention's query/output projections from its attention too, the final norm from the
        target's. Training then starts from a block that already maps the target's hidden space."""
        config = DraftConfig.for_target(engine, target_layer, window)
        source = resolve_layer(source_layer, engine.w.n_layers)
        draft = cls(config, engine, f"untrained draft initialised from target layer {source}")
        layer, c = engine.w.layers[source], config
        q_size, kv_size = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        wq, wk, wv = layer.wqkv.split([q_size, kv_size, kv_size])
        gate, up = layer.wgu.chunk(2)
        pairs = {
            "q_proj": wq, "k_proj": wk, "v_proj": wv, "o_proj": layer.wo, "cross_q_proj": wq,
            "cross_o_proj": layer.wo, "gate_proj": gate, "up_proj": up, "down_proj": layer.wdown,
        }  # fmt: skip
        norms = {
            "self_norm": layer.ln1.weight, "cross_norm": layer.ln1.weight,
            "mlp_norm": layer.ln2.weight, "final_norm": engine.w.norm.weight,
        }  # fmt: skip
        with torch.no_grad():
            for name, weight in {**pairs, **norms}.items():
                getattr(draft, name).weight.copy_(weight)
        return draft

    def retarget(self, layer: int, zero_output: bool = False) -> None:
        """Read target layer `layer` from now on (ours: a trained draft moved to another layer). The
        cross-attention (its norm, query and output projections) starts over as a copy of that layer's
        attention, whose cached keys/values it will read; the rest of the block is kept. `zero_output`:
        its output projection starts at zero instead, so the moved draft starts as the draft without
        its cross-attention."""
        c, w = self.config, self.engine.w
        layer = resolve_layer(layer, w.n_layers)
        source, q_size = w.layers[layer], c.n_heads * c.head_dim
        with torch.no_grad():
            self.cross_norm.weight.copy_(source.ln1.weight)
            self.cross_q_proj.weight.copy_(source.wqkv[:q_size])
            if zero_output:
                self.cross_o_proj.weight.zero_()
            else:
                self.cross_o_proj.weight.copy_(source.wo)
            if self.cross_q_proj.bias is not None:  # the released drafts' layout: the layer's bias or none
                self.cross_q_proj.bias.zero_()
                if source.bqkv is not None:
                    self.cross_q_proj.bias.copy_(source.bqkv[:q_size])
        c.target_layer = self.target_layer = layer

    def save(self, path: str | Path, dtype: torch.dtype | None = None) -> None:
        """Write the block's weights (in `dtype`, default their own) and its config to folder `path`."""

        from safetensors.torch import save_file

        folder = Path(path)
        folder.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().to(dtype or v.dtype).contiguous().cpu() for k, v in self.state_dict().items()}
        save_file(state, folder / WEIGHTS)
        (folder / CONFIG).write_text(json.dumps(asdict(self.config), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path, engine: Engine, window: int | None = None) -> LongSpecDraft:
        """The draft saved at `path` for `engine`'s model (`window` overrides the saved window)."""
        from safetensors.torch import load_file

        folder = Path(path)
        if not (folder / WEIGHTS).is_file() or not (folder / CONFIG).is_file():
            raise HarnessError(
                f"no LongSpec draft checkpoint at {folder} (needs {WEIGHTS} and {CONFIG}): pass "
                "a draft folder, or decoder.checkpoint=random for an untrained random draft"
            )
        try:
            config = DraftConfig(**json.loads((folder / CONFIG).read_text()))
        except (TypeError, ValueError) as exc:
            raise HarnessError(f"LongSpec draft {folder}: unreadable {CONFIG} ({exc})") from None
        if window is not None:
            config.window = check_window(window)
        draft = cls(config, engine, f"{folder}@{weights_digest(folder / WEIGHTS)}")
        state = load_file(str(folder / WEIGHTS), device=str(engine.device))
        own = draft.state_dict()
        bad = sorted(set(own) ^ set(state)) or [k for k in own if own[k].shape != state[k].shape]
        if bad:
            raise HarnessError(f"LongSpec draft {folder}: its weights do not fit its config ({bad[0]})")
        draft.load_state_dict({k: v.to(engine.dtype) for k, v in state.items()})
        if (folder / COUNTS).is_file():
            draft.token_counts = load_file(str(folder / COUNTS))["counts"]
            if draft.token_counts.shape != (config.vocab_size,):
                raise HarnessError(f"LongSpec draft {folder}: {COUNTS} does not fit its vocabulary")
        return draft

    def params(self) -> dict:
        return {"label": self.label, "target_layer": self.target_layer, "window": self.window}

    def restrict_vocab(self, size: int | None) -> None:
        """Draft over the `size` most frequent tokens of `token_counts` (ties: the lower id first), or
        the whole vocabulary (None, or a size that covers it); `step` then returns logits over
        `vocab_ids`, in that order."""
        if isinstance(size, bool) or not (size is None or isinstance(size, int) and size > 0):
            raise HarnessError(f"draft_vocab must be a positive integer or null, got {size!r}")
        vocab = self.config.vocab_size
        self.static = None  # captured forwards read the head they were captured with
        if size is None or size >= vocab:
            self.vocab_ids, self._head = None, None
            return
        if self.token_counts is None:
            raise HarnessError(
                f"draft_vocab={size} needs the draft's token counts ({COUNTS}, written by "
                f"training.longspec); the draft {self.label} has none: set draft_vocab=null"
            )
        order = torch.sort(-self.token_counts, stable=True).indices  # most frequent first, ties by id
        ids = order[:size].sort().values.to(self.engine.device)
        head = self.engine.w.lm_head.weight.index_select(0, ids).contiguous()
        self.vocab_ids, self._head = ids, self.engine.linear_for(head)

    def save_counts(self, folder: str | Path, counts: torch.Tensor) -> None:
        """Write `[vocab]` token counts next to the weights (what `restrict_vocab` ranks by)."""
        from safetensors.torch import save_file

        if counts.shape != (self.config.vocab_size,):
            raise ValueError(f"counts must be [{self.config.vocab_size}], got {tuple(counts.shape)}")
        save_file({"counts": counts.to(torch.int64).contiguous().cpu()}, str(Path(folder) / COUNTS))

    def _gemm(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """The projection `name` of `x` `[n, in]`. Under inference mode (drafting) it runs like the target's
        GEMMs (`Engine.linear_for`: prepacked for oneDNN when the engine packs its own; the packed copy
        is made again when the weight changes); with autograd (training) it is the module itself."""
        module = getattr(self, name)
        if not torch.is_inference_mode_enabled():
            return module(x)
        weight = module.weight
        version = (weight.data_ptr(), weight._version)
        packed = self._packed.get(name)
        if packed is None or packed[0] != version:
            packed = (version, self.engine.linear_for(weight))
            self._packed[name] = packed
        y = packed[1](x)
        return y if module.bias is None else y + module.bias

    # --- window cache ---------------------------------------------------------------------------
    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_cos_sin(self.engine.model, positions, self.engine.dtype)

    def _self_kv(self, h0: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """Post-RoPE self-attention keys and values `[H_kv, n, d]` of embedded tokens `h0` `[n, hidden]`."""
        c, n = self.config, h0.shape[0]
        x = self.self_norm(h0)
        k = self._gemm("k_proj", x).view(n, c.n_kv_heads, c.head_dim).transpose(0, 1)
        v = self._gemm("v_proj", x).view(n, c.n_kv_heads, c.head_dim).transpose(0, 1)
        return k * cos + _rotate_half(k) * sin, v

    def start(self, prompt: Sequence[int]) -> None:
        """Empty the window, then commit the prompt (positions 0..) into it."""
        self.cached = 0
        self.begin_block()
        self.commit(prompt, 0, fixed_shape=False)  # one per prompt length: not worth a graph each

    @torch.inference_mode()
    def commit(self, tokens: Sequence[int], first_position: int, fixed_shape: bool = True) -> None:
        """Committed tokens at positions `first_position, ...`: their K/V enter the window (the oldest
        entries leave it once it holds `window`). `fixed_shape=False`: the regular path."""
        tokens = list(tokens)
        first_position += max(0, len(tokens) - self.window)  # only the last `window` can stay
        tokens = tokens[-self.window :]
        m = len(tokens)
        if not m:
            return
        drop = max(0, self.cached + m - self.window)
        keep = self.cached - drop
        fits = fixed_shape and commit_fits(self.window, m, drop)
        self.fixed_shape_steps += fits  # with graphs off: would take the fixed-shape commit
        static = self._static_forwards()
        if static is not None and fits:
            static.commit(tokens, first_position)
            self.cached = keep + m
            return
        dev = self.engine.device
        pos = torch.arange(first_position, first_position + m, device=dev)
        cos, sin = self._rope(pos)
        k, v = self._self_kv(self.engine.w.embed(self.engine.stage(tokens)), cos, sin)
        if drop and keep:
            self.win_k[:, :keep] = self.win_k[:, drop : self.cached].clone()
            self.win_v[:, :keep] = self.win_v[:, drop : self.cached].clone()
        self.win_k[:, keep : keep + m] = k
        self.win_v[:, keep : keep + m] = v
        self.cached = keep + m

    # --- block forwards -------------------------------------------------------------------------
    def begin_block(self) -> None:
        self.staged = 0  # rows of the block staged so far (their K/V in block_k/block_v)

    def reserve_block(self, rows: int) -> None:
        """Room for `rows` staged rows in the block buffers (the staged ones kept)."""
        if self.block_k.shape[1] >= rows:
            return
        c = self.config
        shape = (c.n_kv_heads, max(rows, 2 * self.block_k.shape[1]), c.head_dim)
        for name in ("block_k", "block_v"):
            with torch.inference_mode(False):  # a plain tensor, which training steps may write too
                grown = torch.zeros(shape, dtype=self.engine.dtype, device=self.engine.device)
            grown[:, : self.staged] = getattr(self, name)[:, : self.staged]
            setattr(self, name, grown)

    def _static_forwards(self) -> StaticDraftForwards | None:
        """The fixed-shape forwards while the target engine has its own (`Engine.use_graphs`)."""
        graphs = self.engine.graphs
        if graphs is None:
            return None
        if self.static is None or self.static.capture != graphs.capture:
            self.static = StaticDraftForwards(self, graphs.capture)
        return self.static

    @torch.inference_mode()
    def expand(
        self, tree: DraftedTree, lo: int, hi: int, length: int, depth: int, width: int, temperature: float
    ) -> None:
        """`TreeDraft.expand`, in one fixed-shape forward while the target has graphs."""
        static = self._static_forwards()
        if static is None or length <= 0 or self.staged != lo or tree.size != hi:
            return super().expand(tree, lo, hi, length, depth, width, temperature)
        self.reserve_block(hi)
        self.staged = hi
        self.fixed_shape_steps += 1
        static.expand(tree, lo, hi, length, depth, width, temperature)

    @torch.inference_mode()
    def step(
        self, tokens: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor, target_len: int
    ) -> torch.Tensor:
        """Float logits `[n, vocab]` (`[n, len(vocab_ids)]` when restricted) of query `tokens` at
        absolute `positions`; `visible` `[n, cached +
        staged + n]` (True = may attend) over [window cache | block]; the cross-attention reads the
        target cache's first `target_len` entries of layer `target_layer` (its committed entries)."""
        eng = self.engine
        tokens, positions = tokens.to(eng.device), positions.to(eng.device)
        n, staged = tokens.numel(), self.staged
        keys_len = self.cached + staged + n
        if visible.shape != (n, keys_len):
            raise ValueError(f"visible must be [{n}, {keys_len}], got {tuple(visible.shape)}")
        self.reserve_block(staged + n)
        self.staged = staged + n
        fits = target_len > 0  # a cross-attention over no entry is the regular path's alone
        self.fixed_shape_steps += fits
        static = self._static_forwards()
        if static is not None and fits:
            return static.step(tokens, positions, visible.to(eng.device), target_len, staged)
        cos, sin = self._rope(positions)
        h0 = eng.w.embed(tokens)
        k, v = self._self_kv(h0, cos, sin)
        self.block_k[:, staged : staged + n] = k
        self.block_v[:, staged : staged + n] = v
        keys = torch.cat([self.win_k[:, : self.cached], self.block_k[:, : staged + n]], dim=1)
        values = torch.cat([self.win_v[:, : self.cached], self.block_v[:, : staged + n]], dim=1)
        cross = None
        if target_len > 0:
            cross = (
                eng.cache.k[self.target_layer, :, :target_len],
                eng.cache.v[self.target_layer, :, :target_len],
            )
        h3 = self._hidden(h0, cos, sin, keys, values, visible.to(eng.device), cross, None)
        return self.logits_of(h3)

    def logits_of(self, h3: torch.Tensor) -> torch.Tensor:
        """Float logits of the block's outputs h3 (over `vocab_ids` when restricted)."""
        if self._head is not None:
            return self._head(self.final_norm(h3)).float()
        return self.engine.lm_logits(self.final_norm(h3))  # the target's head, prepacked like the target's

    def _hidden(
        self,
        h0: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        self_mask: torch.Tensor,
        cross: tuple[torch.Tensor, torch.Tensor] | None,
        cross_mask: torch.Tensor | None,
        cross_causal: bool = False,
    ) -> torch.Tensor:
        """The block's output h3 `[n, hidden]` for query rows with embeddings `h0` and RoPE `cos/sin`:
        self-attention over `keys/values` `[H_kv, m, d]` under `self_mask` `[n, m]`, cross-attention over
        the target's `cross` (K, V) under `cross_mask` (or causal), then the MLP. Shared by `step`
        (inference) and `forward_train`, so training optimises exactly the function that drafts."""
        c, eng = self.config, self.engine
        n = h0.shape[0]
        q = self._gemm("q_proj", self.self_norm(h0)).view(n, c.n_heads, c.head_dim).transpose(0, 1)
        q = q * cos + _rotate_half(q) * sin
        o = sdpa(q[None], keys[None], values[None], self_mask, eng.scale)[0]
        h1 = h0 + self._gemm("o_proj", o.transpose(0, 1).reshape(n, -1))
        h2 = h1
        if cross is not None:
            qc = self._gemm("cross_q_proj", self.cross_norm(h1)).view(n, c.n_heads, c.head_dim)
            qc = qc.transpose(0, 1)
            qc = qc * cos + _rotate_half(qc) * sin
            kt, vt = cross
            if n == 1 and cross_mask is None and not cross_causal:  # a chain's draft step: the
                oc = one_row_attention(qc[None], kt[None], vt[None], eng.scale)[0]  # decode path
            else:
                oc = sdpa(qc[None], kt[None], vt[None], cross_mask, eng.scale, is_causal=cross_causal)[0]
            h2 = h1 + self._gemm("cross_o_proj", oc.transpose(0, 1).reshape(n, -1))
        x = self.mlp_norm(h2)
        return h2 + self._gemm("down_proj", eng.w.act(self._gemm("gate_proj", x)) * self._gemm("up_proj", x))

    def forward_train(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        target_k: torch.Tensor,
        target_v: torch.Tensor,
        lag: int,
        cross_window: int | None = None,
    ) -> torch.Tensor:
        """Differentiable logits for a whole training sequence, as drafting would compute them (the
        paper's flash-noisy training): query row t (token t at `positions[t]`) attends to the draft's
        own rows t-window..t and to the target's K/V `[H_kv, S, d]` (layer `target_layer`, computed with the
        same positions) of rows <= t - lag, the view a draft query has `lag` tokens after the last
        verified one. Returns `[S - 1 - lag, vocab]` float logits for rows lag..S-2 (each predicts the
        token after it); rows before `lag` see no target entry and are left out. `cross_window` (an
        ablation, not training): row t sees only the target's last `cross_window` rows t-lag-w+1..t-lag."""
        eng = self.engine
        n_seq = tokens.numel()
        rows = n_seq - 1 - lag
        if lag < 1 or rows < 1:
            raise ValueError(f"lag must be in [1, {n_seq - 2}] for a {n_seq}-token sequence, got {lag}")
        cos, sin = self._rope(positions)
        h0 = eng.w.embed(tokens).detach()
        keys, values = self._self_kv(h0, cos, sin)
        t = torch.arange(lag, n_seq - 1, device=eng.device)
        s = torch.arange(n_seq, device=eng.device)
        gap = t[:, None] - s[None, :]
        self_mask = (gap >= 0) & (gap <= self.window)
        sl = slice(lag, n_seq - 1)
        cross = (target_k[:, :rows], target_v[:, :rows])  # row t sees target rows 0..t-lag: causal
        band = None
        if cross_window is not None:
            if cross_window < 1:
                raise ValueError(f"cross_window must be positive, got {cross_window}")
            back = torch.arange(rows, device=eng.device)
            back = back[:, None] - back[None, :]
            band = (back >= 0) & (back < cross_window)
        h3 = self._hidden(
            h0[sl], cos[sl], sin[sl], keys, values, self_mask, cross, band, cross_causal=band is None
        )
        return eng.w.lm_head(self.final_norm(h3)).float()

    def memory_bytes(self) -> int:
        """Bytes the draft itself holds: its weights, its window cache and the staged block (the
        target's embedding, LM head and KV cache are shared, not counted)."""
        tensors = [*self.parameters(), self.win_k, self.win_v, self.block_k, self.block_v]
        return sum(t.numel() * t.element_size() for t in tensors)
