VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-long test-gpu test-torch-device gpu-checks test-slurm lint bench paper paper-runs paper-runs-slice8 paper-runs-qwen paper-rerun-stale train-longspec longspec-figure4
demo:            ## install, then run the default job (SmolLM2, vanilla, full KV, MT-Bench)
	scripts/install.sh
	$(PY) run.py

TEST_WORKERS ?= 2
test:            ## install with test extras, then the CPU suite (no hub): tests/ without the slow checks, $(TEST_WORKERS) workers
	scripts/install.sh --test
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow and not gpu"; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests (exit 5): failing" >&2; fi; exit $$rc

test-long:       ## the long checks (full MT-Bench losslessness on SmolLM2, long contexts) and the research probes' tests
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "slow and not gpu" tests
	$(PY) -m pytest -q research

test-slurm:      ## start a local single-node SLURM (root, apt-get), then the sweep/cancel/resume test (its jobs only; cleans up on timeout)
	scripts/slurm_local.sh start
	timeout -k 60 1800 $(PY) -m pytest -q -m slurm -rs

test-gpu:        ## the engine, KV-policy, sparse-attention and lossless suites on a CUDA device (fp32, TF32 off)
	HARNESS_TEST_DEVICE=cuda $(PY) -m pytest -q -m "not slow" $$(cat tests/gpu_suites.txt)

TORCH_DEVICE ?= torch==2.11.0
test-torch-device:  ## make test-gpu's suites' CPU parts under the GPU machines' torch (2.11, CPU build) in .venv-torch-device
	VENV=.venv-torch-device TORCH_SPEC="$(TORCH_DEVICE)" TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu scripts/install.sh --test
	.venv-torch-device/bin/python -c "import torch; assert torch.__version__.startswith('$(subst torch==,,$(TORCH_DEVICE))'), torch.__version__"
	.venv-torch-device/bin/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not slow and not gpu" $$(cat tests/gpu_suites.txt) tests/test_emulation_checks.py

gpu-checks:      ## on a CUDA box: test-gpu, the CUDA benchmarks and the scale=paper_slice8 FAFO sweep into GPU_OUT
	PY=$(PY) scripts/gpu_checks.sh $${GPU_OUT:-gpu-checks}

bench:           ## the speed claims, one script each (run one at a time)
	for b in block_cost bench_block_cost bench_vanilla_vs_hf bench_kv_attention bench_lookahead bench_fafo bench_selfspec bench_longspec bench_sfi bench_block_auto; do \
	  flock results/bench/.lock $(PY) -m benchmarks.$$b || exit 1; done
	flock results/bench/.lock $(PY) -m benchmarks.bench_block_cost --context 4096 --sdpa-column

train-longspec:  ## retrain the shipped LongSpec draft from conf/train/longspec_smollm2.yaml (2-core CPU: ~7.5 h; rerun resumes)
	scripts/install.sh
	$(PY) -m training.longspec.recipe conf/train/longspec_smollm2.yaml

longspec-figure4:  ## LongSpec Figure 4 (loss on long data with and without Anchor-Offset): two runs, their logs committed
	$(PY) -m training.longspec.recipe conf/train/longspec_figure4.yaml
	$(PY) -m analysis.longspec_figure4

paper:           ## results/paper/REPORT.md (+ figures) from the committed records: no model, no network
	$(PY) -m analysis.paper

paper-runs:      ## the CPU runs behind the report (conf/paper_runs.yaml; ~7 h on 2 cores; complete runs are skipped)
	$(PY) -m runners.paper_runs --group cpu
	$(PY) -m analysis.paper

paper-runs-slice8: ## FAFO Table 1 and Figure 1 at the paper's settings on 8 MT-Bench questions, fp32 (~75 min)
	$(PY) -m runners.paper_runs --group slice8
	$(PY) -m analysis.paper

paper-runs-qwen: ## the report's runs on the offline Qwen2.5-Coder models (scripts/install.sh --qwen --qwen15)
	$(PY) -m runners.paper_runs --group qwen qwen15
	$(PY) -m analysis.paper

paper-rerun-stale: ## rerun, slice by slice at this commit, the report's runs from mixed or uncommitted code (MINUTES=60)
	$(PY) -m runners.paper_runs --group cpu slice8 qwen qwen15 --stale --rerun --max-minutes $${MINUTES:-60}
	$(PY) -m analysis.paper

lint:
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
