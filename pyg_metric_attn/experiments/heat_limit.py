r"""``pyg-metric-attn experiment heat_limit``: the heat-kernel limit of
attention propagation measured (the paper's sections 2.3 and 3).

For every manifold and density of :mod:`pyg_metric_attn.theory.manifolds`,
sample size :math:`n`, time :math:`t` and seed, the relative RMS error of
:math:`(S f - f)/(t/4)` against :math:`\Delta f + 2\nabla\log p\cdot\nabla f`
(:func:`~pyg_metric_attn.theory.heat_limit.relative_error`). Written to the
output folder: ``results.json`` (every cell, then the fits), ``summary.md``
(the error table, the best :math:`t` per :math:`n` and the fitted log-log
slopes next to the theory's) and ``heat_limit.png`` (error against
:math:`t`, one line per :math:`n`, one panel per manifold and density).

Fitted slopes, per manifold and density: the bias regime (largest
:math:`n`, the times from the best one up: theory 1), the variance regime
(smallest :math:`t`, all :math:`n`: theory -1/2) and the best time against
:math:`n` (theory :math:`-1/(d/2 + 3)` from balancing the squared bias
:math:`t^2` with the variance :math:`1/(n t^{d/2+1})`).
"""
from __future__ import annotations

import argparse
import itertools
import statistics
from pathlib import Path
from typing import Any

from tqdm import tqdm

from pyg_metric_attn.theory import MANIFOLDS, log_log_slope, relative_error
from pyg_metric_attn.theory.manifolds import DENSITIES
from pyg_metric_attn.utils.io import (
    atomic_writer,
    write_results,
)

NAME = 'heat_limit'
SIZES = (500, 1000, 2000, 4000, 8000)
TIMES = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--manifolds', default=','.join(MANIFOLDS),
                        help=f"comma-separated, of {', '.join(MANIFOLDS)}")
    parser.add_argument('--densities', default=','.join(DENSITIES),
                        help=f"comma-separated, of {', '.join(DENSITIES)}")
    parser.add_argument('--sizes', type=int, nargs='+', default=list(SIZES),
                        help='sample sizes n')
    parser.add_argument('--times', type=float, nargs='+', default=list(TIMES),
                        help='heat-kernel times t')
    parser.add_argument('--seeds', type=int, default=3, help='samples per cell')
    parser.add_argument('--out', help=f'output folder (default: runs/{NAME})')
    parser.add_argument('--no-progress', action='store_true')


def main(args: argparse.Namespace) -> int:
    manifolds = parse_names(args.manifolds, MANIFOLDS, 'manifold')
    densities = parse_names(args.densities, DENSITIES, 'density')
    if min(args.sizes) < 2 or min(args.times) <= 0 or args.seeds < 1:
        raise ValueError('sizes must be at least 2, times positive and seeds '
                         'at least 1')
    out = Path(args.out or Path('runs') / NAME)
    results = measure(manifolds, densities, sorted(args.sizes),
                      sorted(args.times), args.seeds, not args.no_progress)
    write(results, out)
    print(f'\n{NAME}: results in {out}/\n')
    print(summary_table(results))
    return 0


def parse_names(text: str, known, kind: str) -> list[str]:
    """The comma-separated names of ``text``, each checked against ``known``."""
    names = [name for name in text.split(',') if name]
    unknown = [name for name in names if name not in known]
    if unknown or not names:
        raise ValueError(f"Unknown {kind} {unknown}; expected some of "
                         f"{', '.join(known)}")
    return names


