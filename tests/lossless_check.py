"""Shared checks for lossless decoders: greedy token equality up to numerical near-ties, and a
chi-square goodness-of-fit test for sampling-mode decoders.

A lossless decoder may diverge from vanilla greedy only where vanilla's own top-2 logits are closer
than `NEAR_TIE` (fp32 noise from a different block shape can flip such an argmax); after the first
divergence the continuations legitimately differ, so nothing later is compared.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from core.engine import Engine

NEAR_TIE = 1e-4


@dataclass
class Divergence:
    index: int  # first output position where the two token streams differ
    gap: float  # vanilla's top-1 minus top-2 logit at that position


def first_divergence(ref: Sequence[int], got: Sequence[int]) -> int | None:
    for i, (a, b) in enumerate(zip(ref, got)):
        if a != b:
            return i
    return None if len(ref) == len(got) else min(len(ref), len(got))


def top2_gap(engine, prompt: Sequence[int], prefix: Sequence[int]) -> float:
    """Vanilla's top-1 minus top-2 logit for the token after `prompt + prefix` (fresh prefill)."""
    ids = list(prompt) + list(prefix)
    engine.reset(len(ids) + 1)
    top = engine.prefill(ids).topk(2).values
    return float(top[0] - top[1])


def check_lossless(
    engine, prompt: Sequence[int], ref: Sequence[int], got: Sequence[int]
) -> Divergence | None:
    """None when identical; a Divergence (asserted to be a near-tie) otherwise."""
    i = first_divergence(ref, got)
    if i is None:
        return None
    gap = top2_gap(engine, prompt, ref[:i])
    assert gap < NEAR_TIE, (
        f"output diverges from vanilla at token {i} (vanilla {ref[i : i + 4]}, got {got[i : i + 4]}) "
        f"but vanilla's top-2 logit gap there is {gap:.3g} >= {NEAR_TIE}: not a numerical near-tie"
    )
    return Divergence(i, gap)


def chi_square_pvalue(
    samples: Sequence[tuple], probs: dict[tuple, float], min_expected: float = 5.0
) -> float:
    """Goodness of fit of `samples` to the exact distribution `probs` (outcome -> probability).

    Cells with expected count below `min_expected` are pooled into one cell (merged into the
    smallest other cell if still too small); an outcome absent from `probs` (probability 0) that
    is observed anyway gives p = 0.
    """
    n = len(samples)
    counts = Counter(samples)
    big = {o: p * n for o, p in probs.items() if p * n >= min_expected}
    rest_expected = n - sum(big.values())
    rest_observed = n - sum(counts[o] for o in big)
    if rest_expected <= 1e-9 and rest_observed:
        return 0.0
    cells = [(counts[o], e) for o, e in big.items()]
    if rest_expected > 1e-9:
        if rest_expected < min_expected and cells:  # too small to stand alone: merge into the smallest cell
            i = min(range(len(cells)), key=lambda c: cells[c][1])
            cells[i] = (cells[i][0] + rest_observed, cells[i][1] + rest_expected)
        else:
            cells.append((rest_observed, rest_expected))
    stat = sum((o - e) ** 2 / e for o, e in cells)
    df = len(cells) - 1
    if df <= 0:
        return 1.0
    return float(
        torch.special.gammaincc(
            torch.tensor(df / 2.0, dtype=torch.float64), torch.tensor(stat / 2.0, dtype=torch.float64)
        )
    )


def exact_distribution(engine, prompt: Sequence[int], n: int, sampler) -> dict[tuple, float]:
    """Exact probability of every n-token continuation under `sampler.probs` (vanilla sampling's
    distribution; the first token from the prompt's logits), enumerated with one prefill per prefix."""
    out: dict[tuple, float] = {}

    def walk(prefix: tuple, mass: float) -> None:
        if len(prefix) == n:
            out[prefix] = mass
            return
        engine.reset(len(prompt) + n + 1)
        dist = sampler.probs(engine.prefill(list(prompt) + list(prefix)))
        for tok in dist.nonzero().flatten().tolist():
            walk((*prefix, tok), mass * float(dist[tok]))

    walk((), 1.0)
    return out


