"""Does TriForce's retrieval cache keep the needle? A probe on the RULER-style needle prompts.

    python -m research.probes.probe_retrieval_needle [--samples 6] [--budget-frac 0.04] [--chunk 8]
        [--model smollm2-135m | qwen25-coder-0.5b]

TriForce builds its retrieval cache once, from the query of the LAST prompt token (seed-specs §2.2).
Its needle claim (acceptance 0.98 vs StreamingLLM's 0.05) rests on that query attending to the
needle. Per needle prompt and per (layer, KV head), this prints whether a token of the needle's
value is among what each choice keeps, with the same budget B (a fraction of prompt + 64 new tokens,
as `experiment=triforce_table1_cpu`):

- `retrieval logit` / `retrieval prob`: the chunks `kv=retrieval` keeps (its two GQA scorings);
- `last query top-B`: the B keys the last prompt query attends to most (exact attention, the group's
  mean softmax): what any policy built from that query could keep at best;
- `answer query top-B`: the same for the query of the dense decoding step that writes the value
  (greedy, up to 32 tokens; `-` when the model never writes it): what the Top-K oracle sees.

The shares are hardware-independent; the numbers only depend on the model and the prompts.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from core.attention import CausalView
from core.engine import Engine
from core.models import PACKAGED_GGUF, load_model
from kv_policies.retrieval import Retrieval

REPO = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = "smollm2-135m"


def value_span(tokenizer, ids: list[int], value: str) -> list[int]:
    """Token positions of `value` in the prompt `ids` (from the tokenizer's character offsets)."""
    text = tokenizer.decode(ids)
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    lo = text.find(value)
    if lo < 0 or enc["input_ids"] != ids:
        raise SystemExit(f"error: cannot locate the needle value {value!r} in the prompt's tokens")
    hi = lo + len(value)
    return [i for i, (a, b) in enumerate(enc["offset_mapping"]) if a < hi and b > lo]


def top_keys(q: torch.Tensor, k: torch.Tensor, budget: int, scale: float) -> torch.Tensor:
    """bool `[n_kv_heads, L]`: per KV head the `budget` keys with the largest mean softmax over the
    group's query heads (`q [n_heads, d]`, `k [n_kv_heads, L, d]`)."""
    hkv, length, d = k.shape
    probs = (q.float().reshape(hkv, -1, d) @ k.float().transpose(1, 2) * scale).softmax(-1).mean(1)
    keep = torch.zeros(hkv, length, dtype=torch.bool)
    return keep.scatter_(1, probs.topk(min(budget, length), dim=-1).indices, True)


def share(masks: dict[int, torch.Tensor], span: list[int]) -> tuple[int, int]:
    """(layer-heads whose mask keeps a token of `span`, layer-heads)."""
    hits = sum(int(m[:, span].any(dim=1).sum()) for m in masks.values())
    return hits, sum(m.shape[0] for m in masks.values())


@torch.inference_mode()
def probe(eng: Engine, tokenizer, ids: list[int], value: str, budget: int, chunk: int) -> dict[str, str]:
    span = value_span(tokenizer, ids, value)
    length = len(ids)
    last: dict[int, torch.Tensor] = {}

    def keep_last(layer: int, q: torch.Tensor, k_all: torch.Tensor, cache_len: int) -> None:
        row = length - 1 - cache_len
        if 0 <= row < q.shape[1]:
            last[layer] = q[:, row].clone()

    eng.reset(length + 40)
    logits = eng.prefill(ids, hooks=[keep_last])
    keys = {layer: eng.cache.k[layer, :, :length] for layer in last}
    out: dict[str, str] = {}
    for mode in ("logit", "prob"):
        pol = Retrieval(budget=budget, chunk=chunk, gqa_score=mode)
        hits, n = share({layer: pol.choose(last[layer], keys[layer]) for layer in last}, span)
        out[f"retrieval {mode}"] = f"{hits}/{n}"
    hits, n = share({layer: top_keys(last[layer], keys[layer], budget, eng.scale) for layer in last}, span)
    out["last query top-B"] = f"{hits}/{n}"
    out["answer query top-B"] = "-"
    step_q: dict[int, torch.Tensor] = {}

    def keep_row(layer: int, q: torch.Tensor, k_all: torch.Tensor, cache_len: int) -> None:
        step_q[layer] = q[:, -1].clone()

    token, pos, view = int(logits.argmax()), length, CausalView(eng.scale)
    generated, answer_q = [token], last  # the query that wrote the latest generated token
    for _ in range(32):
        if value[:3] in tokenizer.decode(generated):  # that query wrote the start of the value
            hits, n = share(
                {la: top_keys(q, keys[la], budget, eng.scale) for la, q in answer_q.items()}, span
            )
            out["answer query top-B"] = f"{hits}/{n}"
            break
        step_q.clear()
        logits = eng.step(torch.tensor([token]), torch.tensor([pos]), view, hooks=[keep_row])
        eng.commit([0])
        answer_q = dict(step_q)
        token, pos = int(logits[0].argmax()), pos + 1
        generated.append(token)
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=6)
    ap.add_argument("--budget-frac", type=float, default=0.04)
    ap.add_argument("--chunk", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(PACKAGED_GGUF), help="a packaged model")
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.samples <= 0 or not 0 < args.budget_frac < 1 or args.chunk <= 0:
        raise SystemExit("error: --samples and --chunk must be positive and --budget-frac in (0, 1)")
    torch.set_num_threads(args.threads)
    lm = load_model("packaged", args.model, dtype="float32", device="cpu")
    eng = Engine(lm.model)
    task = instantiate(
        OmegaConf.load(REPO / "conf" / "task" / "longbench_ruler_niah.yaml"), limit=args.samples
    )
    print(
        f"# probe_retrieval_needle: {args.model} fp32 ({eng.cache.n_layers} layers x "
        f"{eng.cache.n_kv_heads} KV heads), {args.samples} needle prompts, budget "
        f"{args.budget_frac:.0%} of prompt + 64, chunk {args.chunk}\n"
    )
    print("(layer, KV head) pairs whose kept set holds a token of the needle's value:\n")
    cols = ["retrieval logit", "retrieval prob", "last query top-B", "answer query top-B"]
    print("| prompt | tokens | budget | " + " | ".join(cols) + " |")
    print("|---|---:|---:|" + "---:|" * len(cols))
    for s in task.load():
        ids = task.prompt_ids(s, 0, [], lm.tokenizer)
        ref = s.reference.get("answers", s.reference) if isinstance(s.reference, dict) else s.reference
        value = str(ref[0] if isinstance(ref, (list, tuple)) else ref)
        budget = max(2 * args.chunk, int(args.budget_frac * (len(ids) + 64)) // args.chunk * args.chunk)
        row = probe(eng, lm.tokenizer, ids, value, budget, args.chunk)
        print(f"| {s.sample_id} | {len(ids)} | {budget} | " + " | ".join(row[c] for c in cols) + " |")


def output_name(argv: list[str]) -> str:
    """The committed output's name: one file per model (the default model keeps the plain name)."""
    model = build_parser().parse_known_args(argv)[0].model
    return "probe_retrieval_needle" + ("" if model == DEFAULT_MODEL else f"-{model}")


if __name__ == "__main__":
    import sys

    from benchmarks.output import recorded

    with recorded(output_name(sys.argv[1:]), module="research.probes.probe_retrieval_needle"):
        main()
