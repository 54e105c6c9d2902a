# Set-up and entry points. Every target creates .venv if it is missing and
# installs torch==2.13.0 first (so pip never resolves a newer, CUDA-laden torch),
# then this project with the extras it needs: `make demo` [experiments] (which
# includes [mesh]), `make test` also [dev] and [gpu] and [sampling].
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION := 2.13.0
comma := ,
DEMO_EXTRAS := experiments
TEST_EXTRAS := dev,gpu,experiments
DOCS_EXTRAS := experiments,docs
EXTRAS ?= $(TEST_EXTRAS)
# One stamp per set of extras, e.g. .venv/.installed-dev-gpu-experiments.
stamp = $(VENV)/.installed-$(subst $(comma),-,$(1))

.PHONY: install demo test test-core test-gpu gpu-bundle check-package docs lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed-%: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install torch==$(TORCH_VERSION)
	$(BIN)/python -m pip install -e '.[$(subst -,$(comma),$*)]'
	touch $@

install: $(call stamp,$(EXTRAS))

# The [sampling] extra (torch-scatter, torch-sparse: NeighborLoader, SparseTensor
# inputs) builds from source against the installed torch, so without build
# isolation (which would fetch another torch); about 6 min each the first time,
# then pip's wheel cache.
SAMPLING_STAMP := $(VENV)/.installed-sampling
$(SAMPLING_STAMP): $(call stamp,$(TEST_EXTRAS))
	$(BIN)/python -m pip install --no-build-isolation torch-scatter torch-sparse
	touch $@

## The main job: human mesh segmentation. Offline (no ROOT): metric-attention
## (a 2-block MetricMeshFormer and the paper's IPN) against the IPN with GATConv
## on 44 procedural humanoids (29 train, 3 validation, 12 test), 10 epochs of
## batches of 4, then the model shipped in the package (trained on MeshCNN's
## human_seg) segments a procedural humanoid it never saw; about 3 min on 2 CPU
## cores after the install; prints the accuracy table and the parts, and saves
## renderings; the humanoids are generated once into
## $PYG_METRIC_ATTN_DATA/synthetic_humans (default ~/.cache/pyg-metric-attn).
## With ROOT=path/to/human_seg (MeshCNN layout, e.g. ../shared/datasets/human_seg):
## trains the recipe of the shipped model (`pyg-metric-attn train human_seg
## --root ROOT`: 200 epochs, 4-5 h on one CPU thread, minutes with
## DEVICE=cuda; rerun to resume), then reads its test accuracy.
ROOT ?=
DEVICE ?= cpu
DEMO_OUT := runs/human_seg_demo
demo: $(call stamp,$(DEMO_EXTRAS))
ifeq ($(ROOT),)
	$(BIN)/pyg-metric-attn --threads 1 experiment human_seg \
		--attention metricformer,metric,gat --seeds 1 --epochs 10 \
		-o synthetic_train=32 -o synthetic_test=12 -o batch_size=4 \
		-o augment_copies=0 -o former_num_layers=2 --out $(DEMO_OUT) \
		--artifacts $(DEMO_OUT)/artifacts
	$(BIN)/python examples/segment_a_mesh.py --out $(DEMO_OUT)/shipped
	@echo "renderings: $(DEMO_OUT)/artifacts/*/segmentation.png; the shipped model: $(DEMO_OUT)/shipped/humanoid.png"
else
	$(BIN)/pyg-metric-attn --threads 1 train human_seg --root $(ROOT) \
		--processed-dir datasets/human_seg_processed --device $(DEVICE) \
		--out runs/human_seg $(if $(wildcard runs/human_seg/last.pt),--resume)
	$(BIN)/pyg-metric-attn evaluate runs/human_seg --split test --device $(DEVICE)
endif

