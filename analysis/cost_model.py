"""What a forward of B query rows over a cache of `ctx` entries costs, and the speedup a run's blocks
predict from it: measured on this device (a cost curve, `benchmarks.block_cost`) or from a roofline
model of a GPU (peak FLOP/s and memory bandwidth).

    python -m analysis.cost_model [--root results] [--curve <block_cost json>]

Predicted speedup of a run = the cost of the 1-row steps vanilla greedy needs for the run's committed
tokens / the cost of the forwards the decoder really ran (its `steps` table: rows and attended
entries per forward). On the measuring device it must match the measured decode speedup: a gap is
time the harness spends outside forwards (decoder bookkeeping, Python). On a roofline GPU it says what
the same blocks would buy where a forward costs its weight and KV reads rather than its FLOPs.

Roofline assumptions (stated, not fitted): a forward reads every weight once and each attended KV
entry once, does 2 FLOPs per weight per row plus 4 * d_attn FLOPs per (row, attended entry) per
layer, and reaches `flops_eff` of peak FLOP/s and `bw_eff` of peak bandwidth; launch overhead is
`overhead_s` per forward (0 = captured with CUDA graphs). Compare its predictions with the papers'
own (tau, block, speedup) pairs (`paper_pairs`) before trusting them.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from analysis.fafo_base import paper_rows
from analysis.load import load_runs, load_table
from analysis.metrics import ENV, baseline_of, paired_speedup, with_env
from core.cost_curve import CostCurve, CostFn, cache_name  # noqa: F401  (re-exported)

BENCH = Path(__file__).resolve().parents[1] / "results" / "bench"


# --- model shapes ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelShape:
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab: int
    tied_embeddings: bool = False

    @property
    def layer_params(self) -> int:
        """Weights of one decoder layer (attention projections + gated MLP; norms ignored)."""
        d, q, kv = self.d_model, self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        return 2 * d * q + 2 * d * kv + 3 * d * self.d_ff

    @property
    def head_params(self) -> int:
        return self.vocab * self.d_model

    def weight_bytes(self, dtype_bytes: int) -> float:
        """Weights a forward reads: every layer and the LM head (the embedding reads a few rows only)."""
        return (self.n_layers * self.layer_params + self.head_params) * dtype_bytes

    def kv_bytes_per_entry(self, dtype_bytes: int) -> float:
        """Bytes of one cached position over all layers (keys and values)."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * dtype_bytes

    def flops(self, rows: int, ctx: float, logits_rows: int = 1) -> float:
        linear = 2 * rows * self.n_layers * self.layer_params + 2 * logits_rows * self.head_params
        attention = 4 * rows * self.n_layers * self.n_heads * self.head_dim * ctx
        return linear + attention

    @classmethod
    def from_hf_config(cls, cfg: object) -> ModelShape:
        heads = int(cfg.num_attention_heads)
        return cls(
            n_layers=int(cfg.num_hidden_layers),
            d_model=int(cfg.hidden_size),
            n_heads=heads,
            n_kv_heads=int(getattr(cfg, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads),
            d_ff=int(cfg.intermediate_size),
            vocab=int(cfg.vocab_size),
            tied_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        )


# the embedded model and the papers' targets (from their HF configs)
SHAPES: dict[str, ModelShape] = {
    "smollm2-135m": ModelShape(30, 576, 9, 3, 64, 1536, 49152, True),
    "llama-2-7b": ModelShape(32, 4096, 32, 32, 128, 11008, 32000),
    "llama-3-8b": ModelShape(32, 4096, 32, 8, 128, 14336, 128256),
}


# --- roofline devices -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Device:
    name: str
    peak_flops: float  # dense fp16/bf16 tensor-core FLOP/s
    bandwidth: float  # HBM bytes/s
    flops_eff: float = 0.6
    bw_eff: float = 0.8
    overhead_s: float = 0.0

    def seconds(self, shape: ModelShape, rows: int, ctx: float, dtype_bytes: int = 2) -> float:
        compute = shape.flops(rows, ctx) / (self.peak_flops * self.flops_eff)
        memory = (shape.weight_bytes(dtype_bytes) + ctx * shape.kv_bytes_per_entry(dtype_bytes)) / (
            self.bandwidth * self.bw_eff
        )
        return max(compute, memory) + self.overhead_s


GPUS: dict[str, Device] = {
    "A100-80GB": Device("A100-80GB", 312e12, 2.039e12),
    "H100-SXM": Device("H100-SXM", 989e12, 3.35e12),
    "H200": Device("H200", 989e12, 4.8e12),
}


# --- a measured cost curve: core.cost_curve (CostCurve, cache_name) ----------------------------


def shape_of(curve: CostCurve) -> ModelShape | None:
    """The measured model's shape, as the curve records it."""
    return ModelShape(**curve.shape) if curve.shape else None  # type: ignore[arg-type]


def committed_curves(bench: Path) -> list[CostCurve]:
    """Every cost curve written beside the benchmark outputs under `bench` (results/bench)."""
    curves = []
    for path in sorted(bench.glob("*/*.json")):
        text = path.read_text()
        if '"contexts"' in text and '"seconds"' in text:
            try:
                curves.append(CostCurve.from_json(text))
            except (ValueError, TypeError):
                continue
    return curves


def curve_for_run(curves: list[CostCurve], run: pd.Series | dict) -> CostCurve | None:
    """The curve measured in a run's environment (device with threads, model, dtype, linear), on graphed
    forwards for a run with `run.cuda_graphs` and on eager ones otherwise."""
    graphed = str(run.get("cuda_graphs", False)).lower() == "true"  # with_env makes it text
    for c in curves:
        k = c.key
        if (
            str(k.get("device")) == str(run.get("device_name"))
            and str(k.get("model")) == str(run.get("model"))
            and str(k.get("dtype")) == str(run.get("dtype"))
            and str(k.get("linear")) == str(run.get("linear"))
            and str(k.get("model_name", run.get("model_name"))) == str(run.get("model_name"))
            and c.graphed == graphed
        ):
            return c
    return None


# --- predicted speedup of a run ------------------------------------------------------------------
def predicted_speedup(
    steps: pd.DataFrame,
    samples: pd.DataFrame,
    cost: CostFn,
    n_layers: int,
    sparse: bool = False,
) -> float:
    """Cost of vanilla's 1-row steps for the committed tokens / cost of the run's own forwards.

    `steps`: one run's steps table (sample_id, turn, step, block_tokens, committed, kv_attended,
    draft, draft_model); `samples`: its samples (sample_id, turn, prompt_tokens). A forward attends the
    whole cache (`sparse=False`: the engine's dense path) or its `kv_attended / n_layers` entries
    (`sparse=True`: backends that skip hidden entries). NaN when a forward's cost is unknown (a
    separate draft model's forwards are not on the target's curve)."""
    if steps.empty:
        return float("nan")
    if "draft_model" in steps.columns and steps["draft_model"].astype(bool).any():
        return float("nan")
    turn = ["sample_id", "turn"]
    prompt = samples.drop_duplicates(turn)[[*turn, "prompt_tokens"]]
    st = steps.sort_values([*turn, "step"]).merge(prompt, on=turn, how="left", validate="many_to_one")
    # tokens committed before each forward of its turn (a separate draft's forwards commit nothing)
    made = st["committed"].where(~st["draft"].astype(bool), 0).astype("int64")
    before = made.groupby([st["sample_id"], st["turn"]], sort=False).cumsum() - made
    ctx = st["prompt_tokens"].astype(float)
    seen = (st["kv_attended"] / n_layers) if sparse else ctx + before
    method = sum(cost(int(b), float(c)) for b, c in zip(st["block_tokens"].to_numpy(), seen.to_numpy()))
    totals = (
        st.assign(made=made)
        .groupby(turn, sort=False)
        .agg(ctx=("prompt_tokens", "first"), made=("made", "sum"))
    )
    vanilla = sum(
        cost(1, float(c) + j)
        for c, n in zip(totals["ctx"].to_numpy(), totals["made"].to_numpy())
        for j in range(n)
    )
    return vanilla / method if method > 0 else float("nan")


def roofline_cost(device: Device, shape: ModelShape, dtype_bytes: int = 2) -> CostFn:
    return lambda rows, ctx: device.seconds(shape, rows, ctx, dtype_bytes)


def paper_pairs() -> pd.DataFrame:
    """The papers' own (tau, rows per forward, speedup) triples this predictor can be checked on:
    FAFO Table 2 (Llama-2-7b-chat, fp16, A100; FAFO k=6 n=40: 1 + 6*40 = 241 stream rows + the
    verification rows of up to 40 candidates of 6 = 481 rows; Lookahead W=G=7, N=5: 1 + 2*(N-1)*7 = 57
    rows) at MT-Bench-sized contexts (~600 entries; FAFO-Stream's stream rows read 760)."""
    out = []
    rows_of = {"FAFO-Stream": 481, "FAFO-Quest": 481, "Lookahead": 57}
    t2 = paper_rows("Table 2")
    t2 = t2[(t2["model"] == "Llama-2-7b-chat") & t2["method"].isin(list(rows_of))]
    for (task, method), cell in t2.groupby(["task", "method"]):
        vals = dict(zip(cell["metric"], cell["value"]))
        if "tau" in vals and "speedup" in vals:
            out.append(
                dict(
                    source="FAFO Table 2",
                    task=task,
                    method=method,
                    rows=rows_of[method],
                    tau=float(vals["tau"]),
                    paper_speedup=float(vals["speedup"]),
                )
            )
    return pd.DataFrame(out)


def check_pairs(
    device: Device, shape: ModelShape, ctx: float = 600.0, eager_ratio: float | None = None
) -> pd.DataFrame:
    """Roofline prediction (tau / cost ratio of the block) beside each paper pair, with the error, against
    a bandwidth-bound vanilla (a one-row step costs the roofline's time). With `eager_ratio` (an eager
    one-row step's time over a graphed one's, measured), also against an eager-like vanilla: each step
    pays a fixed host cost of (eager_ratio - 1) one-row roofline steps, the block and the one row alike,
    so a many-row block costs little more than a one-row step."""
    pairs = paper_pairs()
    if pairs.empty:
        return pairs
    one = device.seconds(shape, 1, ctx)
    block = pd.Series([device.seconds(shape, int(r), ctx) / one for r in pairs["rows"]], index=pairs.index)
    pairs["cost_ratio"] = block
    pairs["predicted"] = pairs["tau"] / pairs["cost_ratio"]
    pairs["error_pct"] = 100 * (pairs["predicted"] / pairs["paper_speedup"] - 1)
    if eager_ratio is not None and eager_ratio >= 1:
        pairs["cost_ratio_eager"] = (block + eager_ratio - 1) / eager_ratio
        pairs["predicted_eager"] = pairs["tau"] / pairs["cost_ratio_eager"]
        pairs["error_pct_eager"] = 100 * (pairs["predicted_eager"] / pairs["paper_speedup"] - 1)
    return pairs


def eager_step_ratio(samples: pd.DataFrame) -> tuple[float, str]:
    """(an eager vanilla step's decode time over a graphed one's, where it was measured): the median
    turn's ms per token of vanilla+full runs of one GPU, model, dtype and task recorded with
    run.cuda_graphs off and on; NaN if none."""
    if samples.empty or "cuda_graphs" not in samples.columns:
        return math.nan, ""
    van = samples[(samples["decoder"] == "vanilla") & (samples["kv"] == "full")]
    van = van[~van["device_name"].astype(str).str.startswith("cpu")]
    for key, group in van.groupby(["device_name", "model", "dtype", "task"], sort=True):
        graphed = group["cuda_graphs"].astype(str) == "True"
        median = {  # the median turn: a slow first turn (warm-up, allocation) is not a step's price
            bool(g): float((part["decode_s"] / part["new_tokens"]).median())
            for g, part in group.groupby(graphed)
        }
        total = {
            bool(g): float(part["decode_s"].sum() / part["new_tokens"].sum())
            for g, part in group.groupby(graphed)
        }
        if len(median) == 2:
            eager_ms, graphed_ms = 1000 * median[False], 1000 * median[True]
            where = (
                f"{key[0]}, {key[1]} {key[2]}, {key[3]}, median turn: eager vanilla {eager_ms:.1f} ms per "
                f"token, graphed {graphed_ms:.1f} ms; over all turns {1000 * total[False]:.1f} and "
                f"{1000 * total[True]:.1f} ms"
            )
            return median[False] / median[True], where
    return math.nan, ""


# --- CLI ----------------------------------------------------------------------------------------
def run_predictions(root: Path, curves: list[CostCurve]) -> pd.DataFrame:
    """Per complete run: measured decode speedup over the vanilla run of its environment, predicted on
    the curve measured in that environment (when one is in `curves`), and on each roofline GPU."""
    runs = load_runs(root)
    if runs.empty:
        return pd.DataFrame()
    samples = with_env(load_table(root, "samples", runs))
    steps = load_table(root, "steps", runs)
    if steps.empty or samples.empty:
        return pd.DataFrame()
    out = []
    for _, group in samples.groupby(ENV, sort=False):
        for run_id, run in group[group["decoder"] != "vanilla"].groupby("run_id"):
            base = baseline_of(group, run)
            first = run.iloc[0]
            curve = curve_for_run(curves, first)
            shape = SHAPES.get(str(first["model"])) or (shape_of(curve) if curve else None)
            backend = first.get("kv.backend")
            sparse = isinstance(backend, str) and backend in ("sliced", "flex", "flash")
            st = steps[steps["run_id"] == run_id]
            fw = run["forwards"].sum()
            row = {
                "run_id": run_id,
                "experiment": first.get("experiment", ""),
                "decoder": first["decoder"],
                "kv": first["kv"],
                "task": first["task"],
                "tau": run["committed"].sum() / fw if fw else math.nan,
                "measured": paired_speedup(run, base)["decode_speedup"],
                "predicted_here": math.nan,
            }
            if curve is not None and shape is not None:
                row["predicted_here"] = predicted_speedup(st, run, curve, shape.n_layers, sparse)
            row["pred_over_measured"] = (
                row["predicted_here"] / row["measured"] if row["measured"] else math.nan
            )
            for name, dev in GPUS.items():
                row[f"roofline_{name}"] = (
                    predicted_speedup(st, run, roofline_cost(dev, shape), shape.n_layers, True)
                    if shape is not None
                    else math.nan
                )
            out.append(row)
    return pd.DataFrame(out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="results", help="folder holding runs/")
    ap.add_argument("--curve", help="a cost curve JSON (default: the curves committed under results/bench/)")
    args = ap.parse_args(argv)
    if args.curve:
        try:
            curves = [CostCurve.from_json(Path(args.curve).read_text())]
        except (OSError, ValueError, TypeError) as exc:
            sys.exit(f"error: cannot read cost curve {args.curve}: {exc}")
    else:
        curves = committed_curves(BENCH)
    if not (Path(args.root) / "runs").is_dir():
        sys.exit(f"error: no records under {args.root}/runs")
    table = run_predictions(Path(args.root), curves)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(table.to_string(index=False, float_format=lambda v: f"{v:.2f}") if len(table) else "no runs")
        print("\nRoofline vs the papers' own pairs (Llama-2-7b, A100, fp16):")
        print(check_pairs(GPUS["A100-80GB"], SHAPES["llama-2-7b"]).to_string(index=False))


if __name__ == "__main__":
    main()
