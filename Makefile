VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test test-slow lint bench
demo:            ## install, then run the default job (SmolLM2, vanilla, full KV, MT-Bench)
	scripts/install.sh
	$(PY) run.py

test:            ## install with test extras, then run the suite (CPU, no hub; slow tests excluded)
	scripts/install.sh --test
	$(PY) -m pytest -q -m "not slow and not gpu"

test-slow:       ## the long checks: full MT-Bench losslessness on SmolLM2 etc.
	$(PY) -m pytest -q -m slow

bench:           ## the speed claims, one script each (run one at a time)
	$(PY) -m benchmarks.bench_vanilla_vs_hf

lint:
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
