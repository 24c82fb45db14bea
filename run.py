"""Hydra entry point: compose the config, run it, print one clear line on a user error.

python run.py                                   # SmolLM2 + vanilla + full KV on MT-Bench
python run.py decoder=fafo kv=quest task=mtbench
python run.py -m decoder=vanilla,lookahead,fafo launcher=slurm cluster=gpu

Every job of the command line (each combination of a sweep) is composed and checked before anything
is loaded or written: bad input is one `error: ...` line, exit status 2, and nothing on disk. A run's
Hydra folder is its `run.out_dir` (a sweep's: `<out_dir>/multirun/<date>/<time>/`), and the composed
config is saved beside the run's records (`<out_dir>/runs/<run_id>/config.yaml`).

A sweep job that fails only once its model is loaded (a prompt longer than the model's context, a full
disk, memory) prints `error: job <n> (<overrides>): <message>` and the other jobs still run; the sweep
then ends with one line counting the failed jobs and exits non-zero. Ctrl-C ends a run or a sweep with
one `interrupted:` line (exit 130); rerunning the same command resumes it.
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
from omegaconf import DictConfig, OmegaConf, open_dict

from core.types import HarnessError
from runners.overrides import check_overrides, compose_checked, job_overrides
from runners.schemas import register_schemas

CONF = Path(__file__).resolve().parent / "conf"
FAILURES_ENV = "HARNESS_SWEEP_FAILURES"  # file where sweep jobs append their one-line failures


def check_group_choices(argv: list[str]) -> str | None:
    """The one-line problem with `group=option` overrides that name no config file, or None."""
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
                return f"unknown {key} {choice!r}; available: {', '.join(options)}"
    return None


def preflight(argv: list[str], composed: list[DictConfig] | None = None) -> str | None:
    """The one-line problem with the command line, found before Hydra runs (so before any folder is
    made): unknown options and keys, and every job's config checked as the runner will check it. The
    jobs' configs are appended to `composed` when given."""
    from runners.config import check_config, check_decoder

    problem = check_group_choices(argv) or check_overrides(argv, CONF)
    if problem:
        return problem
    jobs = job_overrides(argv, CONF)
    if isinstance(jobs, str):
        return jobs
    for num, job in enumerate(jobs):
        cfg, problem = compose_checked(job, CONF)
        if cfg is not None:
            if composed is not None:
                composed.append(cfg)
            try:
                check_config(cfg)
                check_decoder(cfg)
            except HarnessError as exc:
                problem = str(exc)
        if problem:
            return problem if len(jobs) == 1 else f"job {num} ({' '.join(job)}): {problem}; no job was run"
    return None


