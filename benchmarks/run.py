"""Run the benchmark suites, one fresh process per configuration.

    python -m benchmarks.run --suite sparse|dense|scale|all [--quick|--tiny]
        [--lengths L ...] [--edges E ...] [--variants NAME ...] [--out DIR]
        [--resume] [--lock PATH]

Each (case, mode) runs ``python -m benchmarks.measure`` under a memory cap
(on the CPU: ``RLIMIT_AS``, counted above what the process maps after its
imports) and a timeout; one that runs out of either becomes an ``OOM``
or ``timeout`` cell, not a crash. With ``--lock PATH`` every group of cases
that share a baseline runs under an exclusive ``flock`` of PATH, so other
jobs that take the same lock cannot disturb a comparison. Writes
``DIR/SUITE.json`` (all numbers, the machine, versions, the commands) after
every cell, so ``--resume`` goes on where a stopped run left off, and
``DIR/SUITE.md`` (median time and peak memory over the baseline process
size, with ratios to the baseline variant of the same group; the scale suite:
:func:`benchmarks.scale.report`). The scale suite skips a cell, recording why,
where :func:`benchmarks.scale.plan` predicts that it cannot fit, and waits
before a big cell until the machine has the memory the prediction says it
needs.
"""
from __future__ import annotations

import argparse
import contextlib
import fcntl
import itertools
import json
import platform
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import date
from typing import Any

import psutil
import torch
import torch_geometric
from tqdm import tqdm

from benchmarks import scale
from benchmarks.cases import (
    DENSE_BASELINE,
    SCALE_BASELINE,
    SPARSE_BASELINE,
    SUITE_MODES,
    dense_cases,
    group_key,
    scale_cases,
    sparse_cases,
)
from benchmarks.graphs import GRAPH_KINDS
from benchmarks.measure import reads_out_of_memory
from benchmarks.shared import (
    ROOT,
    add_shared_arguments,
    format_cell,
    machine,
    result_key,
    size_of,
)
from pyg_metric_attn.utils.io import atomic_write_json, atomic_write_text

SUITES = {'sparse': (sparse_cases, SPARSE_BASELINE),
          'dense': (dense_cases, DENSE_BASELINE),
          'scale': (scale_cases, SCALE_BASELINE)}
# Timed steps per cell: the scale suite's steps take minutes at 50M edges.
REPEATS = {'sparse': 5, 'dense': 5, 'scale': 2}


def run_one(case: dict[str, Any], mode: str, args: argparse.Namespace) -> dict:
    """Measure ``case`` in ``mode`` in a fresh, capped process."""
    command = [sys.executable, '-m', 'benchmarks.measure', json.dumps(case),
               mode, '--threads', str(args.threads), '--device', args.device,
               '--repeats', str(args.repeats)]
    if args.device == 'cpu':
        command += ['--memory-gib', str(args.memory_gib)]

    limits = dict(memory_cap_gib=args.memory_gib, timeout_s=args.timeout)
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True,
                              timeout=args.timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return dict(mode=mode, status='timeout', wall_s=args.timeout, **limits)
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.startswith('{')]
    if done.returncode == 0 and lines:
        return json.loads(lines[-1]) | dict(wall_s=wall, **limits)
    error = (done.stderr.strip().splitlines() or ['no output'])[-1]
    if done.returncode == -9:
        error = ('killed by SIGKILL (the kernel OOM killer: the machine ran out '
                 f'of memory, not necessarily the cap): {error}')
    # A process killed by the memory cap (or the kernel) or failing to
    # allocate under it is out of memory; anything else is a real failure.
    out_of_memory = done.returncode < 0 or reads_out_of_memory(error)
    return dict(mode=mode, status='OOM' if out_of_memory else 'error',
                error=error[:300], wall_s=wall, **limits)


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


def wait_for_memory(need_mib: float, wait_s: float) -> float:
    """Wait up to ``wait_s`` seconds until the machine has ``need_mib``
    available (other processes share it); returns what is available."""
    deadline = time.time() + wait_s
    while True:
        available = psutil.virtual_memory().available / 2**20
        if available >= need_mib or time.time() >= deadline:
            return available
        time.sleep(min(15.0, max(deadline - time.time(), 0.0)))


