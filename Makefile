# Set-up and entry points. Every target creates .venv if it is missing and
# installs torch==2.13.0 first (so pip never resolves a newer, CUDA-laden torch),
# then this project with its extras.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_VERSION := 2.13.0
EXTRAS ?= dev,gpu
comma := ,
STAMP := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: install demo test lint clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install torch==$(TORCH_VERSION)
	$(BIN)/python -m pip install -e '.[$(EXTRAS)]'
	touch $@

install: $(STAMP)

# The [sampling] extra (torch-scatter, torch-sparse: NeighborLoader, SparseTensor
# inputs) builds from source against the installed torch, so without build
# isolation (which would fetch another torch); about 6 min each the first time,
# then pip's wheel cache.
SAMPLING_STAMP := $(VENV)/.installed-sampling
$(SAMPLING_STAMP): $(STAMP)
	$(BIN)/python -m pip install --no-build-isolation torch-scatter torch-sparse
	touch $@

## The main job: human mesh segmentation. Offline (no ROOT): metric-attention
## (MetricMeshFormer and the paper's IPN) against the IPN with GATConv on
## procedural humanoids, a few minutes; prints the accuracy table and saves
## renderings. With ROOT=path/to/human_seg (MeshCNN layout, e.g.
## ../shared/datasets/human_seg): the real benchmark of RESULTS.md, all models,
## 3 seeds, 20 epochs (about 50 min in one process on 2 CPU cores).
ROOT ?=
DEMO_FLAGS := --threads 1 experiment human_seg
demo: install
ifeq ($(ROOT),)
	$(BIN)/pyg-metric-attn $(DEMO_FLAGS) --attention metricformer,metric,gat \
		--seeds 1 --epochs 20 --out runs/human_seg_demo \
		--artifacts runs/human_seg_demo/artifacts
	@echo "renderings: runs/human_seg_demo/artifacts/*/segmentation.png"
else
	$(BIN)/pyg-metric-attn $(DEMO_FLAGS) --root $(ROOT) \
		--processed-dir datasets/human_seg_processed \
		--attention metric,l2,dot,gat,gatv2,transformer,metricformer \
		--seeds 3 --epochs 20 \
		--out runs/human_seg --artifacts runs/human_seg/artifacts
	@echo "renderings: runs/human_seg/artifacts/*/segmentation.png"
endif

## Lint and the test suite, with the optional torch-scatter/torch-sparse and
## triton installed (Triton kernels run in its interpreter without a GPU).
test: install $(SAMPLING_STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: install
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
