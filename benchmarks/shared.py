"""What the CPU suites (:mod:`benchmarks.run`) and the GPU suite
(:mod:`benchmarks.gpu_cases`) share: the key of a result, a table cell, the
machine, and the options both command lines take.

Both suites import it and neither imports the other at module level
(:mod:`benchmarks.run` hands ``--suite gpu`` to the GPU suite's ``main``).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def result_key(case: dict[str, Any], mode: str) -> str:
    """The key of a (case, mode) result: what ``--resume`` matches on."""
    return json.dumps([case, mode], sort_keys=True)


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


def machine() -> str:
    """The CPU model, its cores and the memory, in words."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        with open('/proc/cpuinfo') as f:
            cpu = next(line.split(':', 1)[1].strip() for line in f
                       if line.startswith('model name'))
    memory = os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30
    return f'{cpu}, {os.cpu_count()} cores, {memory:.0f} GiB'


def add_shared_arguments(parser: argparse.ArgumentParser, *, device: str,
                         timeout: float, quick: str, tiny: str,
                         resume: str) -> None:
    """The options of both suites: ``--device``, ``--out``, ``--quick`` /
    ``--tiny`` (one or neither), ``--variants``, ``--timeout`` and
    ``--resume``; each suite gives its defaults and what its sizes and
    resumption mean."""
    parser.add_argument('--device', default=device)
    parser.add_argument('--out', type=Path,
                        default=ROOT / 'benchmarks' / 'results')
    size = parser.add_mutually_exclusive_group()
    size.add_argument('--quick', action='store_true', help=quick)
    size.add_argument('--tiny', action='store_true', help=tiny)
    parser.add_argument('--variants', nargs='+', default=None,
                        help='only these variants (the CPU suites keep their '
                             'baseline too)')
    parser.add_argument('--timeout', type=float, default=timeout,
                        help=f'seconds per process (default {timeout:g})')
    parser.add_argument('--resume', action='store_true', help=resume)


def size_of(args: argparse.Namespace) -> str:
    """``'tiny'``, ``'quick'`` or ``'full'``, from the parsed options."""
    return 'tiny' if args.tiny else 'quick' if args.quick else 'full'