def mtbench_engine_linear() -> str:
    """Engine GEMMs for the SmolLM2 MT-Bench checks: HARNESS_TEST_LINEAR=onednn halves their time on
    x86 CPUs (vanilla and the decoder share the engine, so the comparison stays like for like)."""
    return os.environ.get("HARNESS_TEST_LINEAR", "aten")


def mtbench_selected(sample_id: str) -> bool:
    """HARNESS_MTBENCH_FROM=116 / HARNESS_MTBENCH_TO=140 (question ids, inclusive) run one slice of a
    full MT-Bench check (default: every question): a long check resumes where it stopped or splits
    across processes; the per-prompt progress lines name each question, so the slices add up."""
    lo = int(os.environ.get("HARNESS_MTBENCH_FROM", "0"))
    hi = int(os.environ.get("HARNESS_MTBENCH_TO", str(10**9)))
    return not sample_id.isdigit() or lo <= int(sample_id) <= hi


def mtbench_policies_only() -> bool:
    """HARNESS_MTBENCH_POLICIES_ONLY=1: a full MT-Bench check slice runs every KV policy on its dense
    reference backend only, leaving out FAFO's sliced compressed-region runs and its paper-setting run
    (together about 80% of the check's time on a CPU)."""
    return os.environ.get("HARNESS_MTBENCH_POLICIES_ONLY", "0") == "1"


def mtbench_lossless(lm, makers: list, n_questions: int | None, turns: int, max_new: int) -> list[float]:
    """Run vanilla greedy and every `(label, make)` decoder `make(engine)` on MT-Bench (turn 2 sees
    vanilla's own turn-1 answer, chat template via the task); assert each output exact or a near-tie;
    print one line per prompt (each decoder's tau and seconds); return every run's tau."""
    import time

    from core.engine import Engine
    from core.types import Counts
    from decoders.vanilla import Vanilla
    from runners.runner import stop_ids_for
    from tasks.mtbench import MTBench

    tok, eng = lm.tokenizer, Engine(lm.model, linear=mtbench_engine_linear())
    stop = stop_ids_for(tok, lm.model)
    task = MTBench(limit=n_questions)
    taus = []
    for sample in task.load():
        if not mtbench_selected(sample.sample_id):
            continue
        history: list[str] = []
        for turn in range(turns):
            prompt = task.prompt_ids(sample, turn, history, tok)
            ref = Vanilla(eng).generate(prompt, max_new, stop, Counts())
            notes = []
            for label, make in makers:
                counts = Counts(keep_steps=False)
                t0 = time.perf_counter()
                got = make(eng).generate(prompt, max_new, stop, counts)
                secs = time.perf_counter() - t0
                div = check_lossless(eng, prompt, ref, got)
                taus.append(counts.tau)
                tie = "" if div is None else f" near-tie at {div.index} (gap {div.gap:.2g})"
                notes.append(f"{label}{tie} tau {counts.tau:.2f} {secs:.0f}s")
            print(f"[mtbench] {sample.sample_id} turn {turn} lossless: {', '.join(notes)}", flush=True)
            history.append(tok.decode(ref, skip_special_tokens=True))
    return taus


def task_prompts(lm, specs: list[tuple[str, dict]]) -> list[tuple[str, list[int]]]:
    """Turn-1 prompts `(label, ids)` of tasks built from `(task name, constructor kwargs)` specs (e.g.
    ("gsm8k", {"limit": 2}), ("pg19", {"context_length": 2048, "source": "package", "limit": 1}))."""
    import importlib

    classes = {"gsm8k": "tasks.gsm8k:GSM8K", "pg19": "tasks.pg19:PG19", "mtbench": "tasks.mtbench:MTBench"}
    out = []
    for name, kw in specs:
        module, cls = classes[name].split(":")
        task = getattr(importlib.import_module(module), cls)(**kw)
        out += [(f"{name}:{s.sample_id}", task.prompt_ids(s, 0, [], lm.tokenizer)) for s in task.load()]
    return out