def measure(manifolds: list[str], densities: list[str], sizes: list[int],
            times: list[float], seeds: int, progress: bool = True
            ) -> dict[str, Any]:
    """Every cell's error, then the per-curve means, best times and fits."""
    cells = []
    grid = list(itertools.product(manifolds, densities, sizes, range(seeds)))
    for manifold, density, n, seed in tqdm(grid, desc=NAME, disable=not progress):
        sample = MANIFOLDS[manifold](n, density, seed=seed)
        for t in times:
            cells.append(dict(manifold=manifold, density=density, n=n, t=t,
                              seed=seed, error=relative_error(sample, t)))
    curves = []
    for manifold, density in itertools.product(manifolds, densities):
        dimension = MANIFOLDS[manifold](2).dimension
        mean = {(n, t): statistics.fmean(
            c['error'] for c in cells if (c['manifold'], c['density'], c['n'],
                                          c['t']) == (manifold, density, n, t))
            for n in sizes for t in times}
        best = {n: min(times, key=lambda t, n=n: mean[n, t]) for n in sizes}
        largest = sizes[-1]
        bias_times = [t for t in times if t >= best[largest]]
        curves.append(dict(
            manifold=manifold, density=density, dimension=dimension,
            error={f'{n}': {f'{t}': mean[n, t] for t in times} for n in sizes},
            best_time={f'{n}': best[n] for n in sizes},
            bias_slope=(log_log_slope(bias_times, [mean[largest, t]
                                                   for t in bias_times])
                        if len(bias_times) > 1 else None),
            variance_slope=(log_log_slope(sizes, [mean[n, times[0]]
                                                  for n in sizes])
                            if len(sizes) > 1 else None),
            best_time_slope=(log_log_slope(sizes, [best[n] for n in sizes])
                             if len(set(best.values())) > 1 else None),
            best_time_theory=-1 / (dimension / 2 + 3)))
    return dict(sizes=sizes, times=times, seeds=seeds, cells=cells,
                curves=curves)


def _slope(value: float | None) -> str:
    return '-' if value is None else f'{value:+.2f}'


def summary_table(results: dict[str, Any]) -> str:
    sizes, times = results['sizes'], results['times']
    lines = ['Relative RMS error of (S f - f)/(t/4) against the drift-diffusion '
             f"target, mean of {results['seeds']} samples; best t per n in bold.",
             '']
    header = '| manifold | density | n | ' + ' | '.join(
        f't={t:g}' for t in times) + ' |'
    lines += [header, '|' + '---|' * (3 + len(times))]
    for curve in results['curves']:
        for n in sizes:
            errors = curve['error'][f'{n}']
            best = curve['best_time'][f'{n}']
            row = [f'**{errors[f"{t}"]:.3f}**' if t == best
                   else f'{errors[f"{t}"]:.3f}' for t in times]
            lines.append(f"| {curve['manifold']} | {curve['density']} | {n} | "
                         + ' | '.join(row) + ' |')
    lines += ['', '| manifold | density | d | bias slope (theory +1) | '
              'variance slope (theory -0.5) | best-t slope (theory) |',
              '|---|---|---|---|---|---|']
    for curve in results['curves']:
        lines.append(
            f"| {curve['manifold']} | {curve['density']} | {curve['dimension']} | "
            f"{_slope(curve['bias_slope'])} | {_slope(curve['variance_slope'])} | "
            f"{_slope(curve['best_time_slope'])} "
            f"({curve['best_time_theory']:+.2f}) |")
    return '\n'.join(lines) + '\n'


def write(results: dict[str, Any], out: Path) -> None:
    from pyg_metric_attn.visualization import file_figure

    write_results(out, results, summary_table(results))
    curves = results['curves']
    columns = min(len(curves), 2)
    rows = -(-len(curves) // columns)
    figure = file_figure(figsize=(5 * columns, 3.6 * rows))
    for index, curve in enumerate(curves):
        ax = figure.add_subplot(rows, columns, index + 1)
        for n in results['sizes']:
            errors = curve['error'][f'{n}']
            ax.loglog(results['times'], [errors[f'{t}'] for t in results['times']],
                      marker='o', label=f'n={n}')
        ax.set_title(f"{curve['manifold']}, {curve['density']}")
        ax.set_xlabel('t')
        ax.set_ylabel('relative error')
        ax.grid(alpha=0.3, which='both')
    figure.axes[0].legend(fontsize=8)
    figure.tight_layout()
    path = out / 'heat_limit.png'
    with atomic_writer(path) as file:
        figure.savefig(file, format='png', dpi=110)