## Lint and the test suite, with the optional torch-scatter/torch-sparse and
## triton installed (Triton kernels run in its interpreter without a GPU). The
## suite also runs the core tests (tests/core) with every extra hidden. Two
## pytest-xdist workers, one per core of the 2-core machine (serially the
## suite takes about twice as long), each with one intra-op thread (tests that
## need two set them): two OpenMP teams of two threads on two cores wait on
## each other at every parallel region.
test: $(call stamp,$(TEST_EXTRAS)) $(SAMPLING_STAMP)
	$(BIN)/ruff check .
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n 2

## The core tests in a venv that has only the core install (torch,
## torch-geometric, numpy, scipy, tqdm): pyg_metric_attn, its layers and models
## import and work. Not part of `make test`: building the venv takes minutes.
CORE_VENV ?= .venv-core
$(CORE_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(CORE_VENV)
	$(CORE_VENV)/bin/python -m pip install torch==$(TORCH_VERSION)
	$(CORE_VENV)/bin/python -m pip install -e . pytest
	touch $@

test-core: $(CORE_VENV)/.installed
	PYG_METRIC_ATTN_CORE_ONLY=1 $(CORE_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/core

## The package as a user installs it: builds the sdist and the wheel, checks
## what they hold (LICENSE in both, no tests in the sdist), installs the wheel
## with torch==$(TORCH_VERSION) (refusing a CUDA build) and the core
## dependencies into a fresh venv in /tmp, and uses it from outside the source
## tree (.ci/check_package.py; about 1 min idle, 4 min on 2 busy cores).
check-package: $(call stamp,$(TEST_EXTRAS))
	$(BIN)/python .ci/check_package.py

## The documentation (Sphinx, docs/): docs/_build/html/index.html, the API
## reference, the results and the design page. Warnings are errors (a broken
## cross-reference or a malformed docstring fails); then no page may load a
## script or stylesheet from the network (MathJax comes with
## sphinx-mathjax-offline) and the design page's diagrams must match their
## sources (docs/design/render.py redraws them; it needs Graphviz).
SPHINXOPTS ?= -W --keep-going
docs: $(call stamp,$(DOCS_EXTRAS))
	$(BIN)/python docs/design/render.py --check
	$(BIN)/python -m sphinx -b html $(SPHINXOPTS) docs docs/_build/html
	$(BIN)/python docs/check_offline.py docs/_build/html

## The suite on a GPU machine, in one command (no venv: the machine's python
## with torch for CUDA): the CUDA-parametrised tests with --device cuda, then
## the rest; logs in $OUT (default gpu-out/). Wheels in .whl/ and the
## human_seg archive in .data/ (make gpu-bundle) are used where present.
test-gpu:
	PYTHON=$(PYTHON) DEVICE=cuda bash benchmarks/gpu_session.sh tests

## What a GPU machine without network needs, carried untracked: the mesh
## extra's wheels for its python (GPU_PYTHON, default 3.12; manylinux x86_64,
## about 20 MB) in .whl/, and the human_seg set (SHARED: the datasets folder,
## default ../shared/datasets) as .data/human_seg.tar.xz (about 7 MB).
GPU_PYTHON ?= 3.12
SHARED ?= ../shared/datasets
GPU_WHEELS := trimesh potpourri3d robust-laplacian fast-simplification \
	scikit-image lazy_loader threadpoolctl
gpu-bundle: $(call stamp,$(TEST_EXTRAS))
	$(BIN)/python -m pip download --no-deps --only-binary=:all: \
		--python-version $(GPU_PYTHON) --implementation cp \
		--abi cp$(subst .,,$(GPU_PYTHON)) --platform manylinux2014_x86_64 \
		--platform manylinux_2_28_x86_64 -d .whl $(GPU_WHEELS)
	mkdir -p .data
	tar -C $(SHARED) -cJf .data/human_seg.tar.xz human_seg
	du -sh .whl .data

lint: $(call stamp,$(TEST_EXTRAS))
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) $(CORE_VENV) build dist docs/_build *.egg-info .pytest_cache \
		.ruff_cache
