"""Every decoder x policy pair of the paper experiments, once eagerly and once on replayed forwards: a
smoke test of a GPU session's code (one MT-Bench question, 16 new tokens; the long-context pairs on one
PG-19 window). One row per pair, printed and appended to `--rows-out` as it ends, so a run stopped at its
time limit keeps the pairs it finished; a pair that fails is a row with its error, and the next runs.

    python -m benchmarks.smoke_pairs --device cuda --dtype bfloat16 [--model smollm2-135m] \\
        [--longspec-draft FOLDER] [--rows-out smoke.csv]

Columns: whether the graphed tokens equal the eager ones (bf16 may part at a near-tie: a hint, not a
failure), the graphed run's forwards, tau, share of decode forwards on the fixed-shape path, captures and
ms per new token (captures included: one question times nothing); `fixed_shape_steps` counts a
self-draft's steps too. `--graphs emulate` runs the captures
emulated on a CPU (`runners.emulated_graphs`), as a rehearsal does; `--model tiny` a random two-layer
model; `--plan` builds the pairs outside `--only` without running them (a quick rehearsal's check that
every pair's overrides compose).
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import time
import traceback
from pathlib import Path

import torch

from benchmarks.bench_host_overhead import COMBOS, LONG_COMBOS, chosen_combos, make_decoder
from core.cost_curve import synchronize
from core.engine import Engine
from core.models import load_model
from core.types import Counts
from runners.config import stop_ids_for
from runners.emulated_graphs import emulate_graphs
from tasks.mtbench import MTBench
from tasks.pg19 import PG19

FIELDS = (
    "pair",
    "status",
    "same_as_eager",
    "new_tokens",
    "forwards",
    "fixed_shape_steps",
    "captures",
    "ms_per_token",
)


def pairs(longspec_draft: str, tiny: bool) -> list[tuple[str, str, tuple[str, ...], bool]]:
    """(decoder, kv, overrides, on a long window): the experiments' pairs at the papers' settings (on the
    two-layer tiny model, TriForce's self-draft keeps one layer)."""
    draft = (f"decoder.checkpoint={longspec_draft}",)
    if tiny:
        combos = [
            (d, k, e + (("draft.layers=1",) if d == "triforce" else ()), long)
            for d, k, e, long in pairs("random", False)
        ]
        return combos
    short = [
        (d, k, e + (draft if d == "longspec" else ()), False)
        for d, k, e in chosen_combos(COMBOS, None, "paper")
    ]
    long = [(d, k, e, True) for d, k, e in LONG_COMBOS if d != "vanilla"]
    return short + long


def prompts_for(lm, long: bool, context: int) -> tuple[list[int], str]:
    """One MT-Bench turn, or one PG-19 window of `context` tokens (synthetic ids where the package's
    text is absent, said in the row)."""
    task = PG19(limit=1, context_length=context, source="package") if long else MTBench(limit=1)
    try:
        sample = task.load()[0]
    except Exception as exc:  # noqa: BLE001  (a missing data package: the row says so)
        if not long:
            raise
        return [(100 + i) % 250 for i in range(context)], f"synthetic window ({exc.__class__.__name__})"
    return task.prompt_ids(sample, 0, [], lm.tokenizer), ""


def generate(lm, combo, graphs: str, prompt: list[int], new: int, stop: set[int]):
    decoder, kv, extra, _ = combo
    eng = Engine(lm.model, cuda_graphs=graphs == "cuda")
    if graphs == "emulate":
        emulate_graphs(eng)
    dec = make_decoder(decoder, kv, extra, lm, eng, scale="paper")
    counts = Counts(keep_steps=False)
    synchronize(lm.device)
    t0 = time.perf_counter()
    out = dec.generate(prompt, new, stop, counts)
    synchronize(lm.device)
    return list(out), counts, eng, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="a packaged model, or tiny")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--graphs", default="cuda", choices=["cuda", "emulate"])
    ap.add_argument("--new", type=int, default=16)
    ap.add_argument("--context", type=int, default=2048, help="the long pairs' PG-19 window")
    ap.add_argument("--longspec-draft", default="auto", help="decoder.checkpoint of the LongSpec pair")
    ap.add_argument("--only", nargs="*", default=None, help="decoder+kv names")
    ap.add_argument("--rows-out", type=Path, default=None)
    ap.add_argument(
        "--plan",
        action="store_true",
        help="the pairs outside --only built (configs composed, decoders made) but not run (a rehearsal)",
    )
    args = ap.parse_args(argv)
    if args.graphs == "cuda" and not args.device.startswith("cuda"):
        raise SystemExit("error: --graphs cuda needs --device cuda (--graphs emulate on a CPU)")
    source = "tiny" if args.model == "tiny" else "packaged"
    lm = load_model(
        source, "tiny_llama" if source == "tiny" else args.model, dtype=args.dtype, device=args.device
    )
    stop = stop_ids_for(lm.tokenizer, lm.model)
    if args.rows_out is not None and not args.rows_out.exists():
        args.rows_out.parent.mkdir(parents=True, exist_ok=True)
        args.rows_out.write_text(",".join(FIELDS) + "\n")
    print(
        f"# smoke_pairs: {lm.name} {args.dtype} on {args.device}, graphs {args.graphs}, "
        f"torch {torch.__version__}"
    )
    print(" | ".join(FIELDS), flush=True)
    for combo in pairs(args.longspec_draft, args.model == "tiny"):
        decoder, kv, extra, long = combo
        name = (
            f"{decoder}+{kv}"
            + ("/long" if long else "")
            + "".join(f" {e}" for e in extra if "checkpoint" not in e)
        )
        runs = args.only is None or f"{decoder}+{kv}" in args.only
        if not runs and not args.plan:
            continue
        row: tuple = (name, "skipped: kvpress is not installed", "", "", "", "", "", "")
        if kv == "kvpress" and importlib.util.find_spec("kvpress") is None:
            pass
        elif not runs:
            row = _planned(lm, combo, name)
        else:
            try:
                prompt, note = prompts_for(lm, long, args.context)
                eager, *_ = generate(lm, combo, "none", prompt, args.new, stop)
                out, counts, eng, seconds = generate(lm, combo, args.graphs, prompt, args.new, stop)
                row = (
                    name,
                    "ok" + (f" ({note})" if note else ""),
                    out == eager,
                    len(out),
                    counts.forwards,
                    eng.fixed_shape_steps,
                    eng.graphs.captures,
                    f"{seconds / max(len(out), 1) * 1e3:.2f}",
                )
            except Exception:  # noqa: BLE001  (one pair failing leaves the others' rows)
                last = traceback.format_exc().strip().splitlines()[-1]
                row = (name, f"error: {last}"[:300], "", "", "", "", "", "")
        _write(row, args.rows_out)


def _planned(lm, combo, name: str) -> tuple:
    """A pair's row when its decoder is only built: its overrides compose and its parts are made."""
    decoder, kv, extra, _ = combo
    try:
        make_decoder(decoder, kv, extra, lm, Engine(lm.model, cuda_graphs=False), scale="paper")
    except Exception:  # noqa: BLE001  (as a run's failure: a row with its error, the next pair goes on)
        last = traceback.format_exc().strip().splitlines()[-1]
        return (name, f"error: {last}"[:300], "", "", "", "", "", "")
    return (name, "planned", "", "", "", "", "", "")


def _write(row: tuple, rows_out: Path | None) -> None:
    print(" | ".join(str(c) for c in row), flush=True)
    if rows_out is not None:
        with open(rows_out, "a", newline="") as f:
            csv.writer(f).writerow(row)


if __name__ == "__main__":
    main()
