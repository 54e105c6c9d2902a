"""Shared fixtures: the test device, scatter backends, random graphs, the
shared data root, a server that never answers, intra-op threads without the
denormal flush.

``pytest --device cuda`` (or ``PYG_METRIC_ATTN_TEST_DEVICE=cuda``) runs the
tests that take the ``device`` fixture on the GPU; the rest, and everything by
default, run on the CPU as before."""
from __future__ import annotations

import ctypes
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton kernels run in Triton's interpreter. The variable must
# be set before anything imports triton, and PyG does (through torch-sparse).
if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')

import torch_geometric.typing  # noqa: E402

from pyg_metric_attn.utils import denormals  # noqa: E402

try:
    import torch_scatter  # noqa: F401
    HAVE_TORCH_SCATTER = True
except ImportError:
    HAVE_TORCH_SCATTER = False

# The read-only copy of the real data sets beside the checkout (see DEVELOPERS.md).
SHARED_DATASETS = Path(os.environ.get(
    'PYG_METRIC_ATTN_SHARED',
    Path(__file__).resolve().parents[1].parent / 'shared' / 'datasets'))

DEVICE_VARIABLE = 'PYG_METRIC_ATTN_TEST_DEVICE'


def pytest_addoption(parser):
    parser.addoption('--device', choices=['cpu', 'cuda'],
                     default=os.environ.get(DEVICE_VARIABLE, 'cpu'),
                     help='device of the tests that take the `device` fixture '
                          f'(default: ${DEVICE_VARIABLE} or cpu)')


def pytest_configure(config):
    device = config.getoption('--device', default='cpu')
    if device == 'cuda' and not torch.cuda.is_available():
        raise pytest.UsageError('--device cuda: torch sees no CUDA device')
    os.environ[DEVICE_VARIABLE] = device  # for module-level parametrisations


def test_device() -> str:
    """The tests' device as a string ('cpu' unless ``--device cuda``)."""
    return os.environ.get(DEVICE_VARIABLE, 'cpu')


test_device.__test__ = False  # a helper, not a test


@pytest.fixture(scope='session')
def device(request) -> torch.device:
    """The device the test runs on: ``--device`` (default cpu)."""
    return torch.device(request.config.getoption('--device'))


SCATTER_BACKENDS = ['torch'] + (['torch_scatter'] if HAVE_TORCH_SCATTER else [])


@pytest.fixture
def one_thread():
    """One intra-op thread (tiny graphs and meshes: a second thread only adds
    contention on 2 cores), restored afterwards."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def two_threads():
    """Two intra-op threads, all without flushing (an earlier test or a
    loaded fast-math library may have switched it on), restored afterwards."""
    runtime = denormals._runtime()
    if runtime is None:
        pytest.skip('no OpenMP runtime on Linux x86-64 to flush denormals on')
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    saved = denormals._Environment()
    runtime.fegetenv(ctypes.byref(saved))
    cleared = denormals._Environment.from_buffer_copy(saved)
    cleared.mxcsr &= ~denormals.FLUSH_BITS
    runtime.set_on_all_threads(cleared)
    yield
    runtime.set_on_all_threads(saved)
    torch.set_num_threads(threads)


@pytest.fixture(params=SCATTER_BACKENDS)
def scatter_backend(request, monkeypatch):
    """Run a test with PyG's pure-torch path and, where installed, torch-scatter."""
    monkeypatch.setattr(torch_geometric.typing, 'WITH_TORCH_SCATTER',
                        request.param == 'torch_scatter')
    return request.param


def random_graph(num_src: int, num_dst: int, p: float, generator: torch.Generator,
                 self_loops: bool = True) -> torch.Tensor:
    """A random ``edge_index`` without duplicate edges (some nodes isolated)."""
    mask = torch.rand(num_dst, num_src, generator=generator) < p
    if not self_loops:
        n = min(num_src, num_dst)
        mask[torch.arange(n), torch.arange(n)] = False
    dst, src = mask.nonzero(as_tuple=True)
    order = torch.randperm(src.numel(), generator=generator)
    return torch.stack([src, dst])[:, order]


def compile_for_gpu(script: str, *args: str) -> subprocess.CompletedProcess:
    """Run ``script`` (that compiles Triton kernels for a GPU target) in a
    fresh interpreter with Triton's interpreter off and this checkout
    importable; it fails the test where it exits non-zero."""
    env = {name: value for name, value in os.environ.items()
           if name != 'TRITON_INTERPRET'}
    env['TRITON_DEFAULT_FP_FUSION'] = '1'  # silence triton 3.9's notice
    result = run_fresh(script, *args, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def run_fresh(script: str, *args: str, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess:
    """Run ``script`` in a fresh interpreter with ``env`` (default: this
    process's) and this checkout importable."""
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ if env is None else env)
    env['PYTHONPATH'] = str(root) + os.pathsep + os.environ.get('PYTHONPATH', '')
    return subprocess.run([sys.executable, '-c', script, *args],
                          capture_output=True, text=True, env=env, timeout=300)


def expect_device_assert(script: str) -> None:
    """Run ``script`` (Python, on CUDA) in a fresh interpreter with this
    checkout importable: it must stop with a device-side assert (the check
    of a bad index or row pointer), never finish (``'NO ERROR'`` printed).
    A fresh process, because the assert ends the CUDA context it fires in."""
    script += "\ntorch.cuda.synchronize()\nprint('NO ERROR')\n"
    result = run_fresh(script)
    assert result.returncode != 0 and 'NO ERROR' not in result.stdout, \
        result.stdout[-2000:]
    assert 'device-side assert' in result.stderr, result.stderr[-3000:]


def shared_dataset(name: str) -> Path:
    """Path of a real data set in ``../shared/datasets``.

    Skips the test with the reason when the folder is absent, except where
    ``PYG_METRIC_ATTN_REQUIRE_DATA`` is set (CI): there a missing data set fails.
    """
    path = SHARED_DATASETS / name
    if not path.exists():
        message = (f"real data set '{name}' not found at {path} (the read-only "
                   f"copy beside the checkout; set PYG_METRIC_ATTN_SHARED to "
                   f"its datasets folder)")
        if os.environ.get('PYG_METRIC_ATTN_REQUIRE_DATA'):
            pytest.fail(message)
        pytest.skip(message)
    return path


@pytest.fixture
def silent_server(monkeypatch):
    """The address of a local server that accepts connections and never
    answers, with downloads set to give up after 0.5 s. Each connection is
    closed after 5 s, so that code without a timeout fails instead of hanging.
    """
    monkeypatch.setenv('PYG_METRIC_ATTN_DOWNLOAD_TIMEOUT', '0.5')
    server = socket.create_server(('127.0.0.1', 0))
    server.settimeout(0.1)
    stop = threading.Event()
    timers = []

    def serve():
        while not stop.is_set():
            try:
                connection, _ = server.accept()
            except TimeoutError:
                continue
            timers.append(threading.Timer(5.0, connection.close))
            timers[-1].start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f'http://127.0.0.1:{server.getsockname()[1]}'
    stop.set()
    thread.join()
    server.close()
    for timer in timers:
        timer.cancel()
        timer.function()
