"""Run the benchmark suites, one fresh process per configuration.

    python -m benchmarks.run --suite sparse|dense|all [--quick]
        [--lengths L ...] [--variants NAME ...] [--out DIR]

Each (case, mode) runs ``python -m benchmarks.measure`` under a memory cap
(``RLIMIT_AS``) and a timeout; one that runs out of either becomes an ``OOM``
or ``timeout`` cell, not a crash. With ``--lock PATH`` every group of cases
that share a baseline runs under an exclusive ``flock`` of PATH, so other
jobs that take the same lock cannot disturb a comparison. Writes
``DIR/SUITE.json`` (all numbers, the machine, versions, the command) and
``DIR/SUITE.md`` (median time and peak memory over the baseline process
size, with ratios to the baseline variant of the same group).
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import itertools
import json
import os
import platform
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import date
from pathlib import Path
from typing import Any

import torch
import torch_geometric
from tqdm import tqdm

from benchmarks.cases import (
    DENSE_BASELINE,
    MODES,
    SPARSE_BASELINE,
    dense_cases,
    group_key,
    sparse_cases,
)
from pyg_metric_attn.utils.io import atomic_write_json, atomic_write_text

SUITES = {'sparse': (sparse_cases, SPARSE_BASELINE),
          'dense': (dense_cases, DENSE_BASELINE)}
ROOT = Path(__file__).resolve().parents[1]


def run_one(case: dict[str, Any], mode: str, args: argparse.Namespace) -> dict:
    """Measure ``case`` in ``mode`` in a fresh, capped process."""
    command = [sys.executable, '-m', 'benchmarks.measure', json.dumps(case),
               mode, '--threads', str(args.threads), '--device', args.device,
               '--repeats', str(args.repeats)]
    cap = int(args.memory_gib * 2**30)

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True,
                              timeout=args.timeout, cwd=ROOT,
                              preexec_fn=limit_memory if args.device == 'cpu'
                              else None)
    except subprocess.TimeoutExpired:
        return dict(mode=mode, status='timeout', wall_s=args.timeout)
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith('{')]
    if done.returncode == 0 and lines:
        return json.loads(lines[-1]) | dict(wall_s=wall)
    error = (done.stderr.strip().splitlines() or ['no output'])[-1]
    # A process killed by the memory cap (or the kernel) or failing to
    # allocate under it is out of memory; anything else is a real failure.
    out_of_memory = done.returncode < 0 or 'memory' in error.lower() or \
        'allocate' in error.lower()
    return dict(mode=mode, status='OOM' if out_of_memory else 'error',
                error=error[:300], wall_s=wall)


@contextlib.contextmanager
def maybe_locked(path: str | None) -> Iterator[None]:
    if path is None:
        yield
        return
    with open(path, 'a') as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_suite(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    make_cases, baseline = SUITES[name]
    cases = [case for case in make_cases(args.quick)
             if (args.lengths is None or case.get('length') in args.lengths)
             and (args.variants is None
                  or case['variant'] in (*args.variants, baseline))]
    results = []
    with tqdm(total=len(cases) * len(MODES), desc=name, unit='run') as bar:
        for _, group in itertools.groupby(cases, key=group_key):
            with maybe_locked(args.lock):
                for case in group:
                    for mode in MODES:
                        bar.set_postfix_str(_label(case, mode))
                        results.append(dict(case=case,
                                            **run_one(case, mode, args)))
                        bar.update()
    return results


def _label(case: dict[str, Any], mode: str) -> str:
    sizes = ' '.join(f'{k}={v}' for k, v in case.items()
                     if k not in ('suite', 'variant'))
    return f"{case['variant']} {sizes} {mode}"


def format_cell(result: dict[str, Any] | None, baseline: dict[str, Any] | None,
                key: str, scale: float, digits: int) -> str:
    """``value (ratio to the baseline)``, the status of a failed run, ``-``
    where the run did not measure ``key``."""
    if result is None:
        return ''
    if result['status'] != 'ok':
        return result['status']
    if key not in result:
        return '-'
    text = f'{result[key] * scale:.{digits}f}'
    if baseline is not None and baseline.get('status') == 'ok' and \
            baseline.get(key, 0) > 0:
        text += f' ({result[key] / baseline[key]:.2f}x)'
    return text


def markdown_table(results: list[dict[str, Any]], baseline: str,
                   key: str, scale: float, digits: int) -> str:
    """One row per (sizes, mode), one column per variant: ``value (ratio)``."""
    variants = list(dict.fromkeys(r['case']['variant'] for r in results))
    rows: dict[tuple, dict[str, dict]] = {}
    for result in results:
        row = (group_key(result['case']), result['mode'])
        rows.setdefault(row, {})[result['case']['variant']] = result
    size_names = [k for k, _ in next(iter(rows))[0]
                  if k not in ('suite', 'channels', 'batch', 'head_dim',
                               'scale')]
    header = size_names + ['mode'] + variants
    lines = ['| ' + ' | '.join(header) + ' |',
             '|' + '---|' * len(header)]
    for (sizes, mode), by_variant in rows.items():
        sizes = dict(sizes)
        cells = [str(sizes[k]) for k in size_names] + [mode]
        cells += [format_cell(by_variant.get(v), by_variant.get(baseline), key, scale,
                        digits) for v in variants]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines)


def report(name: str, results: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    _, baseline = SUITES[name]
    first = results[0]['case']
    fixed = ', '.join(f'{k}={first[k]}'
                      for k in ('channels', 'batch', 'head_dim', 'scale')
                      if k in first)
    memory = ('peak GPU memory allocated, MiB' if meta['device'] != 'cpu' else
              'peak RSS over the process size after imports and inputs, MiB')
    return '\n\n'.join([
        f'## {name} suite ({fixed}; ratios to {baseline} of the same row)',
        f"`{meta['command']}` on {meta['machine']}, torch {meta['torch']}, "
        f"torch_geometric {meta['torch_geometric']}, {meta['threads']} threads, "
        f"{meta['date']}; suite wall time {meta['wall_min']:.1f} min.",
        '### Median time per step, ms',
        markdown_table(results, baseline, 'median_s', 1e3, 1),
        f'### Memory ({memory})',
        markdown_table(results, baseline, 'peak_over_baseline_mib', 1.0, 0),
    ]) + '\n'


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open('/proc/cpuinfo') as f:
            cpu = next(line.split(':', 1)[1].strip() for line in f
                       if line.startswith('model name'))
    memory = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30
    return f'{cpu}, {os.cpu_count()} cores, {memory:.0f} GiB'


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description='Speed/memory benchmarks, one fresh process per case.')
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(arg == '--suite=gpu' or argv[i:i + 2] == ['--suite', 'gpu']
           for i, arg in enumerate(argv)):
        from benchmarks.gpu_cases import main as gpu_main
        return gpu_main(argv)
    parser.add_argument('--suite', choices=['sparse', 'dense', 'all', 'gpu'],
                        default='all', help="'gpu': see benchmarks/gpu_cases.py "
                        '(its own options; not part of all)')
    parser.add_argument('--quick', action='store_true',
                        help='a small grid (sparse: 1k/10k nodes, degree 20, '
                             '4 heads; dense: L in {256, 1024})')
    parser.add_argument('--lengths', type=int, nargs='+', default=None,
                        help='dense: only these sequence lengths')
    parser.add_argument('--variants', nargs='+', default=None,
                        help='only these variants (and the baseline)')
    parser.add_argument('--out', type=Path, default=ROOT / 'benchmarks' / 'results')
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--device', default='cpu')
    parser.add_argument('--repeats', type=int, default=5)
    parser.add_argument('--timeout', type=float, default=900.0,
                        help='seconds per (case, mode) process')
    parser.add_argument('--memory-gib', type=float, default=14.0,
                        help='address-space cap per process (CPU)')
    parser.add_argument('--lock', default=None,
                        help='flock this file around each group of cases')
    args = parser.parse_args(argv)
    suites = ['sparse', 'dense'] if args.suite == 'all' else [args.suite]
    for name in suites:
        start = time.perf_counter()
        results = run_suite(name, args)
        meta = dict(command='python -m benchmarks.run ' + ' '.join(
                        argv if argv is not None else sys.argv[1:]),
                    machine=machine(), torch=torch.__version__,
                    torch_geometric=torch_geometric.__version__,
                    python=platform.python_version(), threads=args.threads,
                    device=args.device, date=date.today().isoformat(),
                    wall_min=(time.perf_counter() - start) / 60)
        atomic_write_json(args.out / f'{name}.json',
                          dict(meta=meta, results=results))
        table = report(name, results, meta)
        atomic_write_text(args.out / f'{name}.md', table)
        print(table)


if __name__ == '__main__':
    main()
