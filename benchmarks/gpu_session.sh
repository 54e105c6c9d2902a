#!/usr/bin/env bash
# The GPU checks, each a command that fits the device's 10-minute limit:
#
#   bash benchmarks/gpu_session.sh lease      # a 15-minute lease, call 1: the
#                                             # CUDA tests, compute-sanitizer,
#                                             # the host profiles at Cora size,
#                                             # the CUDA-graph example (and with
#                                             # HUMAN_SEG_S two human_seg
#                                             # epochs), then issue 60's table
#                                             # until LEASE_S seconds (420)
#   bash benchmarks/gpu_session.sh table      # call 2: the rest of the table
#                                             # (resumed; TABLE_S seconds, 520)
#   bash benchmarks/gpu_session.sh plan       # the table's jobs and estimates
#                                             # (a dry run: no GPU needed)
#   bash benchmarks/gpu_session.sh tests      # environment + the whole suite
#                                             # on CUDA (also: make test-gpu)
#   bash benchmarks/gpu_session.sh bench      # python -m benchmarks.run --suite gpu
#   bash benchmarks/gpu_session.sh human_seg  # train MetricMeshFormer on CUDA
#
# Issue 60's table (TABLE below): GATConv against the Triton layer at Cora
# and PubMed size, eager and compiled (torch.compile(fullgraph=True,
# mode='reduce-overhead'), the *-compiled variants), at 100k nodes / 2M
# edges (uniform and power-law, float32 and bfloat16), and the dense kernel
# and module against SDPA at L = 1024, 4096, 16384; about 330 s of
# estimated work, so `lease` starts it and `table` finishes it.
#
# Run from anywhere; works in the repository root. Writes into $OUT (the
# device tool's output folder; ./gpu-out when unset), at most 8 files. The
# suite's results are written into $OUT/bench after every job (so a call cut
# short still returns them) and kept in ./gpu-out/bench (which stays on a
# warm machine): `bench`, `table` and `lease` resume from them, so a second
# call measures what the first had no time for. Extra arguments after
# `bench` or `table` go to the suite (e.g. --quick, --budget-s 240).
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

# Issue 60's table: the GPU suite's jobs and variants (module header).
TABLE=(--only sdpa-kernels dense-kernel dense-module 'small 2708/'
    'small 19717/' 100k/2M --variants GATConv metric-triton GATConv-compiled
    metric-triton-compiled sdpa-dot metric-sdpa metric-sdpa-fast mha-dot
    mha-metric mha-metric-fast)

# The test files whose tests take the --device fixture (or pick CUDA when
# it is there), and the Triton kernels' tests.
DEVICE_TESTS=(tests/test_triton_attention.py tests/test_metric_attention_conv.py
    tests/test_sparse_numerics.py tests/test_conv_api.py
    tests/test_conv_inputs.py tests/test_conv_step.py
    tests/test_fused_backend.py tests/test_multihead.py
    tests/test_functional.py tests/test_dense_numerics.py
    tests/test_dense_augmentation.py tests/test_exact_attention.py
    tests/test_dense_sync_free.py tests/test_device.py tests/test_gpu_suite.py
    tests/test_graph_cache.py)
pytest_extra=()
$PY -c 'import pytest_timeout' 2>/dev/null && pytest_extra+=(--timeout 120)
xdist=()
$PY -c 'import xdist' 2>/dev/null && xdist=(-n 8)

# device_tests SECONDS LOG: the device tests on $DEVICE, cut after SECONDS;
# two intra-op threads per worker (8 workers of 16 threads each on 16 cores
# made a 2000-call CPU test take 74 s on 2026-11-27).
device_tests() {
    OMP_NUM_THREADS=2 timeout -s INT -k 15 "$1" $PY -m pytest --device "$DEVICE" -v -rfE \
        --durations 15 -p no:cacheprovider "${pytest_extra[@]}" "${xdist[@]}" \
        "${DEVICE_TESTS[@]}" 2>&1 | tee "$2"
    echo "exit status: ${PIPESTATUS[0]} (124/130: cut by the time limit)" \
        | tee -a "$2"
}

