r"""Flush denormal floats to zero on all intra-op threads around CPU kernels.

Softmax weights of distant points pass through the denormal range (below
1.2e-38 in float32), where x86 CPUs compute slowly. :func:`torch.set_flush_denormal`
sets the flush-to-zero (FTZ) and denormals-are-zero (DAZ) bits of the
*calling* thread's MXCSR register only; torch's OpenMP worker threads keep
their own. :func:`denormals_flushed` sets both bits on every thread of the
calling thread's OpenMP team (as many threads as :func:`torch.get_num_threads`,
read on each call) by running the C library's ``fesetenv`` through the
runtime's ``GOMP_parallel`` entry point (exported by GNU libgomp, LLVM libomp
and Intel libiomp5), and afterwards puts the caller's floating-point
environment back on all of them. Flushing changes only values below the
smallest normal float, to zero. Where this is not available (not Linux
x86-64, or torch's intra-op backend is not OpenMP) or switched off with the
environment variable ``PYG_METRIC_ATTN_FLUSH_DENORMALS=0`` (read once per
process) it does nothing.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import platform
import sys
from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

# MXCSR flush-to-zero and denormals-are-zero bits.
FLUSH_BITS = 0x8040
OPENMP_LIBRARIES = ('libgomp', 'libomp', 'libiomp5')
SWITCH = 'PYG_METRIC_ATTN_FLUSH_DENORMALS'


class _Environment(ctypes.Structure):
    """The C library's x86-64 ``fenv_t``: the x87 environment, then MXCSR."""
    _fields_ = [('x87', ctypes.c_uint32 * 7), ('mxcsr', ctypes.c_uint32)]


class _Runtime(NamedTuple):
    parallel: ctypes._CFuncPtr  # GOMP_parallel(fn, data, threads, flags)
    fegetenv: ctypes._CFuncPtr
    fesetenv: ctypes._CFuncPtr

    def set_on_all_threads(self, environment: _Environment) -> None:
        self.parallel(ctypes.cast(self.fesetenv, ctypes.c_void_p),
                      ctypes.addressof(environment), torch.get_num_threads(), 0)


@functools.cache
def _runtime() -> _Runtime | None:
    """The OpenMP runtime torch runs its intra-op threads on, or None."""
    if os.environ.get(SWITCH) == '0' or sys.platform != 'linux' or \
            platform.machine() != 'x86_64' or \
            'parallel backend: OpenMP' not in torch.__config__.parallel_info():
        return None
    with open('/proc/self/maps') as maps:
        paths = {line.split()[-1] for line in maps if '/' in line}
    libc = ctypes.CDLL(None)
    # Other packages load their own OpenMP runtimes (scikit-learn vendors a
    # libgomp): torch's threads belong to the one in torch's own folder.
    torch_folder = os.path.dirname(torch.__file__) + os.sep
    for path in sorted(paths, key=lambda p: (not p.startswith(torch_folder), p)):
        if os.path.basename(path).startswith(OPENMP_LIBRARIES):
            parallel = getattr(ctypes.CDLL(path), 'GOMP_parallel', None)
            if parallel is not None:
                parallel.argtypes = [ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_uint, ctypes.c_uint]
                parallel.restype = None
                return _Runtime(parallel, libc.fegetenv, libc.fesetenv)
    return None


def _flush(runtime: _Runtime) -> _Environment:
    """Set FTZ and DAZ on all threads; returns the caller's environment."""
    saved = _Environment()
    runtime.fegetenv(ctypes.byref(saved))
    flushed = _Environment.from_buffer_copy(saved)
    flushed.mxcsr |= FLUSH_BITS
    runtime.set_on_all_threads(flushed)
    return saved


@contextlib.contextmanager
def denormals_flushed(enabled: bool = True) -> Iterator[None]:
    """Denormals flush to zero on the calling thread and its intra-op worker
    threads inside the block; afterwards all of them get the calling
    thread's previous setting."""
    runtime = _runtime() if enabled else None
    if runtime is None:
        yield
        return
    saved = _flush(runtime)
    try:
        yield
    finally:
        runtime.set_on_all_threads(saved)


def flush_in_backward(output: Tensor) -> Tensor:
    """Run the backward of the op that made ``output`` as under
    :func:`denormals_flushed` (hooks on its autograd node); returns
    ``output``."""
    runtime = _runtime()
    node = output.grad_fn
    if runtime is None or node is None:
        return output
    saved: list[_Environment] = []
    node.register_prehook(lambda grad_outputs: saved.append(_flush(runtime)))
    node.register_hook(lambda grad_inputs, grad_outputs:
                       runtime.set_on_all_threads(saved.pop()))
    return output
