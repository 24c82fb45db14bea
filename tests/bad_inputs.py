"""Bad command lines a user might type, each of which must end in exactly one `error:` line, a non-zero
exit, no traceback and nothing written (neither under the run's out dir nor in the repository).

`python -m tests.bad_inputs` runs every case through `run.py` and prints, per case, one of
clean / traceback / accepted (exit 0: the bad value was silently taken) / noisy (non-zero exit but
not one clean line) / wrote (something was written), then the counts. `tests/test_bad_inputs.py` runs
the same list in the default suite (the cases the pre-flight check refuses, in process; a few end to
end).

`{file}` in an argument becomes a path to an existing plain file, `{ro}` a folder on a read-only file
system when the machine has one (the case is skipped otherwise).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    message: str  # a part of the expected `error:` line
    model: bool = False  # only refused after the model is loaded (the pre-flight check cannot see it)

    @property
    def id(self) -> str:
        return " ".join(self.args)


def _c(message: str, *args: str, model: bool = False) -> Case:
    return Case(tuple(args), message, model)


CASES = [
    # run.* types and ranges
    _c("run.seed must be an integer >= 0", "run.seed=abc"),
    _c("run.seed must be an integer >= 0", "run.seed=1.5"),
    _c("run.seed must be an integer >= 0", "run.seed=-1"),
    _c("run.seed must be an integer >= 0", "run.seed=true"),
    _c("run.limit must be an integer >= 1", "run.limit=abc"),
    _c("run.limit must be an integer >= 1", "run.limit=0"),
    _c("run.limit must be an integer >= 1", "run.limit=1.5"),
    _c("run.limit must be an integer >= 1", "run.limit=true"),
    _c("run.limit must be an integer >= 1", "run.limit=[1,2]"),
    _c("run.limit=100000 exceeds", "run.limit=100000", model=True),
    _c("task.limit must be an integer >= 1", "task.limit=0"),
    _c("task.limit must be an integer >= 1", "task.limit=abc"),
    _c("run.max_new_tokens must be an integer >= 1", "run.max_new_tokens=0"),
    _c("run.max_new_tokens must be an integer >= 1", "run.max_new_tokens=-5"),
    _c("run.max_new_tokens must be an integer >= 1", "run.max_new_tokens=1.5"),
    _c("exceeds the model context", "run.max_new_tokens=100000", model=True),
    _c("run.threads must be an integer >= 1 and <=", "run.threads=0"),
    _c("run.threads must be an integer >= 1 and <=", "run.threads=abc"),
    _c("run.threads must be an integer >= 1 and <=", "run.threads=100000"),
    _c("run.prefill_chunk must be an integer >= 1", "run.prefill_chunk=0"),
    _c("run.prefill_chunk must be an integer >= 1", "run.prefill_chunk=1.5"),
    _c("run.warmup must be true or false", "run.warmup=maybe"),
    _c("run.warmup_s must be a number >= 0", "run.warmup_s=-1"),
    _c("run.warmup_s must be a number >= 0", "run.warmup_s=abc"),
    _c("run.audit must be true or false", "run.audit=maybe"),
    _c("run.stratify must be true or false", "run.stratify=maybe"),
    _c("run.keep_steps must be true or false", "run.keep_steps=maybe"),
    _c("run.count_syncs must be an integer >= 0", "run.count_syncs=-1"),
    _c("run.count_syncs must be an integer >= 0", "run.count_syncs=few"),
    _c("run.linear must be one of aten, onednn, auto", "run.linear=fast"),
    _c("run.cuda_graphs must be true, false, auto or emulate", "run.cuda_graphs=maybe"),
    _c("run.cuda_graphs=true needs a CUDA device", "run.cuda_graphs=true", "model.device=cpu"),
    # paths
    _c("run.out_dir must be a folder path", "run.out_dir="),
    _c("run.out_dir must be a folder path", "run.out_dir=null"),
    _c("run.out_dir", "run.out_dir={file}"),
    _c("run.out_dir", "run.out_dir={file}/below"),
    _c("run.out_dir", "run.out_dir={ro}/records"),
    _c("run.out_dir", "run.out_dir=/proc/harness-records"),
    _c("not found", "task.data_path=/nonexistent/questions.jsonl"),
    _c("cannot load model", "model=hf", "model.name=/nonexistent/model-folder", model=True),
    # model and devices
    _c("model.device", "model.device=cuda"),
    _c("model.device", "model.device=cuda:1"),
    _c("model.device", "model.device=tpu"),
    _c("model.device", "model.device=mps"),
    _c("model.device", "model.device=3"),
    _c("model.dtype must be one of", "model.dtype=float64"),
    _c("model.dtype must be one of", "model.dtype=int8"),
    _c("float16 is very slow on CPU", "model.dtype=float16", "model.device=cpu"),
    _c("model.source must be one of", "model.source=weird"),
    _c("model.arch must be one of", "model.arch=gpt2"),
    _c("decoder.backend=flash needs a CUDA device", "decoder=fafo", "decoder.backend=flash"),
    _c("decoder.backend must be one of", "decoder=fafo", "decoder.backend=nonsense"),
    # unknown groups, options and keys
    _c("unknown model 'nope'", "model=nope"),
    _c("unknown decoder 'nope'", "decoder=nope"),
    _c("unknown kv 'nope'", "kv=nope"),
    _c("unknown task 'nope'", "task=nope"),
    _c("unknown launcher 'nope'", "launcher=nope"),
    _c("unknown experiment 'nope'", "experiment=nope"),
    _c("unknown scale 'nope'", "scale=nope"),
    _c("unknown draft 'nope'", "draft=nope"),
    _c("unknown key foo", "+foo=1"),
    _c("unknown key foo", "foo=1"),
    _c("unknown key run.sed", "run.sed=1"),
    _c("unknown key sampling.seed", "sampling.seed=1"),
    _c("unknown key wandb.projet", "wandb.projet=x"),
    _c("run is a section, not a value", "run=abc"),
    _c("cannot parse", "run.limit=1)"),
    _c("cannot parse", "decoder"),
    # other sections
    _c("sampling.top_k must be an integer >= 0", "sampling.top_k=1.5"),
    _c("sampling.top_p must be a number in (0, 1]", "sampling.top_p=0"),
    _c("sampling.temperature must be a number >= 0", "sampling.temperature=true"),
    _c("wandb.enabled must be true or false", "wandb.enabled=maybe"),
    _c("wandb.mode must be one of", "wandb.mode=sometimes"),
    _c("block must be one of fixed, auto", "decoder=fafo", "decoder.block=sometimes"),
    _c("decoder.k must be an integer >= 1", "decoder=fafo", "decoder.k=abc"),
    _c("task.source must be one of", "task.source=nowhere"),
    _c("task.max_new_tokens must be an integer >= 1", "task.max_new_tokens=0"),
    # decoder and policy settings
    _c("decoder.N must be an integer >= 3", "decoder=lookahead", "decoder.N=0"),
    _c("decoder.W must be an integer >= 1", "decoder=lookahead", "decoder.W=-1"),
    _c("decoder.G must be an integer >= 1", "decoder=lookahead", "decoder.G=0"),
    _c("decoder.k must be an integer >= 1", "decoder=fafo", "decoder.k=0"),
    _c("decoder.n must be an integer >= 1", "decoder=fafo", "decoder.n=0"),
    _c("decoder.pool_capacity must be an integer >= 1", "decoder=fafo", "decoder.pool_capacity=0"),
    _c("decoder.num_tokens must be an integer >= 1", "decoder=pld", "decoder.num_tokens=0"),
    _c(
        "decoder.max_matching_ngram_size must be an integer >= 1",
        "decoder=pld",
        "decoder.max_matching_ngram_size=0",
    ),
    _c("decoder.gamma must be an integer >= 1", "decoder=selfspec", "decoder.gamma=0"),
    _c("decoder.gamma1 must be an integer >= 1", "decoder=triforce", "draft=tiny", "decoder.gamma1=0"),
    _c("decoder.gamma2 must be an integer >= 1", "decoder=triforce", "draft=tiny", "decoder.gamma2=-1"),
    _c("decoder=sfi needs kv=sfi", "decoder=sfi"),
    _c("k (entries selected per KV head) must be a positive integer", "decoder=sfi", "kv=sfi", "kv.k=0"),
    _c("sinks must be a non-negative integer", "decoder=sfi", "kv=sfi", "kv.sinks=-1"),
    _c("window must be a non-negative integer", "decoder=sfi", "kv=sfi", "kv.window=-4"),
    _c("lambda_clip must be in [0, 1]", "decoder=sfi", "kv=sfi", "kv.lambda_clip=1.5"),
    _c("triggers must be a non-empty list", "decoder=sfi", "kv=sfi", "decoder.triggers=[]"),
    _c("budget_frac must be in (0, 1]", "kv=streaming", "kv.budget_frac=2"),
    _c("must exceed the chunk size", "kv=retrieval", "kv.budget=8"),
    _c("dense_layers must be a non-negative integer", "kv=retrieval", "kv.dense_layers=-1"),
    _c("unknown key kv.backend; kv has no settings", "kv.backend=sliced"),  # kv=full
    _c(
        "unknown key decoder.kk; decoder has: backend, block, fumble_sees_last, generator_share, k,",
        "decoder=fafo",
        "decoder.kk=3",
    ),
    _c("unknown key run.limitt; run has: audit,", "run.limitt=2"),
    _c("unknown key run.limitt; run has:", "+run.limitt=2"),
    _c("unknown key sampling.temp; sampling has: temperature, top_k, top_p", "+sampling.temp=1"),
    _c("sampling.temperature must be a number >= 0", "sampling.temperature=-1"),
    _c("sampling.temperature must be a number >= 0", "sampling.temperature=abc"),
    _c("sampling.top_p must be a number in (0, 1]", "sampling.top_p=2"),
    _c("sampling.top_k must be an integer >= 0", "sampling.top_k=-3"),
    _c("run.limit must be an integer >= 1", "run.limit=-1"),
    _c("run.max_new_tokens must be an integer >= 1", "run.max_new_tokens=abc"),
    # refused once the runner builds the model, its draft or the decoder
    _c("model.name is required", "model=hf", model=True),
    _c("draft=self_layers: layers must be an integer in [1, 1], got 4", "decoder=triforce", model=True),
    _c(
        "draft=tiny drafts for a hierarchical decoder: use it with decoder=triforce",
        "decoder=vanilla",
        "draft=tiny",
        model=True,
    ),
    _c(
        "exceeds the draft model's context (4096)",
        "decoder=triforce",
        "draft=tiny",
        "draft.budget=4090",
        model=True,
    ),
    _c("need draft.room >= 10", "decoder=triforce", "draft=tiny", "draft.room=4", model=True),
    _c("draft=hf needs draft.name", "decoder=triforce", "draft=hf", model=True),
    # sweeps: refused as a whole, before any job runs
    _c("decoder.k", "-m", "decoder=vanilla,fafo", "decoder.k=0"),
    _c("run.limit must be an integer >= 1", "-m", "run.limit=1,0"),
    _c("run.seed must be an integer >= 0", "-m", "run.seed=1,abc"),
    _c("unknown decoder 'nope'", "-m", "decoder=vanilla,nope"),
    _c("model.device", "-m", "model.device=cpu,cuda"),
    _c("run.audit must be true or false", "-m", "run.audit=true,maybe"),
    _c("run.out_dir", "-m", "run.seed=0,1", "run.out_dir={file}"),
    _c("decoder.k must be an integer >= 1", "-m", "decoder=fafo", "decoder.k=0,1"),
    _c("unknown key run.sed", "-m", "run.sed=1,2"),
]


_MOUNTED: list[str] = []


def _mount_readonly() -> str | None:
    """A small read-only tmpfs in a fresh temporary folder (root only), unmounted at exit."""
    if _MOUNTED:
        return _MOUNTED[0]
    if os.geteuid() != 0:
        return None
    where = tempfile.mkdtemp(prefix="harness-ro-")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", where], capture_output=True)
    if done.returncode != 0:
        os.rmdir(where)
        return None
    _MOUNTED.append(where)

    def unmount() -> None:
        subprocess.run(["umount", where], capture_output=True)
        with contextlib.suppress(OSError):
            os.rmdir(where)

    atexit.register(unmount)
    return where


def readonly_dir() -> str | None:
    """A folder on a read-only file system of this machine: one already mounted, else a read-only
    tmpfs mounted for the test (as root); None where neither is possible."""
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) > 3 and "ro" in parts[3].split(",") and Path(parts[1]).is_dir():
            if parts[1].startswith(("/proc", "/sys", "/dev", "/mnt")):
                continue
            return parts[1]
    return _mount_readonly()


def expand(case: Case, tmp: Path) -> tuple[list[str], Path] | None:
    """The case's arguments with its placeholders filled, plus the out dir it writes to (None when
    the case needs what this machine lacks)."""
    plain = tmp / "a-file"
    plain.write_text("not a folder\n")
    ro = readonly_dir()
    args = []
    for a in case.args:
        if "{ro}" in a and ro is None:
            return None
        args.append(a.replace("{file}", str(plain)).replace("{ro}", ro or ""))
    out = tmp / "out"
    if not any(a.startswith("run.out_dir=") for a in args):
        args.append(f"run.out_dir={out}")
    return args, out


def hydra_dirs() -> set[Path]:
    """Hydra's default output folders in the repository (a rejected input must add none)."""
    return {p for top in ("outputs", "multirun") for p in (REPO / top).glob("*/*")}


