r"""``pyg-metric-attn experiment rank_collapse``: rank collapse of stacked
attention at initialisation, dot-product against metric-attention.

Point sets of the two-moons data or of MNIST images (``--data``; each image
is a point, its 784 standardised pixels, as in the paper's IPN) in sets of
``--set-size`` points, lifted to ``--channels`` features by a random linear
map with entries :math:`\mathcal{N}(0, 1/\text{in\_channels})`, go through
``--depth`` freshly initialised propagation blocks of one kind:

* ``attention``: :math:`H \leftarrow S H W_v` (pure attention);
* ``skip``: :math:`H \leftarrow H + S H W_v`;
* ``skip+mlp``: the same, then :math:`H \leftarrow H + \mathrm{MLP}(H)`
  (a two-layer ReLU MLP of width ``2 * channels``),

with :math:`S` from :class:`~pyg_metric_attn.nn.MetricAttentionConv`
(``'dot'``, ``'l2'``, ``'metric'``; one head, all pairs of each set,
``time_scale='matched'`` so every metric starts at the logit scale of
dot-product attention). After each block the distance of each set's features
to rank one, :func:`~pyg_metric_attn.theory.rank_one_residual`, is recorded;
over ``--seeds`` initialisations (and the sets) the mean and spread per depth
go to ``results.json``, ``summary.md`` and ``rank_collapse.png``. Trained
stacks of the same blocks: :mod:`~pyg_metric_attn.experiments.rank_collapse_trained`.
"""
from __future__ import annotations

import argparse
import itertools
import math
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from pyg_metric_attn.nn import MetricAttentionConv
from pyg_metric_attn.theory import residuals_through_depth
from pyg_metric_attn.training.device import Placement, add_placement_arguments
from pyg_metric_attn.utils.io import (
    atomic_writer,
    write_results,
)

NAME = 'rank_collapse'
METRICS = ('dot', 'l2', 'metric')
BLOCKS = ('attention', 'skip', 'skip+mlp')
REPORTED_DEPTHS = (0, 1, 2, 4, 8, 16, 32, 64)
DATA = ('moons', 'mnist')


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """``--data`` and ``--root``: the point sets of both rank experiments."""
    parser.add_argument('--data', choices=DATA, default='moons',
                        help='two moons (noise 0.2) or MNIST images as points')
    parser.add_argument('--root', default='datasets',
                        help="--data mnist: the data root holding MNIST/raw/ "
                             "or raw/ with the four IDX files (downloaded there "
                             "when missing; default: datasets)")