def prompts_lossless(lm, makers: list, prompts: list[tuple[str, list[int]]], max_new: int) -> list[float]:
    """Vanilla greedy vs every `(label, make)` decoder on token-id prompts (fp32, the test engine);
    assert each output exact or a near-tie; one line per prompt; return every run's tau."""
    import time

    from core.engine import Engine
    from core.types import Counts
    from decoders.vanilla import Vanilla
    from runners.runner import stop_ids_for

    eng = Engine(lm.model, linear=mtbench_engine_linear())
    stop = stop_ids_for(lm.tokenizer, lm.model)
    taus = []
    for name, prompt in prompts:
        ref = Vanilla(eng).generate(prompt, max_new, stop, Counts())
        notes = []
        for label, make in makers:
            counts = Counts(keep_steps=False)
            t0 = time.perf_counter()
            got = make(eng).generate(prompt, max_new, stop, counts)
            div = check_lossless(eng, prompt, ref, got)
            taus.append(counts.tau)
            tie = "" if div is None else f" near-tie at {div.index} (gap {div.gap:.2g})"
            notes.append(f"{label}{tie} tau {counts.tau:.2f} {time.perf_counter() - t0:.0f}s")
        print(f"[lossless] {name} ({len(prompt)} tokens): {', '.join(notes)}", flush=True)
    return taus


def tiny_sampling_case(
    n: int, sampler_kw: dict, vocab_size: int = 16, seed: int = 4, layers: int = 2
) -> tuple[Engine, list[int], dict[tuple, float]]:
    """The sampling-losslessness setting the decoders share: a tiny random Llama with a small vocabulary
    (and `layers` layers: a layer-skipping draft needs interior ones), a prompt that ends in its own
    greedy text (so drafts and n-grams get accepted), and the exact distribution of its first `n`
    sampled tokens under `sampler_kw`."""
    from core.engine import Engine
    from core.models import load_model
    from core.sampling import Sampler
    from core.types import Counts
    from decoders.vanilla import Vanilla

    tiny = dict(vocab_size=vocab_size, layers=layers)
    lm = load_model("tiny", "tiny", arch="llama", dtype="float32", device="cpu", seed=seed, tiny=tiny)
    eng = Engine(lm.model)
    prompt = [1, 2, 3] + Vanilla(eng).generate([1, 2, 3], 24, set(), Counts())
    return eng, prompt, exact_distribution(eng, prompt, n, Sampler(**sampler_kw))


def sample_generations(dec, prompt: list[int], n: int, runs: int) -> tuple[list[tuple], Counter]:
    """`runs` sampled n-token generations of `dec` and the sums of their counts' acceptance fields
    (`accepted`, `accepted_l1`)."""
    from core.types import Counts

    samples, totals = [], Counter()
    for _ in range(runs):
        counts = Counts(keep_steps=False)
        samples.append(tuple(dec.generate(prompt, n, set(), counts)))
        totals.update(accepted=counts.accepted, accepted_l1=counts.accepted_l1)
    return samples, totals


def check_pool_deferral(
    monkeypatch, engine, make_decoder, prompt: list[int], ref: list[int], new: int
) -> None:
    """A decoder that defers its n-gram insertions (`NGramPool.defer`) stores them only after launching
    its next forward (`flush` right after a forward), and takes the same steps (blocks, acceptances,
    output) as when they are stored at once."""
    from core.types import Counts
    from decoders.ngram_pool import NGramPool

    def steps() -> list[tuple[int, int, bool]]:
        counts = Counts()
        check_lossless(engine, prompt, ref, make_decoder().generate(prompt, new, set(), counts))
        return [(s.block_tokens, s.accepted, s.draft) for s in counts.steps]

    events: list[str] = []
    inner_step, inner_flush = engine.step, NGramPool.flush

    def step(*args, **kwargs):
        events.append("forward")
        return inner_step(*args, **kwargs)

    def flush(pool: NGramPool) -> None:
        if pool._pending:
            events.append("flush")
        inner_flush(pool)

    monkeypatch.setattr(engine, "step", step)
    monkeypatch.setattr(NGramPool, "flush", flush)
    deferred = steps()
    assert events.count("flush") > 3
    assert all(events[i - 1] == "forward" for i, e in enumerate(events) if e == "flush")
    monkeypatch.setattr(NGramPool, "defer", NGramPool.add_under_suffixes)  # stored at once
    assert steps() == deferred
