"""Bad command lines a user might type, each of which must end in exactly one `error:` line, a non-zero
exit, no traceback and nothing written (neither under the run's out dir nor in the repository).

`python -m tests.bad_inputs` runs every case through `run.py` and prints, per case, one of
clean / traceback / accepted (exit 0: the bad value was silently taken) / noisy (non-zero exit but
not one clean line) / wrote (something was written), then the counts. `tests/test_bad_inputs.py` runs
the same list in the default suite (the cases the pre-flight check refuses, in process; a few end to
end).

`{file}` in an argument becomes a path to an existing plain file, `{dir}` and `{folder}` an existing
folder, `{ro}` a folder on a read-only file system when the machine has one (the case is skipped
otherwise), and `{data:<name>}` a data file written from `DATA_FILES[<name>]` (a binary file, Latin-1
text, a fake .gz, MT-Bench rows with bad turns, ...); a case's `env` sets environment variables for
it, with the same placeholders.

`RECORD_CASES` (section `# damaged records`) damage the records of a real small run; they need a run
to damage, so `tests/test_damaged_records.py` runs them (not this CLI).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import gzip
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Case:
    args: tuple[str, ...]
    message: str  # a part of the expected `error:` line
    model: bool = False  # only refused after the model is loaded (the pre-flight check cannot see it)
    env: tuple[tuple[str, str], ...] = ()  # environment variables set for the case

    @property
    def id(self) -> str:
        return " ".join([*(f"{k}={v}" for k, v in self.env), *self.args])


def _c(message: str, *args: str, model: bool = False, env: dict[str, str] | None = None) -> Case:
    return Case(tuple(args), message, model, tuple((env or {}).items()))


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
    _c("run.compile", "run.compile=maybe"),
    _c("run.compile=true compiles aten GEMMs", "run.compile=true", "run.linear=onednn"),
    # paths
    _c("run.out_dir must be a folder path", "run.out_dir="),
    _c("run.out_dir must be a folder path", "run.out_dir=null"),
    _c("run.out_dir", "run.out_dir={file}"),
    _c("run.out_dir", "run.out_dir={file}/below"),
    _c("run.out_dir", "run.out_dir={ro}/records"),
    _c("run.out_dir", "run.out_dir=/proc/harness-records"),
    _c("not found", "task.data_path=/nonexistent/questions.jsonl"),
    _c("model.name=/nonexistent/model-folder not found", "model=hf", "model.name=/nonexistent/model-folder"),
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
    # a type the method's Config (core.options) does not declare, a key it does not have (added with +)
    _c("decoder.k must be an integer, got 'abc'", "decoder=fafo", "decoder.k=abc"),
    _c("decoder.tree must be true or false, got 'maybe'", "decoder=fafo", "decoder.tree=maybe"),
    _c("decoder.m must be an integer or null, got 2.5", "decoder=fafo", "decoder.m=2.5"),
    _c("kv.sinks must be an integer, got 'many'", "kv=streaming", "kv.sinks=many"),
    _c("unknown key decoder.kk; decoder has: block, max_matching_ngram_size", "decoder=pld", "+decoder.kk=3"),
    _c("unknown key kv.kk; kv has no settings", "kv=full", "+kv.kk=3"),
    _c("task.source must be one of", "task.source=nowhere"),
    _c("task.max_new_tokens must be an integer >= 1", "task.max_new_tokens=0"),
    # humaneval sandbox options
    _c("task.network must be one of auto, netns, audit", "task=humaneval", "task.network=bogus"),
    _c("task.timeout_s must be a number > 0 and <= 3600", "task=humaneval", "task.timeout_s=-1"),
    _c("task.timeout_s must be a number > 0 and <= 3600", "task=humaneval", "task.timeout_s=0"),
    _c("task.timeout_s must be a number > 0 and <= 3600", "task=humaneval", "task.timeout_s=abc"),
    _c("task.memory_mb must be an integer >= 32", "task=humaneval", "task.memory_mb=0"),
    _c("task.memory_mb must be an integer >= 32", "task=humaneval", "task.memory_mb=1.5"),
    _c("task.isolation must be one of auto, namespaces, process", "task=humaneval", "task.isolation=vm"),
    _c(
        "task.network=netns needs namespaces",
        "task=humaneval",
        "task.isolation=process",
        "task.network=netns",
    ),
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
    _c("decoder.skip_ratio must be a number >= 0 and < 1", "decoder=swift", "decoder.skip_ratio=1.5"),
    _c("decoder.max_draft must be an integer >= 1", "decoder=swift", "decoder.max_draft=0"),
    _c("decoder=swift drafts by skipping layers over the full cache", "decoder=swift", "kv=streaming"),
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
    # damaged data files
    # (refused in the pre-flight: a task.data_path is read and checked before the model loads)
    _c("holds a NUL byte at offset 4 (line 1)", "task.data_path={data:binary}"),
    _c("is not UTF-8: byte 0xe9 at offset 56 (line 1)", "task.data_path={data:latin1}"),
    _c("is not UTF-8: byte 0xe9 at offset 115 (line 2)", "task.data_path={data:latin1_line2}"),
    _c("is a folder, not a file", "task.data_path={folder}"),
    _c("/dev/null is a character device: give a file", "task.data_path=/dev/null"),
    _c("is named .gz but is not gzip-compressed", "task.data_path={data:fake_gz}"),
    _c("is gzip-compressed: name it questions.jsonl.gz", "task.data_path={data:gzip_unnamed}"),
    _c("is a damaged gzip archive", "task.data_path={data:cut_gz}"),
    _c("holds no rows", "task.data_path={data:empty}"),
    _c("holds no rows", "task.data_path={data:blank_lines}"),
    _c("malformed JSON at", "task.data_path={data:not_json}"),
    _c("expected a JSON object, got a list", "task.data_path={data:json_list}"),
    _c(
        "field 'turns' must be a non-empty list of non-empty strings, got a string",
        "task.data_path={data:turns_str}",
    ),
    _c(
        "field 'turns' must be a non-empty list of non-empty strings, got an empty list",
        "task.data_path={data:turns_empty}",
    ),
    _c(
        "field 'turns' must hold non-empty strings; its item 0 is a number",
        "task.data_path={data:turns_numbers}",
    ),
    _c(
        "field 'turns' must hold non-empty strings; its item 1 is an empty string",
        "task.data_path={data:turns_blank}",
    ),
    _c(
        "field 'turns' must be a non-empty list of non-empty strings, got null",
        "task.data_path={data:turns_null}",
    ),
    _c("field 'turns' is missing", "task.data_path={data:turns_missing}"),
    _c(
        "questions.jsonl:2: field 'turns' must hold non-empty strings",
        "task.data_path={data:turns_bad_line2}",
    ),
    _c("field 'question_id' is missing", "task.data_path={data:id_missing}"),
    _c("field 'question_id' must be a non-empty string, got a boolean", "task.data_path={data:id_bool}"),
    _c("sample id '1' appears twice", "task.data_path={data:id_twice}"),
    _c("field 'category' must be a string, got a number", "task.data_path={data:category_number}"),
    _c(
        "run.limit=5 exceeds the 1 samples of task mtbench",
        "run.limit=5",
        "task.data_path={data:one_question}",
    ),
    _c("field 'turns'", "-m", "run.seed=0,1", "task.data_path={data:turns_str}"),
    _c("is not UTF-8", "task=gsm8k", "task.data_path={data:latin1}"),
    _c("field 'question' is missing", "task=gsm8k", "task.data_path={data:turns_str}"),
    _c(
        "field 'question' must be a non-empty string, got a number",
        "task=gsm8k",
        "task.data_path={data:gsm8k_number}",
    ),
    _c("answer has no '#### <number>' line", "task=gsm8k", "task.data_path={data:gsm8k_no_marker}"),
    _c("is named .gz but is not gzip-compressed", "task=humaneval", "task.data_path={data:fake_gz}"),
    _c("holds a NUL byte", "task=multi_if", "task.data_path={data:binary}"),
    _c("is not UTF-8", "task=aime24", "task.data_path={data:latin1_json}"),
    _c("is not UTF-8: byte 0xe9", "task=pg19", "task.data_path={data:latin1_txt}"),
    _c("is a folder", "task=pg19", "task.data_path={folder}"),
    _c("field 'text' is missing", "task=pg19", "task.data_path={data:turns_str}"),
    _c(
        "field 'text' must be a non-empty string, got a number",
        "task=narrativeqa",
        "task.data_path={data:text_number}",
    ),
    _c("holds an empty list", "task=narrativeqa", "task.data_path={data:empty_list_json}"),
    _c("no document is long enough", "task=pg19", "task.data_path={data:short_txt}"),
    _c("is a damaged gzip archive", "task=pg19", "task.data_path={data:cut_gz}"),
    # caches and environment
    _c("is a file: set HARNESS_CACHE to a folder", "model=smollm2-135m", env={"HARNESS_CACHE": "{file}"}),
    _c("which is a file: set HARNESS_CACHE", "model=smollm2-135m", env={"HARNESS_CACHE": "{file}/below"}),
    _c("cannot be written (Read-only", "model=smollm2-135m", env={"HARNESS_CACHE": "{ro}/harness-cache"}),
    _c("cannot be written", "model=smollm2-135m", env={"HARNESS_CACHE": "/proc/harness-cache"}),
    _c("set HARNESS_CACHE to a folder", "model=qwen25-coder-0.5b", env={"HARNESS_CACHE": "{file}"}),
    _c(
        "set HARNESS_CACHE to a folder",
        "decoder=triforce",
        "draft=qwen25-coder-0.5b",
        env={"HARNESS_CACHE": "{file}"},
    ),
    _c("job 0 (", "-m", "model=smollm2-135m", "decoder=vanilla,pld", env={"HARNESS_CACHE": "{file}"}),
    _c(
        "is a file: set HARNESS_COST_CACHE to a folder",
        "decoder=pld_auto",
        env={"HARNESS_COST_CACHE": "{file}"},
    ),
    _c("which is a file: set HARNESS_COST_CACHE", "decoder=pld_auto", env={"HARNESS_COST_CACHE": "{file}/x"}),
    _c("cannot be written (Read-only", "decoder=pld_auto", env={"HARNESS_COST_CACHE": "{ro}/curves"}),
    _c("cannot be written", "decoder=lookahead_auto", env={"HARNESS_COST_CACHE": "/proc/curves"}),
    _c("set HARNESS_COST_CACHE to a folder", "decoder=fafo_auto", env={"HARNESS_COST_CACHE": "{file}"}),
    _c(
        "set HARNESS_COST_CACHE to a folder",
        "decoder=pld",
        "decoder.block=auto",
        env={"HARNESS_COST_CACHE": "{file}"},
    ),
    _c("job 1 (", "-m", "decoder=pld,pld_auto", env={"HARNESS_COST_CACHE": "{file}"}),
    _c("is a file: give a folder", "wandb.enabled=true", "wandb.dir={file}"),
    _c("which is a file", "wandb.enabled=true", "wandb.dir={file}/below"),
    _c("cannot be written (Read-only", "wandb.enabled=true", "wandb.dir={ro}/wandb"),
    _c("wandb.dir=/proc/wandb cannot be written", "wandb.enabled=true", "wandb.dir=/proc/wandb"),
    # early refusals
    _c("is a folder, not a file", "task.data_path={dir}"),
    _c("is a folder, not a file", "task=gsm8k", "task.data_path={dir}"),
    _c("is a folder, not a file", "task=humaneval", "task.data_path={dir}"),
    _c("is a folder, not a file", "task=pg19", "task.data_path={dir}"),
    _c(
        "task.data_path /nonexistent/aime.json not found",
        "task=aime24",
        "task.data_path=/nonexistent/aime.json",
    ),
    _c("not found", "task=narrativeqa", "task.data_path={file}/below.jsonl"),
    _c("not found", "task=multi_if", "task.data_path=/nonexistent/multi_if.jsonl"),
    _c("job 0 (", "-m", "run.seed=0,1", "task.data_path={dir}"),
    _c("is a file, not a folder", "model=hf", "model.name={file}"),
    _c("holds no model (no config.json)", "model=hf", "model.name={dir}"),
    _c("model.name=./no-such-model-folder not found", "model=hf", "model.name=./no-such-model-folder"),
    _c(
        "draft.name=/nonexistent/draft not found",
        "decoder=triforce",
        "draft=hf",
        "draft.name=/nonexistent/draft",
    ),
    _c("holds no model (no config.json)", "decoder=triforce", "draft=hf", "draft.name={dir}"),
    _c(
        "decoder.checkpoint=/nonexistent/draft not found",
        "decoder=longspec",
        "decoder.checkpoint=/nonexistent/draft",
    ),
    _c("is a file, not a folder", "decoder=longspec", "decoder.checkpoint={file}"),
    # a later turn that may overflow the context: refused before the first token, not after turn 0
    _c("turn 1: prompt of", "run.max_new_tokens=2000", model=True),
    # presets extend their method's Config schema (runners.schemas): a wrong type stops Hydra's own
    # composition, an option no preset names is still typed, a preset of the global package too
    _c(
        "decoder.beam_temperature must be a number, got 'warm'",
        "decoder=longspec_chain",
        "decoder.beam_temperature=warm",
    ),
    _c("kv.recent must be an integer or null, got 'some'", "kv=h2o", "kv.recent=some"),
    _c(
        "decoder.gamma1 must be an integer, got 'two'", "decoder=triforce", "draft=tiny", "decoder.gamma1=two"
    ),
    _c(
        "unknown key decoder.kk; decoder has: block, max_matching_ngram_size",
        "decoder=pld_auto",
        "decoder.kk=3",
    ),
    _c("decoder.k must be an integer, got 'abc'", "-m", "decoder=fafo,fafo_cpu", "decoder.k=abc"),
]

# damaged data files: what `{data:<name>}` writes, (file name, bytes)
_Q = '{"question_id": 1, "category": "writing", "turns": %s}\n'
DATA_FILES: dict[str, tuple[str, bytes]] = {
    "binary": ("questions.jsonl", b"\x89PNG\x00\x01\x02\xff\xfe"),
    "latin1": ("questions.jsonl", (_Q % '["Caf\u00e9?"]').encode("latin-1")),
    "latin1_line2": ("questions.jsonl", ((_Q % '["ok"]') + (_Q % '["Caf\u00e9?"]')).encode("latin-1")),
    "latin1_json": ("problems.json", '[{"question": "Caf\u00e9?", "answer": "1"}]'.encode("latin-1")),
    "latin1_txt": ("book.txt", "Caf\u00e9 ".encode("latin-1") * 10),
    "fake_gz": ("questions.jsonl.gz", (_Q % '["hi"]').encode()),
    "gzip_unnamed": ("questions.jsonl", gzip.compress((_Q % '["hi"]').encode(), mtime=0)),
    "cut_gz": ("questions.jsonl.gz", gzip.compress((_Q % '["hi"]').encode() * 50, mtime=0)[:40]),
    "empty": ("questions.jsonl", b""),
    "blank_lines": ("questions.jsonl", b"\n  \n\n"),
    "not_json": ("questions.jsonl", b"hello world\n"),
    "json_list": ("questions.jsonl", b"[1, 2]\n"),
    "turns_str": ("questions.jsonl", (_Q % '"hello"').encode()),
    "turns_empty": ("questions.jsonl", (_Q % "[]").encode()),
    "turns_numbers": ("questions.jsonl", (_Q % "[1, 2]").encode()),
    "turns_blank": ("questions.jsonl", (_Q % '["hi", "  "]').encode()),
    "turns_null": ("questions.jsonl", (_Q % "null").encode()),
    "turns_missing": ("questions.jsonl", b'{"question_id": 1}\n'),
    "turns_bad_line2": ("questions.jsonl", ((_Q % '["ok"]') + (_Q % '["ok", 7]')).encode()),
    "id_missing": ("questions.jsonl", b'{"turns": ["hi"]}\n'),
    "id_bool": ("questions.jsonl", b'{"question_id": true, "turns": ["hi"]}\n'),
    "id_twice": ("questions.jsonl", ((_Q % '["a"]') + (_Q % '["b"]')).encode()),
    "category_number": ("questions.jsonl", b'{"question_id": 1, "category": 3, "turns": ["hi"]}\n'),
    "one_question": ("questions.jsonl", (_Q % '["hi", "and?"]').encode()),
    "gsm8k_number": ("test.jsonl", b'{"question": 12, "answer": "#### 3"}\n'),
    "gsm8k_no_marker": ("test.jsonl", b'{"question": "2+1?", "answer": "3"}\n'),
    "text_number": ("docs.json", b'[{"text": 5}]'),
    "empty_list_json": ("docs.json", b"[]"),
    "short_txt": ("book.txt", b"A short book.\n"),
}


# damaged records: each case damages the folder of a real small run (`tests/test_damaged_records.py`).
# On a run with finished parts ("partial": one sample failed, so its parts are kept) a rerun must stop
# with one `error:` line naming the damaged file and what to remove, and write nothing. On a complete
# run ("complete") COMPLETE is no longer backed: a rerun resumes it with one line, `analysis.summary`
# skips it with one `warning:` line, and `make paper` refuses with one `error:` line, writing nothing.


def _cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _part(run: Path, sample: str, table: str) -> Path:
    return next((run / "parts").glob(f"{sample}-*.{table}.parquet"))


def _rewrite(path: Path, change: Callable[[pd.DataFrame], pd.DataFrame]) -> None:
    change(pd.read_parquet(path)).to_parquet(path, index=False)


def _no_provenance(run: Path) -> None:
    (run / "parts" / "provenance.json").unlink()


@dataclass(frozen=True)
class RecordCase:
    name: str
    run: str  # "partial" (finished parts kept) or "complete"
    damage: Callable[[Path], None]  # applied to the run's folder
    message: str  # a part of the expected error (warning) line


RECORD_CASES = [
    RecordCase("cut samples part", "partial", lambda r: _cut(_part(r, "s0", "samples")), "cannot be read"),
    RecordCase(
        "empty samples part", "partial", lambda r: _part(r, "s0", "samples").write_bytes(b""), "size is 0"
    ),
    RecordCase(
        "cut steps part", "partial", lambda r: _cut(_part(r, "s2", "steps")), "steps.parquet cannot be read"
    ),
    RecordCase(
        "garbage scores part",
        "partial",
        lambda r: _part(r, "s0", "scores").write_bytes(b"not parquet at all"),
        "scores.parquet cannot be read",
    ),
    RecordCase(
        "samples part without its error column",
        "partial",
        lambda r: _rewrite(_part(r, "s0", "samples"), lambda df: df.drop(columns=["error"])),
        "No match for FieldRef.Name(error)",
    ),
    RecordCase(
        "garbage provenance.json",
        "partial",
        lambda r: (r / "parts" / "provenance.json").write_text('{"git_sha": "abc'),
        "provenance.json cannot be read",
    ),
    RecordCase(
        "provenance.json not an object",
        "partial",
        lambda r: (r / "parts" / "provenance.json").write_text("[1, 2]"),
        "provenance.json cannot be read (not a JSON object)",
    ),
    RecordCase(
        "binary provenance.json",
        "partial",
        lambda r: (r / "parts" / "provenance.json").write_bytes(b"\xff\xfe\x00"),
        "provenance.json cannot be read",
    ),
    RecordCase(
        "cut runs.parquet, no provenance.json",
        "partial",
        lambda r: (_no_provenance(r), _cut(r / "runs.parquet")),
        "runs.parquet cannot be read",
    ),
    RecordCase(
        "runs.parquet without a row, no provenance.json",
        "partial",
        lambda r: (_no_provenance(r), _rewrite(r / "runs.parquet", lambda df: df.iloc[:0])),
        "runs.parquet cannot be read (no row)",
    ),
    RecordCase(
        "samples.parquet gone",
        "complete",
        lambda r: (r / "samples.parquet").unlink(),
        "samples.parquet is missing",
    ),
    RecordCase(
        "cut steps.parquet", "complete", lambda r: _cut(r / "steps.parquet"), "steps.parquet cannot be read"
    ),
    RecordCase(
        "scores.parquet gone",
        "complete",
        lambda r: (r / "scores.parquet").unlink(),
        "scores.parquet is missing",
    ),
    RecordCase(
        "cut runs.parquet", "complete", lambda r: _cut(r / "runs.parquet"), "runs.parquet cannot be read"
    ),
    RecordCase(
        "runs.parquet gone", "complete", lambda r: (r / "runs.parquet").unlink(), "runs.parquet is missing"
    ),
    RecordCase(
        "samples.parquet short of rows",
        "complete",
        lambda r: _rewrite(r / "samples.parquet", lambda df: df.head(2)),
        "samples.parquet holds 2 rows where COMPLETE counts 6",
    ),
    RecordCase(
        "steps.parquet short of rows",
        "complete",
        lambda r: _rewrite(r / "steps.parquet", lambda df: df.head(3)),
        "steps.parquet holds 3 rows where COMPLETE counts 30",
    ),
    RecordCase(
        "binary COMPLETE",
        "complete",
        lambda r: (r / "COMPLETE").write_bytes(b"\xff\xfe"),
        "COMPLETE cannot be read",
    ),
    RecordCase(
        "COMPLETE without counts",
        "complete",
        lambda r: (r / "COMPLETE").write_text("[1]\n"),
        "holds no row counts",
    ),
    RecordCase(
        "old COMPLETE, samples.parquet gone",
        "complete",
        lambda r: ((r / "COMPLETE").write_text("complete\n"), (r / "samples.parquet").unlink()),
        "samples.parquet is missing",
    ),
    RecordCase(
        "old COMPLETE, a sample short",
        "complete",
        lambda r: (
            (r / "COMPLETE").write_text("complete\n"),
            _rewrite(r / "samples.parquet", lambda df: df.head(4)),
        ),
        "samples.parquet holds 2 samples where runs.parquet's limit is 3",
    ),
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


def data_file(tmp: Path, name: str) -> str:
    """`DATA_FILES[name]` written under `tmp` (a folder of its own, so that two never clash)."""
    file_name, content = DATA_FILES[name]
    path = tmp / "data" / name / file_name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return str(path)


def _fill(text: str, tmp: Path, ro: str | None) -> str:
    text = re.sub(r"\{data:(\w+)\}", lambda m: data_file(tmp, m.group(1)), text)
    return (
        text.replace("{file}", str(tmp / "a-file"))
        .replace("{dir}", str(tmp / "a-dir"))
        .replace("{folder}", str(tmp / "a-folder"))
        .replace("{ro}", ro or "")
    )


def expand(case: Case, tmp: Path) -> tuple[list[str], Path] | None:
    """The case's arguments with its placeholders filled, plus the out dir it writes to (None when
    the case needs what this machine lacks)."""
    (tmp / "a-file").write_text("not a folder\n")
    (tmp / "a-dir").mkdir(exist_ok=True)
    (tmp / "a-folder").mkdir(exist_ok=True)
    needs_ro = any("{ro}" in a for a in (*case.args, *(v for _, v in case.env)))
    ro = readonly_dir() if needs_ro else None
    if needs_ro and ro is None:
        return None
    args = [_fill(a, tmp, ro) for a in case.args]
    out = tmp / "out"
    if not any(a.startswith("run.out_dir=") for a in args):
        args.append(f"run.out_dir={out}")
    return args, out


def expand_env(case: Case, tmp: Path) -> dict[str, str]:
    """The case's environment variables with their placeholders filled (after `expand`)."""
    ro = readonly_dir() if any("{ro}" in v for _, v in case.env) else None
    return {k: _fill(v, tmp, ro) for k, v in case.env}


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
    env.update(expand_env(case, tmp))
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
