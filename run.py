"""Hydra entry point: compose the config, run it, print one clear line on a user error.

python run.py                                   # SmolLM2 + vanilla + full KV on MT-Bench
python run.py decoder=fafo kv=quest task=mtbench
python run.py -m decoder=vanilla,lookahead,fafo launcher=slurm cluster=gpu

In a sweep (`-m`) a job with bad input prints `error: job <n> (<overrides>): <message>` and the
other jobs still run; the sweep then ends with one line counting the failed jobs and exits non-zero.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, open_dict

from core.types import HarnessError
from runners.overrides import check_overrides

CONF = Path(__file__).resolve().parent / "conf"
FAILURES_ENV = "HARNESS_SWEEP_FAILURES"  # file where sweep jobs append their one-line failures


def check_group_choices(argv: list[str]) -> None:
    """Fail fast, in one line, on `group=option` overrides that name no config file."""
    for arg in argv:
        key, sep, value = arg.lstrip("+~").partition("=")
        group = CONF / key
        if not sep or "." in key or not group.is_dir() or value in ("", "null"):
            continue
        options = sorted(p.stem for p in group.glob("*.yaml"))
        for choice in value.split(","):
            if choice.startswith(("glob(", "range(")):
                continue
            if choice not in options:
                sys.exit(f"error: unknown {key} {choice!r}; available: {', '.join(options)}")


class QuietSacct(logging.Filter):
    """submitit polls `sacct` for job states; on a cluster without SLURM accounting every poll fails
    and warns (and `sacct` itself prints "Slurm accounting storage is disabled"). The jobs still run
    and submitit still collects their results: say so once instead of at every poll."""

    told = False

    def filter(self, record: logging.LogRecord) -> bool:
        if "Bypassing sacct error" not in record.getMessage():
            return True
        if not QuietSacct.told:
            QuietSacct.told = True
            print(
                "[slurm] sacct (SLURM accounting) is off on this cluster: job states come from the jobs' "
                "own result files; the sacct warnings that follow are expected and hidden",
                file=sys.stderr,
            )
        return False


def _report_job_failure(exc: HarnessError) -> None:
    job = HydraConfig.get().job
    line = f"error: job {job.num} ({' '.join(job.override_dirname.split(',')) or 'defaults'}): {exc}"
    print(line, file=sys.stderr)
    path = os.environ.get(FAILURES_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\t{line}\n")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from runners.runner import run

    hc = HydraConfig.get()
    with open_dict(cfg):
        cfg.choices = {k: v for k, v in hc.runtime.choices.items() if "/" not in k}
    try:
        run(cfg)
    except HarnessError as exc:
        if hc.mode == RunMode.MULTIRUN:
            _report_job_failure(exc)  # the sweep goes on with its other jobs
            return
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


def sweep_failures(path: Path) -> list[tuple[int, str]]:
    """(pid of the job's process, its error line) for every failed sweep job."""
    rows = path.read_text().splitlines() if path.exists() else []
    return [(int(pid), line) for pid, _, line in (r.partition("\t") for r in rows)]


if __name__ == "__main__":
    argv = sys.argv[1:]
    check_group_choices(argv)
    problem = check_overrides(argv, CONF)
    if problem:
        sys.exit(f"error: {problem}")
    failures = Path(tempfile.gettempdir()) / f"harness-sweep-{os.getpid()}.failures"
    os.environ[FAILURES_ENV] = str(failures)
    logging.getLogger("submitit").addFilter(QuietSacct())
    try:
        main()
    finally:
        failed = sweep_failures(failures)
        failures.unlink(missing_ok=True)
    if failed:
        for pid, line in failed:
            if pid != os.getpid():  # jobs in other processes (submitit, SLURM) printed to their own logs
                print(line, file=sys.stderr)
        sys.exit(f"error: {len(failed)} sweep job(s) failed (each named in an 'error: job' line)")