def missing_top(path: Path) -> Path | None:
    """The outermost folder of `path` that does not exist yet (None when `path` exists)."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    return missing[-1] if missing else None


def discard_empty(path: Path, top: Path | None) -> None:
    """Remove `path` and the folders above it up to `top`, those of them that are empty: what Hydra
    made for a run that was then refused."""
    if top is None:
        return
    for level in (path, *path.parents):
        try:
            level.rmdir()
        except OSError:
            return
        if level == top:
            return


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


def user_error(exc: BaseException) -> str | None:
    """The one-line message for an exception the user's input or machine causes: bad input
    (HarnessError), a machine out of memory, a file system that refuses a read or a write (full, gone,
    read-only). None for anything else: a bug, whose traceback is kept."""
    import torch

    if isinstance(exc, HarnessError):
        return str(exc)
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        first = (str(exc).strip().splitlines() or [exc.__class__.__name__])[0][:160]
        return (
            f"out of memory ({first}): lower run.max_new_tokens or the task's context, or use a smaller "
            "model or model.dtype=bfloat16"
        )
    if isinstance(exc, OSError):
        where = f"{exc.filename}: " if exc.filename else ""
        return f"{exc.__class__.__name__}: {where}{exc.strerror or exc} (free space, permissions, the path)"
    return None


def _report_job_failure(message: str) -> None:
    job = HydraConfig.get().job
    line = f"error: job {job.num} ({' '.join(job.override_dirname.split(',')) or 'defaults'}): {message}"
    print(line, file=sys.stderr)
    path = os.environ.get(FAILURES_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpid()}\t{line}\n")


NEW_OUT_DIR: Path | None = None  # outermost folder of a single run's out_dir that this process made


def save_config(run_dir: Path, cfg: DictConfig, overrides: list[str]) -> None:
    """The composed config beside the run's records, headed by the command line's overrides."""
    text = f"# python run.py {' '.join(overrides)}\n{OmegaConf.to_yaml(cfg)}"
    tmp = run_dir / f".config.yaml.{os.getpid()}.tmp"
    tmp.write_text(text)
    tmp.replace(run_dir / "config.yaml")


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> None:
    from runners.runner import run

    hc = HydraConfig.get()
    with open_dict(cfg):
        cfg.choices = {k: v for k, v in hc.runtime.choices.items() if "/" not in k}
    try:
        run_dir = run(cfg)
    except Exception as exc:
        message = user_error(exc)
        if message is None:
            raise
        if hc.mode == RunMode.MULTIRUN:
            _report_job_failure(message)  # the sweep goes on with its other jobs
            return
        discard_empty(Path(hc.runtime.output_dir), NEW_OUT_DIR)
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)
    save_config(run_dir, cfg, list(hc.overrides.task))


def sweep_failures(path: Path) -> list[tuple[int, str]]:
    """(pid of the job's process, its error line) for every failed sweep job."""
    rows = path.read_text().splitlines() if path.exists() else []
    return [(int(pid), line) for pid, _, line in (r.partition("\t") for r in rows)]


def quiet_sacct_stderr() -> None:
    """submitit polls `sacct` with its stderr on the terminal, so on a cluster without accounting every
    poll prints "Slurm accounting storage is disabled"; QuietSacct says it once instead."""
    try:
        from submitit.slurm.slurm import SlurmInfoWatcher
    except ImportError:
        return
    make = SlurmInfoWatcher._make_command

    def quiet(self: SlurmInfoWatcher) -> list[str] | None:
        command = make(self)
        return None if command is None else ["sh", "-c", '"$0" "$@" 2>/dev/null', *command]

    SlurmInfoWatcher._make_command = quiet


def cli(argv: list[str]) -> None:
    """run.py's command line: the pre-flight check of every job, then Hydra."""
    global NEW_OUT_DIR
    register_schemas()  # before anything composes: each preset extends its method's Config
    configs: list[DictConfig] = []
    problem = preflight(argv, configs)
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    if len(configs) == 1 and not any(a in ("-m", "--multirun") for a in argv):
        NEW_OUT_DIR = missing_top(Path(str(configs[0].run.out_dir)))
    failures = Path(tempfile.gettempdir()) / f"harness-sweep-{os.getpid()}.failures"
    os.environ[FAILURES_ENV] = str(failures)
    logging.getLogger("submitit").addFilter(QuietSacct())
    quiet_sacct_stderr()
    try:
        main()
    finally:  # also on Ctrl-C: the jobs that failed before it are named
        failed = sweep_failures(failures)
        failures.unlink(missing_ok=True)
        for pid, line in failed:
            if pid != os.getpid():  # jobs in other processes (submitit, SLURM) printed to their own logs
                print(line, file=sys.stderr)
    if failed:
        sys.exit(f"error: {len(failed)} sweep job(s) failed (each named in an 'error: job' line)")


if __name__ == "__main__":
    try:
        cli(sys.argv[1:])
    except KeyboardInterrupt:  # Ctrl-C: the locks were released and finished samples kept on the way out
        fresh_line = "\n" if sys.stderr.isatty() else ""  # after a progress bar cut mid-line
        print(
            f"{fresh_line}interrupted: stopped by Ctrl-C; finished samples are kept: rerun the same command "
            "to resume",
            file=sys.stderr,
        )
        sys.exit(130)  # 128 + SIGINT, as a shell reports it
