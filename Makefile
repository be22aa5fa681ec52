# Two entry points that work on a fresh machine: `make train` and `make test`.
# Each one creates/updates .venv, installs the CPU torch wheel when no CUDA GPU is
# present (an unpinned torch pulls a multi-GB CUDA build), then installs this package.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
CPU_TORCH := torch==2.13.0

.PHONY: setup train test test-all lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		echo "CUDA GPU found: torch comes from the package index"; \
	else \
		echo "no CUDA GPU: installing the CPU wheel $(CPU_TORCH)"; \
		$(PY) -m pip install -q "$(CPU_TORCH)"; \
	fi
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

train: setup
	$(PY) train.py

test: setup
	$(PY) -m pytest -m "not slow and not gpu" -q

test-all: setup
	$(PY) -m pytest -q

lint: setup
	$(PY) -m ruff check src tests experiments train.py eval.py

clean:
	rm -rf $(VENV) outputs multirun wandb .pytest_cache