def classify(res: subprocess.CompletedProcess, wrote: list[str]) -> str:
    err = res.stderr
    if "Traceback" in err or "HYDRA_FULL_ERROR" in err or "Error executing job" in err:
        return "traceback"
    if res.returncode == 0:
        return "accepted"
    lines = [line for line in err.splitlines() if line.strip()]
    if len(lines) != 1 or not lines[0].startswith("error:"):
        return "noisy"
    return "wrote" if wrote else "clean"


def run_case(case: Case, tmp: Path) -> tuple[str, str]:
    """(outcome, the last stderr line) of one case, run through run.py with debug=quick."""
    filled = expand(case, tmp)
    if filled is None:
        return "skipped", "no read-only file system here"
    args, out = filled
    before = hydra_dirs()
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    flags = [a for a in args if a.startswith("-")]  # Hydra takes -m before the overrides
    cmd = [sys.executable, str(REPO / "run.py"), *flags, "debug=quick", *[a for a in args if a not in flags]]
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600, env=env)
    mine = [p for p in hydra_dirs() - before if str(tmp) in _read(p / ".hydra" / "overrides.yaml")]
    wrote = [str(p) for p in mine] + ([str(out)] if out.exists() and any(out.iterdir()) else [])
    if out.exists() and not wrote:
        wrote = [f"{out} (empty)"]
    last = next((line for line in reversed(res.stderr.splitlines()) if line.strip()), "")
    return classify(res, wrote), last[:200] + (f"  [wrote {wrote[0]}]" if wrote else "")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-k", default="", help="only the cases whose arguments contain this text")
    args = ap.parse_args(argv)
    counts: dict[str, int] = {}
    for i, case in enumerate(c for c in CASES if args.k in c.id):
        with tempfile.TemporaryDirectory(prefix="bad-input-") as tmp:
            outcome, last = run_case(case, Path(tmp))
        counts[outcome] = counts.get(outcome, 0) + 1
        print(f"{i:3d} {outcome:9s} {case.id:45s} {last}", flush=True)
    print(" ".join(f"{k}={v}" for k, v in sorted(counts.items())))
    return 0 if set(counts) <= {"clean", "skipped"} else 1


if __name__ == "__main__":
    sys.exit(main())
