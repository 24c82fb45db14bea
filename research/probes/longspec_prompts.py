"""LongSpec Table 1's prompts for the LongSpec probes: the pg19 task's offline stand-in cut to
`--context` tokens (as `experiment=longspec_table1_cpu`), as they are or each followed by the target's
greedy continuation of `--new` tokens (decoded losslessly by prompt lookup)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

import torch

from core.engine import Engine
from core.models import load_model
from training.longspec.steps import greedy_continuation


def add_prompt_arguments(ap: argparse.ArgumentParser, continued: bool = True) -> None:
    """--context, --prompts, --threads and, for probes that read the target's continuations, --new."""
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--prompts", type=int, default=3)
    if continued:
        ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)


def table1_prompts(args: argparse.Namespace) -> tuple[Engine, Any, Iterator[tuple[str, list[int]]]]:
    """The fp32 SmolLM2 engine, its tokenizer and, lazily, (sample id, prompt ids) per prompt. Bad
    arguments stop here with one `error:` line, before the model loads."""
    new = getattr(args, "new", None)  # None: a probe of the prompts alone (no --new)
    if args.prompts <= 0 or args.context < 64 or (new is not None and new < 8):
        asked = (
            "--prompts must be positive, --new at least 8"
            if new is not None
            else "--prompts must be positive"
        )
        raise SystemExit(f"error: {asked} and --context at least 64")
    from tasks.pg19 import PG19

    torch.set_num_threads(args.threads)
    lm = load_model("packaged", "smollm2-135m", dtype="float32", device="cpu")
    eng = Engine(lm.model)
    task = PG19(  # max_new_tokens: the task's generation length, unused by a probe of the prompts alone
        context_length=args.context, max_new_tokens=new or 256, source="package", limit=args.prompts
    )
    return eng, lm.tokenizer, ((s.sample_id, task.prompt_ids(s, 0, [], lm.tokenizer)) for s in task.load())


def continued_prompts(
    args: argparse.Namespace,
) -> tuple[Engine, Any, Iterator[tuple[str, list[int], int]]]:
    """The engine, its tokenizer and, lazily, (sample id, prompt + greedy continuation, prompt length)
    per prompt."""
    eng, tokenizer, prompts = table1_prompts(args)

    def each() -> Iterator[tuple[str, list[int], int]]:
        for sample_id, prompt in prompts:
            continuation = greedy_continuation(eng, prompt, args.new, "prompt_lookup")
            yield sample_id, prompt + continuation, len(prompt)

    return eng, tokenizer, each()
