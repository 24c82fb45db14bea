VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: demo test lint bench clean-results
demo:            ## install, then run the default job (SmolLM2, vanilla, full KV, MT-Bench)
	scripts/install.sh
	$(PY) run.py

test:            ## install with test extras, then run the suite
	scripts/install.sh --test
	$(PY) -m pytest -q

lint:
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