def point_set_data(data: str, num_train: int, num_test: int,
                   root: str = 'datasets') -> tuple[torch.Tensor, ...]:
    """``(x_train, y_train, x_test, y_test)``: the first ``num_train`` and
    ``num_test`` points of one two-moons draw (seed 0) or of MNIST's training
    and test images (standardised pixels)."""
    if data == 'moons':
        from pyg_metric_attn.experiments.tasks.moon import moon_data
        return moon_data(num_train, num_test, seed=0)
    if data == 'mnist':
        from pyg_metric_attn.datasets import MNIST
        x_train, y_train = MNIST(Path(root), train=True).features()
        x_test, y_test = MNIST(Path(root), train=False).features()
        return (x_train[:num_train], y_train[:num_train], x_test[:num_test],
                y_test[:num_test])
    raise ValueError(f"unknown data {data!r}: expected one of {', '.join(DATA)}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_arguments(parser)
    parser.add_argument('--depth', type=int, default=64)
    parser.add_argument('--channels', type=int, default=16)
    parser.add_argument('--set-size', type=int, default=100)
    parser.add_argument('--sets', type=int, default=4)
    parser.add_argument('--seeds', type=int, default=10)
    parser.add_argument('--out', help=f'output folder (default: runs/{NAME})')
    parser.add_argument('--no-progress', action='store_true')
    add_placement_arguments(parser)


class PropagationBlock(torch.nn.Module):
    """One propagation block of the given kind over all pairs of each set."""
    def __init__(self, kind: str, metric: str, channels: int):
        super().__init__()
        self.kind = kind
        self.attention = MetricAttentionConv(channels, channels, metric=metric,
                                             time_scale='matched')
        self.mlp = (torch.nn.Sequential(torch.nn.Linear(channels, 2 * channels),
                                        torch.nn.ReLU(),
                                        torch.nn.Linear(2 * channels, channels))
                    if kind == 'skip+mlp' else None)

    def reset_parameters(self) -> None:
        self.attention.reset_parameters()
        if self.mlp is not None:
            for layer in (self.mlp[0], self.mlp[2]):
                layer.reset_parameters()

    def forward(self, h: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
        update = self.attention.forward_point_sets(h, batch)
        if self.kind == 'attention':
            return update
        h = h + update
        return h if self.mlp is None else h + self.mlp(h)


def measure(depth: int, channels: int, set_size: int, sets: int, seeds: int,
            progress: bool = True, data: str = 'moons',
            root: str = 'datasets',
            placement: Placement | None = None) -> dict[str, Any]:
    placement = placement or Placement()
    x = placement.move(point_set_data(data, set_size * sets, 1, root)[0])
    batch = placement.move(torch.arange(sets).repeat_interleave(set_size))
    curves = []
    grid = list(itertools.product(METRICS, BLOCKS))
    for metric, kind in tqdm(grid, desc=NAME, disable=not progress):
        runs = []
        for seed in range(seeds):
            torch.manual_seed(seed)
            lift = placement.move(torch.randn(x.size(1), channels)
                                  / math.sqrt(x.size(1)))
            blocks = [placement.move(PropagationBlock(kind, metric, channels))
                      for _ in range(depth)]
            layers = [lambda h, b=block: b(h, batch) for block in blocks]
            with placement.autocast():
                runs.append(residuals_through_depth(layers, x @ lift,
                                                    batch).float())
        # [seeds, depth + 1, sets] -> [depth + 1, seeds * sets]
        residuals = torch.stack(runs).transpose(0, 1).flatten(1)
        curves.append(dict(metric=metric, block=kind,
                           mean=residuals.mean(1).tolist(),
                           low=residuals.amin(1).tolist(),
                           high=residuals.amax(1).tolist()))
    return dict(data=data, depth=depth, channels=channels, set_size=set_size,
                sets=sets, seeds=seeds, curves=curves)


def summary_table(results: dict[str, Any]) -> str:
    depths = [d for d in REPORTED_DEPTHS if d <= results['depth']]
    lines = [f"Distance to rank one ||X - 1 mean^T|| / ||X|| of {results['data']} "
             f"point sets after d blocks "
             f"(mean over {results['seeds']} seeds x {results['sets']} sets; "
             'd=0: the input; 0 means rank one).', '',
             '| metric | block | ' + ' | '.join(f'd={d}' for d in depths) + ' |',
             '|' + '---|' * (2 + len(depths))]
    for curve in results['curves']:
        lines.append(f"| {curve['metric']} | {curve['block']} | " + ' | '.join(
            f"{curve['mean'][d]:.2e}" for d in depths) + ' |')
    return '\n'.join(lines) + '\n'


def write(results: dict[str, Any], out: Path) -> None:
    from pyg_metric_attn.visualization import file_figure

    write_results(out, results, summary_table(results))
    figure = file_figure(figsize=(5 * len(BLOCKS), 3.8))
    depths = list(range(results['depth'] + 1))
    for index, kind in enumerate(BLOCKS):
        ax = figure.add_subplot(1, len(BLOCKS), index + 1)
        for curve in results['curves']:
            if curve['block'] != kind:
                continue
            line, = ax.semilogy(depths, curve['mean'], label=curve['metric'])
            ax.fill_between(depths, curve['low'], curve['high'],
                            color=line.get_color(), alpha=0.2)
        ax.set_title(kind)
        ax.set_xlabel('depth (blocks)')
        ax.set_ylabel('distance to rank one')
        ax.grid(alpha=0.3, which='both')
        ax.legend(fontsize=8)
    figure.suptitle(f"{results['data']} point sets at initialisation: mean "
                    f"over {results['seeds']} seeds x {results['sets']} sets, "
                    'band = min to max')
    figure.tight_layout()
    path = out / 'rank_collapse.png'
    with atomic_writer(path) as file:
        figure.savefig(file, format='png', dpi=110)


def main(args: argparse.Namespace) -> int:
    for name in ('depth', 'channels', 'set_size', 'sets', 'seeds'):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    out = Path(args.out or Path('runs') / NAME)
    results = measure(args.depth, args.channels, args.set_size, args.sets,
                      args.seeds, not args.no_progress, args.data, args.root,
                      Placement.of(args.device, args.precision))
    write(results, out)
    print(f'\n{NAME}: results in {out}/\n')
    print(summary_table(results))
    return 0
