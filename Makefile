# Two entry points that work on a fresh machine: `make train` and `make test`.
# Each one creates/updates .venv, installs the CPU torch wheel when no CUDA GPU is
# present (an unpinned torch pulls a multi-GB CUDA build), then installs this package.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
CPU_TORCH := torch==2.13.0
# data.streaming's engine; its torchvision requirement would replace the CPU torch with a
# CUDA build, so on CPU it is installed without it (its streaming never imports it): its
# other requirements first, then litdata alone, last, so that pip's check of what is
# installed has no later install to report "litdata requires torchvision" on. (A later
# `pip install` into .venv may still print that line: it is expected on CPU.)
LITDATA := litdata==0.2.76
LITDATA_DEPS := boto3 filelock lightning-utilities numpy obstore requests tifffile urllib3

.PHONY: setup train test test-all test-slurm lint clean

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
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(PY) -m pip install -q -e ".[dev,streaming]"; \
	else \
		$(PY) -m pip install -q $(LITDATA_DEPS); \
		$(PY) -m pip install -q --no-deps "$(LITDATA)"; \
	fi
	touch $@

setup: $(VENV)/.installed

train: setup
	$(PY) train.py

test: setup
	$(PY) -m pytest -m "not slow and not gpu and not slurm" -q

test-all: setup
	$(PY) -m pytest -m "not slurm" -q

# The SLURM tier: against a running cluster (.ci/slurm/start.sh, SLURM_CONF exported), with
# the submitit launcher installed (the slurm extra).
test-slurm: setup
	$(PY) -m pip install -q -e ".[dev,slurm]"
	mkdir -p outputs  # the tier's temporary files: outputs/slurm-tier, kept apart from other runs
	$(PY) -m pytest -m slurm -q --basetemp=outputs/slurm-tier

lint: setup
	$(PY) -m ruff check src tests experiments testing train.py eval.py

clean:
	rm -rf $(VENV) outputs multirun wandb .pytest_cache
