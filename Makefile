# Set-up and entry points. Every target creates .venv if it is missing and
# installs torch==2.13.0 first (so pip never resolves a newer, CUDA-laden torch),
# then this project with its extras.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION := 2.13.0
EXTRAS ?= dev
comma := ,
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: install demo test test-scatter lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install torch==$(TORCH_VERSION)
	$(BIN)/python -m pip install -e '.[$(EXTRAS)]'
	touch $@

install: $(STAMP)

## The main job: the Moon comparison (metric, l2, dot, gat; 10 seeds each).
demo: install
	$(BIN)/pyg-metric-attn experiment moon --seeds 10 --out runs/moon

## Lint and the test suite.
test: install
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

## The suite again with the optional torch-scatter installed (it builds from
## source against the installed torch, ~6 min; tests then cover both paths).
test-scatter: install
	$(BIN)/python -m pip install --no-build-isolation torch-scatter
	$(MAKE) test

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
