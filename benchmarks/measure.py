"""Measure one case in one mode in this (fresh) process; prints one JSON line.

    python -m benchmarks.measure '{"suite": "sparse", ...}' forward --threads 2

A warm-up run, then at least ``--repeats`` timed runs (more for fast steps,
up to about ``--min-time`` seconds); the median wall time, and the median CPU
time of the process (all its threads), which other processes on the machine
inflate far less than the wall time. Memory: the peak
resident set size (``getrusage``) and the peak over the resident size after
imports and inputs (what the step itself adds), or
``torch.cuda.max_memory_allocated`` on a GPU. On Linux the peak is reset once
the inputs are made (:func:`reset_peak_rss`), so memory that making them took
and gave back (drawing a big random graph) is not counted as the step's. An
allocation failure prints ``status: OOM``.
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time

import psutil
import torch

from benchmarks.cases import MODES, build


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB


def current_rss_mib() -> float:
    return psutil.Process().memory_info().rss / 2**20


def reset_peak_rss() -> bool:
    """Lower the peak resident set size (``getrusage``, ``VmHWM``) to the
    current one (Linux' ``/proc/self/clear_refs``); False where that is not
    possible, and the peak then covers the whole process."""
    try:
        with open('/proc/self/clear_refs', 'w') as clear_refs:
            clear_refs.write('5')
    except OSError:
        return False
    return True


def synchronize(device: torch.device) -> None:
    if device.type == 'cuda':
        torch.cuda.synchronize(device)


def time_step(step, device: torch.device, repeats: int,
              min_time: float) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of each timed run (after a warm-up run)."""
    step()  # warm-up
    synchronize(device)
    times: list[float] = []
    cpu_times: list[float] = []
    while len(times) < repeats or (sum(times) < min_time and len(times) < 50):
        start, cpu_start = time.perf_counter(), time.process_time()
        step()
        synchronize(device)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    return times, cpu_times


def measure(case: dict, mode: str, device: torch.device, repeats: int,
            min_time: float) -> dict:
    step = build(case, mode, device)
    result = dict(mode=mode, status='ok')
    if device.type == 'cuda':
        torch.cuda.reset_peak_memory_stats(device)
        baseline = torch.cuda.memory_allocated(device) / 2**20
    else:
        result['peak_reset'] = reset_peak_rss()
        baseline = current_rss_mib()
    times, cpu_times = time_step(step, device, repeats, min_time)
    if device.type == 'cuda':
        peak = torch.cuda.max_memory_allocated(device) / 2**20
    else:
        peak = peak_rss_mib()
    result.update(times_s=times, median_s=statistics.median(times),
                  cpu_times_s=cpu_times, median_cpu_s=statistics.median(cpu_times),
                  peak_mib=peak, baseline_mib=baseline,
                  peak_over_baseline_mib=peak - baseline)
    return result


def is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, MemoryError | torch.OutOfMemoryError):
        return True
    return reads_out_of_memory(str(error))


def reads_out_of_memory(text: str) -> bool:
    """An error message of a failed allocation: torch's CPU allocator
    ("can't allocate memory"), CUDA's "out of memory", Python's MemoryError
    and C++'s ``std::bad_alloc`` (which torch raises as a RuntimeError when
    an allocation fails under an address-space cap)."""
    text = text.lower()
    return any(words in text for words in (
        'allocate', 'out of memory', 'memoryerror', 'bad_alloc'))


def cap_address_space(gib: float) -> None:
    """Limit this process's address space (``RLIMIT_AS``) to ``gib`` GiB
    more than it maps now: the cap counts what the case allocates, not the
    libraries imported (a CUDA build of torch maps gigabytes of them)."""
    limit = psutil.Process().memory_info().vms + int(gib * 2**30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('case', help='the case as JSON')
    parser.add_argument('mode', choices=MODES)
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--min-time', type=float, default=1.0,
                        help='repeat fast steps until this many seconds')
    parser.add_argument('--memory-gib', type=float, default=None,
                        help='cap the address space at this much above what '
                             'the process holds after its imports')
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.memory_gib is not None:
        cap_address_space(args.memory_gib)
    case, device = json.loads(args.case), torch.device(args.device)
    try:
        result = measure(case, args.mode, device, args.repeats, args.min_time)
    except (RuntimeError, MemoryError) as error:
        if not is_out_of_memory(error):
            raise
        result = dict(mode=args.mode, status='OOM', error=str(error)[:200])
    print(json.dumps(result), flush=True)


if __name__ == '__main__':
    main(sys.argv[1:])
