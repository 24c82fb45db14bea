"""Our vanilla decoder vs HF `generate` (greedy) on the same model and prompts, in one run.

    python -m benchmarks.bench_vanilla_vs_hf [--dtypes float32 bfloat16] [--prompts 4] [--new 64] \\
        [--device cpu]

Both sides decode exactly --new tokens (EOS ignored) from the same MT-Bench first-turn prompts;
outputs are checked identical; the two methods alternate per prompt and the best of --repeats is
kept per (method, prompt), so background noise hits both alike. Prints tok/s and the ratio.
"""

from __future__ import annotations

import argparse
import time

import torch

from core.engine import Engine
from core.models import load_model
from core.types import Counts
from decoders.vanilla import Vanilla
from tasks.base import chat_ids
from tasks.mtbench import MTBench


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu | cuda")
    args = ap.parse_args()
    dev = torch.device(args.device)
    torch.set_num_threads(max(1, torch.get_num_threads()))
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"threads={torch.get_num_threads()}"
    print(f"{where}  prompts={args.prompts}  new_tokens={args.new}")
    print(f"{'dtype':>9} {'ours tok/s':>11} {'HF tok/s':>9} {'ratio':>6} {'identical':>9}")
    for dtype in args.dtypes:
        lm = load_model("packaged", "smollm2-135m", dtype=dtype, device=args.device)
        prompts = [
            chat_ids(lm.tokenizer, [{"role": "user", "content": s.turns[0]}])
            for s in MTBench(limit=args.prompts).load()
        ]
        ours = Vanilla(Engine(lm.model))
        mask = lambda p: torch.ones(1, len(p), dtype=torch.long, device=dev)  # noqa: E731

        def run_ours(p, ours=ours):
            return ours.generate(p, args.new, set(), Counts(keep_steps=False))

        def run_hf(p, lm=lm, mask=mask):
            out = lm.model.generate(
                torch.tensor([p], device=dev),
                attention_mask=mask(p),
                max_new_tokens=args.new,
                min_new_tokens=args.new,
                do_sample=False,
                pad_token_id=0,
            )
            return out[0, len(p) :].tolist()

        run_ours(prompts[0][:32])
        run_hf(prompts[0][:32])  # warm-up both
        best = {"ours": [float("inf")] * len(prompts), "hf": [float("inf")] * len(prompts)}
        same = True
        with torch.inference_mode():
            for _ in range(args.repeats):
                for i, p in enumerate(prompts):
                    for name, fn in (("ours", run_ours), ("hf", run_hf)):
                        t = time.perf_counter()
                        ids = fn(p)  # .tolist() waits for the device
                        best[name][i] = min(best[name][i], time.perf_counter() - t)
                        if name == "ours":
                            a = ids
                        else:
                            same &= a == ids
        n = args.new * len(prompts)
        t_ours, t_hf = n / sum(best["ours"]), n / sum(best["hf"])
        print(f"{dtype:>9} {t_ours:11.2f} {t_hf:9.2f} {t_ours / t_hf:6.2f} {str(same):>9}")


if __name__ == "__main__":
    from benchmarks.output import recorded

    with recorded("bench_vanilla_vs_hf"):
        main()
