#!/usr/bin/env bash
# One lent GPU, three commands (each fits the device's 10-minute limit):
#
#   bash benchmarks/gpu_session.sh tests      # environment + the suite on CUDA
#                                             # (also: make test-gpu)
#   bash benchmarks/gpu_session.sh bench      # python -m benchmarks.run --suite gpu
#   bash benchmarks/gpu_session.sh human_seg  # train MetricMeshFormer on CUDA
#
# Run from anywhere; works in the repository root. Writes into $OUT (the
# device tool's output folder; ./gpu-out when unset). `bench` keeps its
# results in ./gpu-out/bench (which stays on a warm machine) and resumes from
# them, so running `bench` a second time measures what the first run had no
# time for. Extra arguments after `bench` go to the suite (e.g. --quick).
# Optional, both made here by `make gpu-bundle` and carried untracked (they
# are in .gitignore): the mesh packages' wheels in ./.whl are installed first
# (into /tmp/site), and ./.data/human_seg.tar.xz is unpacked into
# $PYG_METRIC_ATTN_SHARED (default /tmp/shared-datasets), where the mesh tests
# and the human_seg run find it.
set -u
cd "$(dirname "$0")/.." || exit 1
mode=${1:-tests}
shift || true
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}  # DEVICE=cpu: try the script without a GPU
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if compgen -G '.whl/*.whl' > /dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
export PYG_METRIC_ATTN_SHARED=${PYG_METRIC_ATTN_SHARED:-/tmp/shared-datasets}
if [ -f .data/human_seg.tar.xz ] && [ ! -d "$PYG_METRIC_ATTN_SHARED/human_seg" ]; then
    mkdir -p "$PYG_METRIC_ATTN_SHARED"
    tar -C "$PYG_METRIC_ATTN_SHARED" -xJf .data/human_seg.tar.xz
fi

environment() {
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm \
        --format=csv 2>&1 | head -3
    $PY - <<'EOF'
import importlib, platform
import torch
print('python', platform.python_version(), '| torch', torch.__version__,
      '| CUDA', torch.version.cuda, '| cuda available', torch.cuda.is_available())
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print('device', p.name, f'{p.total_memory / 2**30:.0f} GiB',
          p.multi_processor_count, 'SMs')
for name in ('torch_geometric', 'triton', 'torch_scatter', 'torch_sparse',
             'tokenizers', 'sacrebleu', 'hypothesis', 'psutil', 'trimesh',
             'potpourri3d', 'robust_laplacian', 'fast_simplification',
             'pyg_metric_attn'):
    try:
        module = importlib.import_module(name)
        print(f'{name}: {getattr(module, "__version__", "imported")}')
    except Exception as error:
        print(f'{name}: NOT importable ({type(error).__name__}: {error})'[:160])
from pyg_metric_attn.nn.triton import HAVE_TRITON
print('pyg_metric_attn HAVE_TRITON:', HAVE_TRITON)
EOF
    if [ -f datasets/multi30k/raw/train.de.gz ]; then
        echo 'multi30k data: datasets/multi30k/raw'
    else
        echo 'multi30k data: absent (the speed job uses synthetic ids)'
    fi
}

case "$mode" in
tests)
    environment 2>&1 | tee "$OUT/env.txt"
    extra=()
    $PY -c 'import pytest_timeout' 2>/dev/null && extra+=(--timeout 120)
    # 1. The device-parametrised tests and the Triton kernels (the point of
    #    the GPU run), about 4.5 minutes at most.
    timeout -s INT -k 15 270 $PY -m pytest --device "$DEVICE" -q -rfE \
        -p no:cacheprovider "${extra[@]}" \
        tests/test_triton_attention.py tests/test_metric_attention_conv.py \
        tests/test_sparse_numerics.py tests/test_conv_api.py \
        tests/test_fused_backend.py tests/test_multihead.py \
        tests/test_functional.py tests/test_dense_numerics.py \
        tests/test_gpu_suite.py 2>&1 | tee "$OUT/tests-cuda.log"
    echo "exit status: ${PIPESTATUS[0]} (124/130: cut by the time limit)" \
        | tee -a "$OUT/tests-cuda.log"
    # 2. Everything else (CPU tests that see a GPU machine), with what is
    #    left of 8 minutes; files whose imports are missing there (mesh
    #    libraries) are reported as collection errors and skipped.
    xdist=()
    $PY -c 'import xdist' 2>/dev/null && xdist=(-n 8)
    timeout -s INT -k 15 180 $PY -m pytest --device "$DEVICE" -q -rfE \
        -p no:cacheprovider --continue-on-collection-errors \
        "${extra[@]}" "${xdist[@]}" tests \
        --ignore tests/test_triton_attention.py \
        --ignore tests/test_metric_attention_conv.py \
        --ignore tests/test_sparse_numerics.py --ignore tests/test_conv_api.py \
        --ignore tests/test_fused_backend.py --ignore tests/test_multihead.py \
        --ignore tests/test_functional.py --ignore tests/test_dense_numerics.py \
        --ignore tests/test_gpu_suite.py 2>&1 | tee "$OUT/tests-rest.log"
    echo "exit status: ${PIPESTATUS[0]} (124/130: cut by the time limit)" \
        | tee -a "$OUT/tests-rest.log"
    ;;
human_seg)
    # The real benchmark (MeshCNN human_seg) with the RESULTS.md model, on
    # the device, for EPOCHS epochs (default 2); the meshes' operators are
    # computed once into /tmp/human_seg_processed (kept on a warm machine).
    environment > "$OUT/env.txt" 2>&1
    timeout -s INT -k 10 560 $PY -m pyg_metric_attn train human_seg \
        --device "$DEVICE" --attention metricformer --epochs "${EPOCHS:-2}" \
        --root "$PYG_METRIC_ATTN_SHARED/human_seg" \
        --processed-dir /tmp/human_seg_processed --out gpu-out/human_seg \
        --no-progress "$@" 2>&1 | tee "$OUT/human_seg.log"
    echo "exit status: ${PIPESTATUS[0]}" | tee -a "$OUT/human_seg.log"
    cp gpu-out/human_seg/metrics.csv "$OUT/human_seg-metrics.csv" 2>/dev/null || true
    ;;
bench)
    environment > "$OUT/env.txt" 2>&1
    mkdir -p gpu-out/bench
    # The suite stops starting work after 520 s (--budget-s; a later
    # --budget-s in "$@" wins); the timeout is the backstop inside the
    # device's 600 s.
    timeout -s INT -k 10 580 $PY -m benchmarks.run --suite gpu --device "$DEVICE" \
        --out gpu-out/bench --resume --budget-s 520 "$@" 2>&1 | tee "$OUT/bench.log"
    echo "exit status: ${PIPESTATUS[0]}" | tee -a "$OUT/bench.log"
    if [ "$OUT" != "$PWD/gpu-out" ]; then
        for f in gpu-out/bench/*.json gpu-out/bench/*.md gpu-out/bench/stderr.txt; do
            [ -f "$f" ] && cp "$f" "$OUT/bench-$(basename "$f")"
        done
    fi
    ;;
*)
    echo "usage: $0 tests|bench [suite options]|human_seg [train options]" >&2
    exit 2
    ;;
esac
