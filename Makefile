# Set-up and the two main jobs. Every target creates the virtual environment first (idempotent):
# torch is installed from the CPU wheel (torch==2.13.0) *before* the package, so the package's
# `torch>=2.13` requirement is already satisfied and no multi-GB CUDA build is pulled.
# GPU users: `make venv TORCH_SPEC="torch --index-url https://download.pytorch.org/whl/cu126"`.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: venv reproduce test test-all demo figs bench notebooks clean

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(TORCH_SPEC)
	$(BIN)/python -m pip install --quiet -e '.[all]'
	touch $@

reproduce: venv           ## the quick CPU reproduction: all figures + ./gapdyn_out/reproduce/REPORT.md
	$(BIN)/gapdyn reproduce

test: venv                ## the default test suite (slow experiments excluded)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

test-all: venv            ## everything, including the slow experiments
	$(BIN)/python -m pytest $(PYTEST_ARGS)

demo: venv
	$(BIN)/gapdyn demo

figs: venv
	$(BIN)/gapdyn figs

notebooks: venv           ## execute the notebooks and render them with their figures to docs/notebooks
	$(BIN)/python notebooks/render.py

bench: venv
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis gapdyn_out
