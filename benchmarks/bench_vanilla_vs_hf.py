"""Our vanilla decoder vs HF `generate` (greedy) on the same model and prompts, in one run.

    python -m benchmarks.bench_vanilla_vs_hf [--dtypes float32 bfloat16] [--prompts 4] [--new 64] \\
        [--device cpu]

Both sides decode exactly --new tokens (EOS ignored) from the same MT-Bench first-turn prompts;
outputs are checked identical; the methods alternate per prompt and the best of --repeats is kept per
(method, prompt), so background noise hits all alike. Prints tok/s and the ratio. `--cuda-graphs`
(with `--device cuda`) adds ours with one-row steps replayed as a CUDA graph (`run.cuda_graphs=true`).
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
    ap.add_argument(
        "--cuda-graphs", action="store_true", help="also ours with one-row steps replayed as a CUDA graph"
    )
    args = ap.parse_args()
    dev = torch.device(args.device)
    if args.cuda_graphs and dev.type != "cuda":
        raise SystemExit("error: --cuda-graphs needs --device cuda")
    torch.set_num_threads(max(1, torch.get_num_threads()))
    where = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"threads={torch.get_num_threads()}"
    print(f"{where}  prompts={args.prompts}  new_tokens={args.new}")
    graphs_col = f" {'ours+graphs':>11}" if args.cuda_graphs else ""
    print(f"{'dtype':>9} {'ours tok/s':>11}{graphs_col} {'HF tok/s':>9} {'ratio':>6} {'identical':>9}")
    for dtype in args.dtypes:
        lm = load_model("packaged", "smollm2-135m", dtype=dtype, device=args.device)
        prompts = [
            chat_ids(lm.tokenizer, [{"role": "user", "content": s.turns[0]}])
            for s in MTBench(limit=args.prompts).load()
        ]
        mask = lambda p: torch.ones(1, len(p), dtype=torch.long, device=dev)  # noqa: E731

        def ours(graphs: bool, lm=lm):
            dec = Vanilla(Engine(lm.model, cuda_graphs=graphs))
            return lambda prompt: dec.generate(prompt, args.new, set(), Counts(keep_steps=False))

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

        methods = {"ours": ours(False), **({"graphs": ours(True)} if args.cuda_graphs else {}), "hf": run_hf}
        for fn in methods.values():  # warm-up (the graph is captured here)
            fn(prompts[0][:32])
        best = {name: [float("inf")] * len(prompts) for name in methods}
        same = True
        with torch.inference_mode():
            for _ in range(args.repeats):
                for i, p in enumerate(prompts):
                    ids = {}
                    for name, fn in methods.items():
                        t = time.perf_counter()
                        ids[name] = fn(p)  # .tolist() waits for the device
                        best[name][i] = min(best[name][i], time.perf_counter() - t)
                    same &= all(v == ids["ours"] for v in ids.values())
        n = args.new * len(prompts)
        rate = {name: n / sum(times) for name, times in best.items()}
        graphs = f" {rate['graphs']:11.2f}" if args.cuda_graphs else ""
        print(
            f"{dtype:>9} {rate['ours']:11.2f}{graphs} {rate['hf']:9.2f} {rate['ours'] / rate['hf']:6.2f} "
            f"{str(same):>9}"
        )


if __name__ == "__main__":
    from benchmarks.output import recorded

    with recorded("bench_vanilla_vs_hf"):
        main()
