"""A/B speed of two code versions in one sitting: is HEAD slower than `--base`, beyond noise?

    python -m benchmarks.ab --base 50db642 --decoders forward,vanilla,pld,fafo_cpu

`--base` (and `--head`, default: this working tree, uncommitted changes included) are checked out as
detached git worktrees in a temporary folder (removed at the end). One long-lived worker process per
tree (`benchmarks/ab_worker.py`) imports that tree's harness with the same virtualenv, loads the model
once and builds every decoder once. The lead then asks the two workers in turn for short timed bursts,
ABBA order (A B, then B A, ...), `--rounds` times per decoder, over `--prompts` MT-Bench first turns in
rotation: a burst is one greedy generation of `--tokens` new tokens, timed from the end of its prefill
(`forward`: that many one-row forwards of the engine alone). A burst of either side lies within
seconds of its partner, so the load of a shared machine, which moves both alike, mostly cancels in
their ratio; the whole-run ratios it would otherwise decide spread by +-20% on a shared 2-core box.

Per decoder: the median over pairs of head speed / base speed (tokens per decode second; > 1 = head
faster) with a 95% interval of that median, and whether both sides decoded identical ids. The pairs
come from `--sessions` fresh pairs of worker processes (started base first, then head first, in
turn, both loading the model at once): identical trees in two processes set up one after the other
differed by 18% for a whole session on a shared VM (the first-started one slower), an effect no
number of pairs in one session averages out, so the interval resamples the sessions, then the pairs
in each (a cluster bootstrap). Written to
`results/bench/<device>/ab-<base>-<head>.md` and `.json` with the CPU flags, threads, torch and the
load average before and after. A vs A (`--base HEAD --head HEAD`) checks the tool itself: the median
should be 1.00 with an interval inside +-3%.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from core.types import HarnessError
from tasks.base import chat_ids
from tasks.mtbench import MTBench

REPO = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "ab_worker.py"
BOOTSTRAP = 4000


@dataclass
class Pairs:
    """The bursts of one decoder: per pair the base's and the head's decode speed (tokens / s)."""

    base: list[float] = field(default_factory=list)
    head: list[float] = field(default_factory=list)
    session: list[int] = field(default_factory=list)  # the pair of worker processes that timed each
    same_ids: bool = True

    def ratios(self) -> list[float]:
        return [h / b for b, h in zip(self.base, self.head, strict=True)]

    def by_session(self) -> list[list[float]]:
        groups: dict[int, list[float]] = {}
        for s, r in zip(self.session, self.ratios(), strict=True):
            groups.setdefault(s, []).append(r)
        return list(groups.values())


def median_interval(
    groups: list[list[float]], seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """(median, low, high): the median of all values and its percentile-bootstrap interval, resampling
    the groups (sessions: a process's own speed lasts as long as it does) and then the values in each,
    so that a difference between two processes' memory is counted as noise, not as a code effect."""
    rng = random.Random(seed)
    meds = []
    for _ in range(BOOTSTRAP):
        chosen = rng.choices(groups, k=len(groups)) if len(groups) > 1 else groups
        meds.append(statistics.median([v for g in chosen for v in rng.choices(g, k=len(g))]))
    meds.sort()
    tail = (1 - level) / 2
    pooled = [v for g in groups for v in g]
    return statistics.median(pooled), meds[int(tail * BOOTSTRAP)], meds[int((1 - tail) * BOOTSTRAP) - 1]


def _git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise HarnessError(f"git {' '.join(args)}: {(done.stderr.strip().splitlines() or ['failed'])[-1]}")
    return done.stdout.strip()


def short_sha(rev: str) -> str:
    return _git("rev-parse", "--short=7", f"{rev}^{{commit}}")


def working_tree_label() -> str:
    """HEAD's short sha, `+dirty` when tracked files differ from it (the worker imports them as they are)."""
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return short_sha("HEAD") + ("+dirty" if dirty else "")


class Worker:
    """The lead's end of one `ab_worker.py` process."""

    def __init__(self, tree: Path, log: IO[str]) -> None:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["HARNESS_BENCH_OUT"] = "none"
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), str(tree)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            cwd=tree,
            env=env,
        )
        self.tree = tree

    def ask(self, **req: Any) -> dict[str, Any]:
        self.send(**req)
        return self.receive()

    def send(self, **req: Any) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()

    def receive(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise HarnessError(f"the worker for {self.tree} exited (its log is printed above)")
        ans = json.loads(line)
        if not ans.get("ok"):
            raise HarnessError(f"the worker for {self.tree}: {ans.get('error')}")
        return ans

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def prompts(n: int) -> list[list[int]]:
    """The first `n` MT-Bench first turns as SmolLM2 chat ids (the same ids go to both sides)."""
    from transformers import AutoTokenizer

    from core.models import packaged_gguf_folder

    tok = AutoTokenizer.from_pretrained(packaged_gguf_folder("smollm2-135m"))
    return [chat_ids(tok, [{"role": "user", "content": s.turns[0]}]) for s in MTBench(limit=n).load()]


def measure(
    sides: tuple[Worker, Worker],
    decoders: list[str],
    asked: list[list[int]],
    args,
    pairs: dict[str, Pairs],
    session: int,
) -> None:
    """Warm each decoder on both sides, then this session's share of `args.rounds` ABBA-ordered pairs
    of bursts per decoder (into `pairs`), decoders interleaved round by round so that a slow minute
    hits every decoder."""
    for d in decoders:
        for _ in range(args.warmup):
            for w in sides:
                w.ask(op="burst", decoder=d, prompt=asked[0], tokens=args.tokens)
    rounds = -(-args.rounds // args.sessions)
    for r in range(rounds):
        prompt = asked[r % len(asked)]
        for d in decoders:
            order = (0, 1) if r % 2 == 0 else (1, 0)
            got: dict[int, dict[str, Any]] = {}
            for i in order:
                got[i] = sides[i].ask(op="burst", decoder=d, prompt=prompt, tokens=args.tokens)
            pairs[d].base.append(got[0]["tokens"] / got[0]["seconds"])
            pairs[d].head.append(got[1]["tokens"] / got[1]["seconds"])
            pairs[d].session.append(session)
            pairs[d].same_ids &= got[0]["digest"] == got[1]["digest"]
        if (r + 1) % 5 == 0 or r == 0:
            line = "  ".join(f"{d} {statistics.median(p.ratios()):.3f}" for d, p in pairs.items())
            print(
                f"[ab] session {session + 1}/{args.sessions} round {r + 1}/{rounds}: {line}", file=sys.stderr
            )


def run_session(
    sides: list[tuple[Path, list[str]]],
    session: int,
    decoders: list[str],
    asked: list[list[int]],
    args,
    pairs: dict[str, Pairs],
    log: IO[str],
    out_root: Path,
) -> None:
    """One pair of fresh worker processes, started base first in even sessions and head first in odd
    ones, both loading at once: a process's speed lasts as long as it does (identical trees set up one
    after the other differed by 18% for a whole session), so it must vary between sessions to be seen.
    Each worker gets its own runs folder in `out_root`, which it creates: two workers creating one
    folder at once made an older tree's settings check fail ("File exists")."""
    order = (0, 1) if session % 2 == 0 else (1, 0)
    workers: dict[int, Worker] = {}
    try:
        for i in order:
            workers[i] = Worker(sides[i][0], log)
        for i in order:  # both load at once: neither process's memory is placed before the other's
            workers[i].send(
                op="setup",
                decoders=decoders,
                overrides=[*args.override, *sides[i][1]],
                threads=args.threads,
                out_dir=str(out_root / f"runs-{session}-{('base', 'head')[i]}"),
            )
        for i in order:
            workers[i].receive()
        measure((workers[0], workers[1]), decoders, asked, args, pairs, session)
    finally:
        for w in workers.values():
            w.close()


def table(pairs: dict[str, Pairs], base: str, head: str) -> tuple[str, dict[str, Any]]:
    lines = [
        f"| decoder | base {base} tok/s | head {head} tok/s | head/base median | 95% interval | per session "
        "| pairs | same ids |",
        "|---|---:|---:|---:|---|---|---:|---|",
    ]
    blob: dict[str, Any] = {}
    for d, p in pairs.items():
        med, lo, hi = median_interval(p.by_session())
        per_session = " ".join(f"{statistics.median(g):.3f}" for g in p.by_session())
        b, h = statistics.median(p.base), statistics.median(p.head)
        lines.append(
            f"| {d} | {b:.1f} | {h:.1f} | {med:.3f} | [{lo:.3f}, {hi:.3f}] | {per_session} | {len(p.base)} | "
            f"{'yes' if p.same_ids else 'NO'} |"
        )
        blob[d] = {
            "median_ratio": med,
            "interval": [lo, hi],
            "base_tok_s": p.base,
            "head_tok_s": p.head,
            "session": p.session,
            "same_ids": p.same_ids,
        }
    return "\n".join(lines), blob


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main(argv: list[str] | None = None) -> None:
    from benchmarks.output import environment

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the git revision compared against")
    ap.add_argument("--head", default=None, help="a git revision (default: this working tree as it is)")
    ap.add_argument(
        "--decoders",
        default="forward,vanilla,pld,fafo_cpu",
        help="comma-separated; forward = one-row engine forwards alone",
    )
    ap.add_argument("--rounds", type=int, default=60, help="pairs of bursts per decoder, over all sessions")
    ap.add_argument("--sessions", type=int, default=4, help="fresh pairs of worker processes, in turn")
    ap.add_argument("--tokens", type=int, default=32, help="new tokens (forwards) per burst")
    ap.add_argument("--prompts", type=int, default=8, help="MT-Bench first turns, used in rotation")
    ap.add_argument("--warmup", type=int, default=2, help="untimed bursts per decoder and side first")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--override", action="append", default=[], help="a Hydra override for both sides")
    ap.add_argument("--base-override", action="append", default=[], help="a Hydra override for the base only")
    ap.add_argument("--head-override", action="append", default=[], help="a Hydra override for the head only")
    args = ap.parse_args(argv)
    decoders = [d for d in args.decoders.split(",") if d]
    known = {p.stem for p in (REPO / "conf" / "decoder").glob("*.yaml")} | {"forward"}
    if not decoders or any(d not in known for d in decoders):
        raise HarnessError(f"--decoders: each of forward, {', '.join(sorted(known - {'forward'}))}")
    if min(args.rounds, args.sessions, args.tokens, args.prompts, args.threads) < 1 or args.warmup < 0:
        raise HarnessError(
            "--rounds, --sessions, --tokens, --prompts and --threads must be positive, --warmup >= 0"
        )
    base = short_sha(args.base)
    head = short_sha(args.head) if args.head else working_tree_label()
    base += "".join(f"+{o}" for o in args.base_override)  # a setting compared on one tree: named apart
    head += "".join(f"+{o}" for o in args.head_override)
    asked = prompts(args.prompts)
    env = {**environment(), "threads": args.threads, "load_average_before": load_average()}
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ab-")))
        trees = []
        for label, rev in (("base", args.base), ("head", args.head)):
            if rev is None:
                trees.append(REPO)
                continue
            tree = tmp / label
            _git("worktree", "add", "--detach", "--quiet", str(tree), rev)
            stack.callback(_git, "worktree", "remove", "--force", str(tree))
            trees.append(tree)
        log = stack.enter_context(open(tmp / "workers.log", "w"))
        sides = [(trees[0], args.base_override), (trees[1], args.head_override)]
        pairs = {d: Pairs() for d in decoders}
        started = time.perf_counter()
        try:
            for session in range(args.sessions):
                run_session(sides, session, decoders, asked, args, pairs, log, tmp)
        except HarnessError:
            log.flush()
            sys.stderr.write((tmp / "workers.log").read_text()[-4000:])
            raise
    env["load_average_after"] = load_average()
    text, blob = table(pairs, base, head)
    minutes = (time.perf_counter() - started) / 60
    summary = (
        f"# A/B {base} (base) vs {head} (head): {args.rounds} ABBA pairs per decoder in {args.sessions} "
        f"sessions, {args.tokens} tokens "
        f"a burst, {args.prompts} prompts, {args.threads} threads, {minutes:.1f} min\n\n{text}\n\n"
        f"load average before {env['load_average_before']}, after {env['load_average_after']}"
    )
    print(summary)
    from benchmarks.output import out_dir, write

    name = f"ab-{base}-{head}"
    if write(name, summary, env, module="benchmarks.ab") is not None:
        folder = out_dir(env)
        assert folder is not None
        record = json.loads((folder / f"{name}.json").read_text())
        record["pairs"] = blob
        (folder / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    # a terminated lead still removes its worktrees and stops its workers (the ExitStack unwinds)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        main()
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