# Results kept by --resume; the rest runs again.
FINAL_STATUSES = ('ok', 'OOM', 'timeout')


def run_suite(name: str, args: argparse.Namespace,
              meta: dict[str, Any]) -> list[dict[str, Any]]:
    """Measure the suite's selected cases; ``DIR/NAME.json`` holds ``meta``
    and every result so far after each cell (with ``--resume``, also the
    results of earlier runs: those of :data:`FINAL_STATUSES` are kept and
    not measured again unless ``--remeasure``)."""
    make_cases, baseline = SUITES[name]
    every_case = make_cases(args.size)
    cases = [case for case in every_case
             if (args.lengths is None or case.get('length') in args.lengths)
             and (args.edges is None or case.get('edges') in args.edges)
             and (args.graphs is None or case.get('graph') in args.graphs)
             and (args.variants is None
                  or case['variant'] in (*args.variants, baseline))]
    modes = SUITE_MODES[name]
    path = args.out / f'{name}.json'
    by_key: dict[str, dict[str, Any]] = {}
    if args.resume and path.exists():
        earlier = json.loads(path.read_text())
        by_key = {result_key(r['case'], r['mode']): r
                  for r in earlier['results']}
        meta['earlier_runs'] = earlier['meta'].get('earlier_runs', []) + [
            {k: earlier['meta'].get(k) for k in ('command', 'commit', 'date',
                                                 'wall_min')}]
    order = {result_key(case, mode): i for i, (case, mode) in enumerate(
        itertools.product(every_case, modes))}
    start = time.perf_counter()

    def ordered() -> list[dict[str, Any]]:
        return sorted(by_key.values(), key=lambda r: order.get(
            result_key(r['case'], r['mode']), len(order)))

    with tqdm(total=len(cases) * len(modes), desc=name, unit='run') as bar:
        for _, group in itertools.groupby(cases, key=group_key):
            with maybe_locked(args.lock):
                for case, mode in itertools.product(group, modes):
                    key = result_key(case, mode)
                    bar.set_postfix_str(_label(case, mode))
                    old = by_key.get(key)
                    again = args.remeasure is not None and (
                        not args.remeasure or case['variant'] in args.remeasure)
                    if again or old is None or \
                            old['status'] not in FINAL_STATUSES:
                        by_key[key] = dict(case=case, commit=meta['commit'],
                                           **_run_cell(name, case, mode,
                                                       ordered(), args))
                        meta['wall_min'] = (time.perf_counter() - start) / 60
                        args.out.mkdir(parents=True, exist_ok=True)
                        atomic_write_json(path, dict(meta=meta,
                                                     results=ordered()))
                    bar.update()
    meta['wall_min'] = (time.perf_counter() - start) / 60
    return ordered()


def _run_cell(name: str, case: dict[str, Any], mode: str,
              results: list[dict[str, Any]],
              args: argparse.Namespace) -> dict[str, Any]:
    """One cell: skipped where its plan says so, else measured once the
    machine has the memory it is predicted to need."""
    if name != 'scale':
        return run_one(case, mode, args)
    cell = scale.plan(case, [r for r in results if r['mode'] == mode],
                      args.memory_gib, args.timeout, args.skip_over_cap)
    predicted = dict(predicted_mib=cell['predicted_mib'],
                     prediction_basis=cell['basis'])
    if cell['skip'] is not None:
        return dict(mode=mode, status='skipped', error=cell['skip'], **predicted)
    if cell['predicted_mib'] is not None:
        need = min(cell['predicted_mib'], args.memory_gib * 1024) + 1024
        available = wait_for_memory(need, args.memory_wait)
        if available < need:
            return dict(mode=mode, status='skipped', **predicted, error=(
                f'the machine had {available / 1024:.1f} GiB available for '
                f'{args.memory_wait:g} s, the cell needs {need / 1024:.1f}'))
    return run_one(case, mode, args) | predicted


