# Two commands on a fresh machine:
#   make demo   trains the email-sequence example on this machine's device
#   make test   lint, type check, the docs build and the test suite
# Before each commit, `make test-fast` (lint and the in-process tests) takes under two
# minutes; `make test` runs everything, as CI does.
# Both create .venv on first use. Without nvidia-smi, the pinned CPU torch from
# requirements-cpu.txt is installed first so that pip never pulls CUDA wheels.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
HAS_NVIDIA_SMI := $(shell command -v nvidia-smi >/dev/null 2>&1 && echo yes)

.PHONY: demo test test-fast lint typecheck docs pytest pytest-fast sizes bench clean-logs

$(STAMP): pyproject.toml requirements-cpu.txt
	$(PYTHON) -m venv $(VENV)
ifeq ($(HAS_NVIDIA_SMI),yes)
	@echo "nvidia-smi found: installing torch from the registry (CUDA build)"
else
	@echo "no nvidia-smi: installing the pinned CPU torch first"
	$(PY) -m pip install -q -r requirements-cpu.txt
endif
	$(PY) -m pip install -q -e '.[dev,docs,examples,plots,ray,trackers]'
	@touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/email_sequence/train.py

lint: $(STAMP)
	$(PY) -m ruff check core tests examples benchmarks gpu_utilization_mixed_precision_system.py run_mixed_precision_demo.py
	$(PY) -m ruff format --check core tests examples benchmarks gpu_utilization_mixed_precision_system.py run_mixed_precision_demo.py

typecheck: $(STAMP)
	$(PY) -m mypy

# The documentation site (docs/, mkdocs.yml): a broken link or anchor fails the build.
docs: $(STAMP)
	$(PY) -m mkdocs build --strict --quiet

pytest: $(STAMP)
	$(PY) -m pytest -q

# The in-process tests: none that starts an interpreter, a torchrun job or a Ray cluster, or
# is marked slow or plots (pyproject.toml lists the markers). make test runs those too.
FAST_TESTS := not distributed and not slow and not ray and not processes and not plots

pytest-fast: $(STAMP)
	$(PY) -m pytest -q -m "$(FAST_TESTS)"

test: lint typecheck docs pytest sizes

test-fast: lint pytest-fast

# Modules past 300 lines, longest first: a signal for review (does one do two jobs?), not a rule.
sizes: $(STAMP)
	$(PY) -m tests.module_sizes

bench: $(STAMP)
	$(PY) benchmarks/overhead.py

clean-logs:
	find logs -mindepth 1 ! -name .gitkeep -exec rm -rf {} +