# bench SECONDS [suite options]: the GPU suite into $OUT/bench, resuming
# from (and saved back to) gpu-out/bench; stops starting work after SECONDS.
bench() {
    local seconds=$1
    shift
    mkdir -p gpu-out/bench "$OUT/bench"
    cp gpu-out/bench/* "$OUT/bench/" 2>/dev/null
    timeout -s INT -k 10 "$((seconds + 60))" $PY -m benchmarks.run --suite gpu \
        --device "$DEVICE" --out "$OUT/bench" --resume --budget-s "$seconds" \
        "$@" 2>&1 | tee "$OUT/bench.log"
    echo "exit status: ${PIPESTATUS[0]}" | tee -a "$OUT/bench.log"
    cp "$OUT"/bench/* gpu-out/bench/ 2>/dev/null
}

# human_seg SECONDS [train options]: MetricMeshFormer on MeshCNN human_seg on
# $DEVICE for EPOCHS epochs (default 2), cut after SECONDS; the meshes'
# operators are computed once into /tmp/human_seg_processed (kept on a warm
# machine). Its log ends with the run's metrics.csv (per-epoch seconds).
human_seg() {
    local seconds=$1
    shift
    if [ ! -d "$PYG_METRIC_ATTN_SHARED/human_seg" ]; then
        echo "no human_seg data: make gpu-bundle, carry .data" > "$OUT/human_seg.log"
        return
    fi
    timeout -s INT -k 10 "$seconds" $PY -m pyg_metric_attn train human_seg \
        --device "$DEVICE" --attention metricformer --epochs "${EPOCHS:-2}" \
        --root "$PYG_METRIC_ATTN_SHARED/human_seg" \
        --processed-dir /tmp/human_seg_processed --out gpu-out/human_seg \
        --no-progress "$@" 2>&1 | tee "$OUT/human_seg.log"
    echo "exit status: ${PIPESTATUS[0]}" | tee -a "$OUT/human_seg.log"
    cat gpu-out/human_seg/metrics.csv >> "$OUT/human_seg.log" 2>/dev/null || true
}

case "$mode" in
lease)
    # What one call of a 15-minute lease can hold, most important first: the
    # device tests (TESTS_S, default 150 s, at most), the Triton layer on
    # every input format under compute-sanitizer's memcheck (45 s at most),
    # where the time of a Cora-size layer step and of the dense module goes
    # (benchmarks/host_profile.py, 30 s each at most; host_dispatch.py;
    # global_keys.py on human_seg, 75 s at most), the training step recorded
    # with torch.cuda.graphs (examples/fixed_graph_training.py, 40 s at
    # most), with HUMAN_SEG_S > 0 two epochs of human_seg in at most that
    # many seconds (default 0: read once, 2026-11-27, 5.0 s per epoch on an
    # H200), then issue 60's table until LEASE_S. A second call (`table`)
    # on the warm machine resumes the table.
    lease_s=${LEASE_S:-420}
    environment > "$OUT/env.txt" 2>&1
    device_tests "${TESTS_S:-150}" "$OUT/tests-cuda.log"
    # (Its log goes after the tests': the device tool returns 8 files.)
    if command -v compute-sanitizer > /dev/null && [ "$DEVICE" = cuda ]; then
        echo "=== compute-sanitizer memcheck, Triton cases of test_conv_inputs.py" \
            >> "$OUT/tests-cuda.log"
        timeout -s INT -k 10 45 compute-sanitizer --tool memcheck \
            --error-exitcode 99 $PY -m pytest --device cuda -q -rfE -x \
            -p no:cacheprovider tests/test_conv_inputs.py \
            -k 'triton and not device_assert' 2>&1 | tail -60 >> "$OUT/tests-cuda.log"
        echo "exit status: ${PIPESTATUS[0]} (99: memcheck found errors)" \
            >> "$OUT/tests-cuda.log"
    fi
    # Where a Cora-size step goes (host or GPU), and the dense module's.
    for variant in metric-triton GATConv mha-metric; do
        timeout -s INT -k 5 30 $PY -m benchmarks.host_profile \
            --variant "$variant" --device "$DEVICE" 2>&1
    done > "$OUT/profile.log"
    # The host time of the Cora-size step's way into the kernels (launches
    # stubbed): through the custom operators against the eager default.
    timeout -s INT -k 5 30 $PY -m benchmarks.host_dispatch --device "$DEVICE" \
        --nodes 2708 --edges 10556 >> "$OUT/profile.log" 2>&1
    # The whole training step recorded once with torch.cuda.graphs and
    # replayed (the compiled way is the table's *-compiled cells).
    echo "=== examples/fixed_graph_training.py --capture cuda-graph" \
        >> "$OUT/profile.log"
    timeout -s INT -k 5 40 $PY examples/fixed_graph_training.py --device \
        "$DEVICE" --capture cuda-graph --steps 50 >> "$OUT/profile.log" 2>&1
    echo "exit status: $?" >> "$OUT/profile.log"
    # A human_seg training step with the former's keys sampled in every
    # forward pass against read from the meshes' farthest-point ranks (the
    # meshes alone, prepared here first; 75 s at most).
    [ -d "$PYG_METRIC_ATTN_SHARED/human_seg" ] && timeout -s INT -k 5 75 \
        $PY -m benchmarks.global_keys --device "$DEVICE" --copies 0 \
        --workers 12 --root "$PYG_METRIC_ATTN_SHARED/human_seg" \
        --processed-dir /tmp/human_seg_processed --no-progress \
        >> "$OUT/profile.log" 2>&1
    # Two epochs of the mesh job on the GPU, in HUMAN_SEG_S seconds (default
    # 0: skipped) or what the lease has left.
    left=$((lease_s - SECONDS - 30))
    seconds=$((left < ${HUMAN_SEG_S:-0} ? left : ${HUMAN_SEG_S:-0}))
    [ "$seconds" -ge 60 ] && human_seg "$seconds" -o num_workers=8 > /dev/null
    bench "$((lease_s - SECONDS - 20))" "${TABLE[@]}" "$@"
    ;;
table)
    # The rest of issue 60's table (resumed), in TABLE_S seconds (520).
    environment > "$OUT/env.txt" 2>&1
    bench "${TABLE_S:-520}" "${TABLE[@]}" "$@"
    ;;
plan)
    # The table's jobs, their estimates and the suite's budget: no GPU.
    $PY -m benchmarks.run --suite gpu --device "$DEVICE" --dry-run \
        "${TABLE[@]}" "$@"
    ;;
tests)
    environment 2>&1 | tee "$OUT/env.txt"
    # 1. The device tests and the Triton kernels (the point of the GPU run).
    device_tests 270 "$OUT/tests-cuda.log"
    # 2. Everything else (CPU tests that see a GPU machine), with what is
    #    left of 8 minutes; files whose imports are missing there (mesh
    #    libraries) are reported as collection errors and skipped.
    ignore=()
    for file in "${DEVICE_TESTS[@]}"; do ignore+=(--ignore "$file"); done
    timeout -s INT -k 15 180 $PY -m pytest --device "$DEVICE" -q -rfE \
        -p no:cacheprovider --continue-on-collection-errors \
        "${pytest_extra[@]}" "${xdist[@]}" tests "${ignore[@]}" 2>&1 \
        | tee "$OUT/tests-rest.log"
    echo "exit status: ${PIPESTATUS[0]} (124/130: cut by the time limit)" \
        | tee -a "$OUT/tests-rest.log"
    ;;
human_seg)
    # The real benchmark (MeshCNN human_seg) with the RESULTS.md model, on
    # the device, for EPOCHS epochs (default 2).
    environment > "$OUT/env.txt" 2>&1
    human_seg 560 "$@"
    ;;
bench)
    # The whole suite, most important first; 520 s unless --budget-s says
    # otherwise (a later --budget-s in "$@" wins).
    environment > "$OUT/env.txt" 2>&1
    bench 520 "$@"
    ;;
*)
    echo "usage: $0 lease|table|plan|tests|bench [suite options]|human_seg [train options]" >&2
    exit 2
    ;;
esac