def _label(case: dict[str, Any], mode: str) -> str:
    sizes = ' '.join(f'{k}={v}' for k, v in case.items()
                     if k not in ('suite', 'variant'))
    return f"{case['variant']} {sizes} {mode}"


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
    if name == 'scale':
        return scale.report(results, meta)
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


def git_commit() -> str:
    """The checkout's commit (``+`` where tracked files differ from it)."""
    def git(*command: str) -> str:
        return subprocess.run(['git', *command], cwd=ROOT, capture_output=True,
                              text=True).stdout.strip()
    with contextlib.suppress(OSError):
        commit = git('rev-parse', '--short', 'HEAD')
        if commit:
            return commit + ('+' if git('status', '--porcelain',
                                        '--untracked-files=no') else '')
    return 'unknown'


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description='Speed/memory benchmarks, one fresh process per case.')
    argv = sys.argv[1:] if argv is None else list(argv)
    if any(arg == '--suite=gpu' or argv[i:i + 2] == ['--suite', 'gpu']
           for i, arg in enumerate(argv)):
        from benchmarks.gpu_cases import main as gpu_main
        return gpu_main(argv)
    parser.add_argument('--suite',
                        choices=['sparse', 'dense', 'scale', 'all', 'gpu'],
                        default='all', help="'gpu': see benchmarks/gpu_cases.py "
                        "(its own options; not part of all); 'scale': see "
                        'benchmarks/scale.py (not part of all)')
    add_shared_arguments(
        parser, device='cpu', timeout=900.0,
        quick='a small grid (sparse: 1k/10k nodes, degree 20, 4 heads; '
              'dense: L in {256, 1024}; scale: 200k and 2M edges)',
        tiny='scale: toy graphs that run in seconds (tests)',
        resume='keep the ok, OOM and timeout results in OUT/SUITE.json and '
               'run only the rest')
    parser.add_argument('--lengths', type=int, nargs='+', default=None,
                        help='dense: only these sequence lengths')
    parser.add_argument('--edges', type=int, nargs='+', default=None,
                        help='scale: only the graphs of these edge counts')
    parser.add_argument('--graphs', nargs='+', default=None,
                        choices=GRAPH_KINDS,
                        help='scale: only these kinds of graph')
    parser.add_argument('--threads', type=int, default=2)
    parser.add_argument('--repeats', type=int, default=None,
                        help='timed steps per cell after a warm-up (default: '
                             '5; scale: 2)')
    parser.add_argument('--memory-gib', type=float, default=14.0,
                        help='address-space cap per process (CPU)')
    parser.add_argument('--skip-over-cap', type=float, default=3.0,
                        help='scale: skip a cell predicted to need this many '
                             'times the cap (default 3)')
    parser.add_argument('--memory-wait', type=float, default=1800.0,
                        help='scale: seconds to wait for the memory a cell is '
                             'predicted to need before skipping it')
    parser.add_argument('--remeasure', nargs='*', default=None,
                        metavar='VARIANT',
                        help='with --resume: measure the selected cells again '
                             'even where a result is kept (only those of these '
                             'variants, if named)')
    parser.add_argument('--lock', default=None,
                        help='flock this file around each group of cases')
    args = parser.parse_args(argv)
    args.size = size_of(args)
    suites = ['sparse', 'dense'] if args.suite == 'all' else [args.suite]
    if args.tiny and suites != ['scale']:
        parser.error('--tiny is a size of the scale suite only')
    repeats = args.repeats
    for name in suites:
        args.repeats = REPEATS[name] if repeats is None else repeats
        meta = dict(command='python -m benchmarks.run ' + ' '.join(argv),
                    commit=git_commit(), machine=machine(), torch=torch.__version__,
                    torch_geometric=torch_geometric.__version__,
                    python=platform.python_version(), threads=args.threads,
                    device=args.device, date=date.today().isoformat(),
                    repeats=args.repeats, memory_gib=args.memory_gib,
                    timeout=args.timeout)
        results = run_suite(name, args, meta)
        atomic_write_json(args.out / f'{name}.json',
                          dict(meta=meta, results=results))
        table = report(name, results, meta)
        atomic_write_text(args.out / f'{name}.md', table)
        print(table)


if __name__ == '__main__':
    main()
