VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-slow test-gpu gpu-checks test-slurm lint bench paper paper-runs paper-runs-slice8 paper-runs-qwen paper-runs-qwen15 train-longspec longspec-figure4
demo:            ## install, then run the default job (SmolLM2, vanilla, full KV, MT-Bench)
	scripts/install.sh
	$(PY) run.py

test:            ## install with test extras, then run the suite (CPU, no hub; slow tests excluded)
	scripts/install.sh --test
	$(PY) -m pytest -q -m "not slow and not gpu"; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests (exit 5): failing" >&2; fi; exit $$rc

test-slow:       ## the long checks: full MT-Bench losslessness on SmolLM2 etc.
	$(PY) -m pytest -q -m slow

test-slurm:      ## start a local single-node SLURM (root, apt-get), then the sweep/cancel/resume test
	scripts/slurm_local.sh start
	$(PY) -m pytest -q -m slurm -rs

test-gpu:        ## the engine, KV-policy, sparse-attention and lossless suites on a CUDA device (fp32, TF32 off)
	HARNESS_TEST_DEVICE=cuda $(PY) -m pytest -q -m "not slow" $$(cat tests/gpu_suites.txt)

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

RECORDS := run.out_dir=results/paper/records
CPU_T10 := run.limit=2 run.max_new_tokens=64 model.dtype=float32
FAFO_CPU := fafo_baselines fafo_table1 fafo_table12 fafo_table11 fafo_figure1 fafo_figure1_lookahead fafo_table2
paper-runs:      ## the CPU-scale runs behind the report (resumable: complete runs are skipped), one job at a time
	for e in $(FAFO_CPU); do $(PY) run.py -m experiment=$$e scale=cpu $(RECORDS) || exit 1; done
	$(PY) run.py -m experiment=fafo_baselines scale=cpu task=multi_if decoder=vanilla $(RECORDS)
	$(PY) run.py -m experiment=fafo_table13_frac scale=cpu $(RECORDS)
	$(PY) run.py -m experiment=block_auto scale=cpu $(RECORDS)
	$(PY) run.py experiment=triforce_pg19_vanilla_cpu $(RECORDS)
	for e in triforce_table1_cpu triforce_table8a_cpu triforce_table8b_cpu triforce_figure6a_cpu \
	  triforce_figure6b_cpu; do $(PY) run.py -m experiment=$$e $(RECORDS) || exit 1; done
	$(PY) run.py -m experiment=triforce_table1_cpu kv=retrieval decoder.rebuild_every=1 $(RECORDS)
	for e in fafo_table10_baselines fafo_table10_triforce fafo_table10; do \
	  $(PY) run.py -m experiment=$$e $(RECORDS) $(CPU_T10) || exit 1; done
	for e in sfi_table4_dense_cpu sfi_table4_sfi_cpu sfi_table4_chunkkv_cpu sfi_table4_kvpress_cpu \
	  sfi_figure4_dense_cpu sfi_figure4_cpu sfi_table6_cpu sfi_table7a_cpu sfi_table7b_cpu; do \
	  $(PY) run.py -m experiment=$$e $(RECORDS) || exit 1; done
	for e in longspec_table1_cpu longspec_table1_magicdec_cpu longspec_table1_draftless_cpu \
	  longspec_table2_cpu longspec_tau_prompts_cpu longspec_tau_qa_cpu longspec_tau_summary_cpu; do \
	  $(PY) run.py -m experiment=$$e $(RECORDS) || exit 1; done
	$(PY) -m analysis.paper

SLICE8 := scale=paper_slice8 model.dtype=float32 $(RECORDS)
paper-runs-slice8: ## FAFO Table 1 and Figure 1's n sweep at the paper's own settings on 8 MT-Bench questions, exact in fp32 on this CPU (~75 min on 2 cores; resumable)
	$(PY) run.py -m experiment=fafo_baselines task=mtbench $(SLICE8)
	$(PY) run.py -m experiment=fafo_table1 $(SLICE8)
	$(PY) run.py -m experiment=fafo_figure1 $(SLICE8)
	$(PY) -m analysis.paper

QWEN := model=qwen25-coder-0.5b $(RECORDS)
QWEN_NIAH := $(QWEN) task=longbench_ruler_niah
paper-runs-qwen: ## the report's runs on Qwen2.5-Coder-0.5B (needs scripts/install.sh --qwen): TriForce Table 1, SFI Table 4 (needle and QA), SFI Table 7a on the needle task
	$(PY) run.py -m experiment=triforce_table1_qwen_cpu $(RECORDS)
	$(PY) run.py experiment=triforce_table1_qwen_cpu kv=retrieval kv.gqa_score=prob $(RECORDS)
	$(PY) run.py experiment=triforce_table1_qwen_cpu kv=retrieval decoder.rebuild_every=1 $(RECORDS)
	$(PY) run.py -m experiment=sfi_table4_dense_cpu $(QWEN)
	$(PY) run.py -m experiment=sfi_table4_sfi_cpu $(QWEN)
	$(PY) run.py -m experiment=sfi_table4_chunkkv_cpu $(QWEN)
	$(PY) run.py -m experiment=sfi_table4_kvpress_cpu kv.press=SnapKVPress,StreamingLLMPress,TOVAPress $(QWEN)
	$(PY) run.py -m experiment=sfi_table7a_cpu kv=sfi_keep50 kv.alpha_cross=0.0,0.35 run.limit=12 $(QWEN_NIAH)
	$(PY) -m analysis.paper

QWEN15 := model=qwen25-coder-1.5b $(RECORDS)
paper-runs-qwen15: ## the report's runs on Qwen2.5-Coder-1.5B (needs scripts/install.sh --qwen and --qwen15): TriForce Table 1 on the needle and PG-19 tasks, TriForce with the 0.5B as its draft model (Table 8 at gamma1=2, and the gamma2 sweep with the cache rebuilt every verification)
	$(PY) run.py -m experiment=triforce_table1_qwen_cpu $(QWEN15)
	$(PY) run.py experiment=triforce_table1_qwen_cpu kv=retrieval kv.gqa_score=prob $(QWEN15)
	$(PY) run.py experiment=triforce_table1_qwen_cpu kv=retrieval decoder.rebuild_every=1 $(QWEN15)
	$(PY) run.py -m experiment=triforce_table1_qwen_cpu task=pg19 $(QWEN15)
	$(PY) run.py experiment=triforce_table1_qwen_cpu task=pg19 kv=retrieval decoder.rebuild_every=1 $(QWEN15)
	$(PY) run.py experiment=triforce_pg19_vanilla_cpu $(QWEN15)
	$(PY) run.py experiment=triforce_table8a_cpu draft=qwen25-coder-0.5b decoder.gamma1=2 $(QWEN15)
	$(PY) run.py experiment=triforce_table8a_cpu draft=qwen25-coder-0.5b decoder.gamma1=2 decoder.rebuild_every=1 $(QWEN15)
	$(PY) run.py -m experiment=triforce_table8b_cpu draft=qwen25-coder-0.5b decoder.rebuild_every=1 decoder.gamma2=2,4,8 $(QWEN15)
	$(PY) -m analysis.paper

lint:
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
