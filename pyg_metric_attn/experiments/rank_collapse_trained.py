r"""``pyg-metric-attn experiment rank_collapse_trained``: rank collapse through
the depth of *trained* attention stacks, dot-product against metric-attention.

For every metric (``'dot'``, ``'l2'``, ``'metric'``), block kind
(``attention``, ``skip``, ``skip+mlp``: the blocks of
:mod:`~pyg_metric_attn.experiments.rank_collapse`), depth :math:`d` of
``--depths`` and seed, a classifier

.. math::
    x \xrightarrow{\text{Linear}} H_0 \xrightarrow{\text{block}_1} H_1
    \cdots \xrightarrow{\text{block}_d} H_d \xrightarrow{\text{Linear}}
    \text{logits}

is trained to classify the points of the two-moons data or MNIST's images
(``--data``; each image a point of 784 standardised pixels, as in the paper's
IPN) in sets of ``--set-size`` points, one Adam step per set, ``--epochs``
epochs: a fixed budget for every depth. Before
and after training, the distance of each held-out set's features to rank one,
:func:`~pyg_metric_attn.theory.rank_one_residual`, is recorded for
:math:`H_0, \dots, H_d`, and the held-out accuracy after training. Written
to the output folder: ``results.json`` (every run), ``summary.md`` (the
distance at the last block and the accuracy per depth, trained and at
initialisation) and ``rank_collapse_trained.png`` (those against depth, and
the distance through the deepest stack, one column per block kind; an exact
rank one is drawn at 1e-12).

A run whose training loss becomes non-finite (deep stacks without
normalisation can blow up) is recorded as diverged, with its epoch, and left
out of the trained means; the tables count such seeds. The grid can be split
over processes (``--metrics``, ``--blocks``, ``--depths``, ``--first-seed``
and ``--seeds``) and the parts' folders joined with ``--merge``.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm import tqdm

from pyg_metric_attn.experiments.heat_limit import parse_names
from pyg_metric_attn.experiments.rank_collapse import (
    BLOCKS,
    METRICS,
    PropagationBlock,
    add_data_arguments,
    point_set_data,
)
from pyg_metric_attn.experiments.tasks.point_sets import consecutive_sets
from pyg_metric_attn.theory import residuals_through_depth
from pyg_metric_attn.training import Trainer, epoch_generator, seed_everything
from pyg_metric_attn.training.device import Placement, add_placement_arguments
from pyg_metric_attn.utils.io import (
    atomic_writer,
    write_results,
)
from pyg_metric_attn.utils.point_sets import shuffled_sets

NAME = 'rank_collapse_trained'
DEPTHS = (1, 2, 4, 8, 16, 32, 64)


class StackClassifier(torch.nn.Module):
    """A linear lift, ``depth`` propagation blocks of one kind, a linear
    per-point classifier."""
    def __init__(self, in_channels: int, channels: int, num_classes: int,
                 kind: str, metric: str, depth: int):
        super().__init__()
        self.lift = torch.nn.Linear(in_channels, channels)
        self.blocks = torch.nn.ModuleList(
            PropagationBlock(kind, metric, channels) for _ in range(depth))
        self.head = torch.nn.Linear(channels, num_classes)

    def reset_parameters(self) -> None:
        self.lift.reset_parameters()
        for block in self.blocks:
            block.reset_parameters()
        self.head.reset_parameters()

    def forward(self, x: Tensor, batch: Tensor | None = None) -> Tensor:
        h = self.lift(x)  # [N, channels]
        for block in self.blocks:
            h = block(h, batch)
        return self.head(h)  # [N, num_classes]

    def residuals(self, x: Tensor, batch: Tensor) -> Tensor:
        """Distance to rank one of each set after the lift and after every
        block, ``[1 + depth, num_sets]``."""
        with torch.no_grad():
            lifted = self.lift(x)
        return residuals_through_depth(
            [lambda h, b=block: b(h, batch) for block in self.blocks], lifted,
            batch)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_data_arguments(parser)
    parser.add_argument('--depths', type=int, nargs='+', default=list(DEPTHS))
    parser.add_argument('--metrics', default=','.join(METRICS),
                        help=f"comma-separated, of {', '.join(METRICS)}")
    parser.add_argument('--blocks', default=','.join(BLOCKS),
                        help=f"comma-separated, of {', '.join(BLOCKS)}")
    parser.add_argument('--channels', type=int, default=16)
    parser.add_argument('--set-size', type=int, default=100)
    parser.add_argument('--num-train', type=int, default=400,
                        help='training points (MNIST: its first training '
                             'images)')
    parser.add_argument('--num-test', type=int, default=400,
                        help='held-out points (MNIST: its first test images): '
                             'accuracy and the distances')
    parser.add_argument('--epochs', type=int, default=40)
    parser.add_argument('--lr', type=float, default=2e-3)
    parser.add_argument('--seeds', type=int, default=10)
    parser.add_argument('--first-seed', type=int, default=0,
                        help='seeds first-seed .. first-seed + seeds - 1')
    parser.add_argument('--out', help=f'output folder (default: runs/{NAME})')
    parser.add_argument('--merge', nargs='+', metavar='DIR',
                        help='instead of training, merge the results.json of '
                             'earlier runs of disjoint parts of the grid into '
                             '--out')
    parser.add_argument('--no-progress', action='store_true')
    add_placement_arguments(parser)


def train_one(metric: str, kind: str, depth: int, seed: int,
              data: tuple[Tensor, ...], channels: int, set_size: int,
              epochs: int, lr: float,
              placement: Placement | None = None) -> dict[str, Any]:
    """Residuals through depth at initialisation and after training, the
    held-out accuracy and the last training loss of one run (``data`` on
    the device of ``placement``)."""
    placement = placement or Placement()
    x_train, y_train, x_test, y_test = data
    test_sets = placement.move(consecutive_sets(x_test.size(0), set_size))
    seed_everything(seed)
    model = placement.move(StackClassifier(
        x_train.size(1), channels, int(y_train.max()) + 1, kind, metric, depth))
    with placement.autocast():
        initial = model.residuals(x_test, test_sets).float()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=1e-4,
                                 foreach=True)

    def batches(epoch: int):
        for index in shuffled_sets(x_train.size(0), set_size,
                                   epoch_generator(seed, epoch)):
            index = index.to(x_train.device)
            yield x_train[index], y_train[index]

    def step(model: torch.nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)

    run = dict(metric=metric, block=kind, depth=depth, seed=seed,
               initial=initial.mean(1).tolist(), diverged_at_epoch=None)
    trainer = Trainer(model, optimizer, step, progress=False,
                      placement=placement)
    try:
        history = trainer.fit(batches, epochs)
    except FloatingPointError:  # a non-finite training loss: a result too
        return {**run, 'diverged_at_epoch': len(trainer.history) + 1,
                'trained': None, 'train_loss': None, 'test_acc': None}
    model.eval()
    with torch.no_grad(), placement.autocast():
        logits = model(x_test, test_sets)
        trained = model.residuals(x_test, test_sets).float()
    return {**run,
            'trained': trained.mean(1).tolist(),
            'train_loss': history[-1]['train_loss'] if history else None,
            'test_acc': float((logits.argmax(-1) == y_test).float().mean())}


def measure(metrics: list[str], blocks: list[str], depths: list[int],
            seeds: int, channels: int, set_size: int, num_train: int,
            num_test: int, epochs: int, lr: float, progress: bool = True,
            first_seed: int = 0, data_name: str = 'moons',
            root: str = 'datasets',
            placement: Placement | None = None) -> dict[str, Any]:
    placement = placement or Placement()
    data = placement.move(point_set_data(data_name, num_train, num_test, root))
    grid = list(itertools.product(metrics, blocks, depths,
                                 range(first_seed, first_seed + seeds)))
    runs = []
    bar = tqdm(total=sum(d for _, _, d, _ in grid), desc=NAME, unit='block',
               disable=not progress)
    for metric, kind, depth, seed in grid:
        runs.append(train_one(metric, kind, depth, seed, data, channels,
                              set_size, epochs, lr, placement))
        bar.update(depth)
    bar.close()
    return aggregate(dict(data=data_name, metrics=metrics, blocks=blocks,
                          depths=depths, seeds=seeds, channels=channels,
                          set_size=set_size, num_train=num_train, num_test=num_test,
                          epochs=epochs, lr=lr, runs=runs))


def aggregate(results: dict[str, Any]) -> dict[str, Any]:
    """``results`` with its ``curves``: per metric, block kind and depth, the
    seeds' mean distance after the last block at initialisation, and over
    the seeds whose training did not diverge, the mean trained distance, its
    range and the accuracy (:obj:`None` where every seed diverged) and the
    number of seeds that diverged."""
    curves = []
    for metric, kind, depth in itertools.product(
            results['metrics'], results['blocks'], results['depths']):
        mine = [r for r in results['runs']
                if (r['metric'], r['block'], r['depth']) == (metric, kind, depth)]
        if not mine:
            raise ValueError(f'no run of metric {metric!r}, block {kind!r}, '
                             f'depth {depth} to aggregate')
        trained = [r for r in mine if r.get('diverged_at_epoch') is None]
        last_trained = [r['trained'][-1] for r in trained]
        accuracy = [r['test_acc'] for r in trained]
        curve = dict(metric=metric, block=kind, depth=depth,
                     last_initial=statistics.fmean(r['initial'][-1] for r in mine),
                     diverged=len(mine) - len(trained),
                     input_trained=None, last_trained=None,
                     last_trained_low=None, last_trained_high=None,
                     test_acc=None, test_acc_std=None)
        if trained:
            curve.update(
                input_trained=statistics.fmean(r['trained'][0] for r in trained),
                last_trained=statistics.fmean(last_trained),
                last_trained_low=min(last_trained),
                last_trained_high=max(last_trained),
                test_acc=statistics.fmean(accuracy),
                test_acc_std=statistics.pstdev(accuracy))
        curves.append(curve)
    return {**results, 'curves': curves}


SETTINGS = ('data', 'channels', 'set_size', 'num_train', 'num_test', 'epochs',
            'lr')


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from the ``results.json`` of runs of the same settings over
    disjoint parts of the grid (other metrics, block kinds, depths or seeds),
    e.g. one process per metric. Every metric, block kind and depth of the
    union must have the same seeds."""
    first = parts[0]
    for part in parts[1:]:
        for name in SETTINGS:
            if part[name] != first[name]:
                raise ValueError(f"cannot merge runs with different {name}: "
                                 f"{first[name]} and {part[name]}")
    runs = [run for part in parts for run in part['runs']]
    keys = [(r['metric'], r['block'], r['depth'], r['seed']) for r in runs]
    if len(set(keys)) != len(keys):
        raise ValueError('cannot merge: some runs (metric, block, depth, '
                         'seed) appear in more than one part')
    seeds: dict[tuple, set] = {}
    for metric, kind, depth, seed in keys:
        seeds.setdefault((metric, kind, depth), set()).add(seed)
    if len({frozenset(s) for s in seeds.values()}) != 1:
        raise ValueError('cannot merge: the parts ran different seeds for '
                         'different cells of the grid')
    metrics = [m for m in METRICS if any(r['metric'] == m for r in runs)]
    blocks = [b for b in BLOCKS if any(r['block'] == b for r in runs)]
    depths = sorted({r['depth'] for r in runs})
    if len(seeds) != len(metrics) * len(blocks) * len(depths):
        raise ValueError('cannot merge: the parts do not cover a full grid of '
                         'metrics x block kinds x depths')
    return aggregate(dict(metrics=metrics, blocks=blocks, depths=depths,
                          seeds=len(next(iter(seeds.values()))),
                          **{name: first[name] for name in SETTINGS},
                          runs=runs))


def summary_table(results: dict[str, Any]) -> str:
    depths = results['depths']
    lines = [f"Distance to rank one ||X - 1 mean^T|| / ||X|| of the held-out "
             f"{results['data']} point sets "
             f"after the last of d blocks, trained for {results['epochs']} "
             f"epochs (at initialisation in brackets), and held-out accuracy; "
             f"mean over {results['seeds']} seeds (over those whose training "
             f"did not diverge, with 'k div.' where k seeds' training loss "
             f"became non-finite; 'diverged' where all did).", '',
             '| metric | block | ' + ' | '.join(f'd={d}' for d in depths) + ' |',
             '|' + '---|' * (2 + len(depths))]
    cells = {(c['metric'], c['block'], c['depth']): c for c in results['curves']}
    def trained(curve: dict[str, Any], name: str, spec: str) -> str:
        if curve[name] is None:
            return 'diverged'
        return (format(curve[name], spec)
                + (f" ({curve['diverged']} div.)" if curve['diverged'] else ''))

    for metric, kind in itertools.product(results['metrics'], results['blocks']):
        lines.append(f'| {metric} | {kind} | ' + ' | '.join(
            f"{trained(c, 'last_trained', '.2e')} ({c['last_initial']:.2e})"
            for c in (cells[metric, kind, d] for d in depths)) + ' |')
    lines += ['', '| metric | block | ' + ' | '.join(
        f'acc d={d}' for d in depths) + ' |', '|' + '---|' * (2 + len(depths))]
    for metric, kind in itertools.product(results['metrics'], results['blocks']):
        lines.append(f'| {metric} | {kind} | ' + ' | '.join(
            trained(c, 'test_acc', '.3f')
            for c in (cells[metric, kind, d] for d in depths)) + ' |')
    return '\n'.join(lines) + '\n'


def write(results: dict[str, Any], out: Path) -> None:
    from pyg_metric_attn.visualization import file_figure

    write_results(out, results, summary_table(results))
    blocks, depths = results['blocks'], results['depths']
    deepest = depths[-1]
    # A floor so that an exact rank one (0) still shows on a log axis.
    floor = 1e-12

    def shown(value: float | None) -> float:  # a gap where every seed diverged
        return math.nan if value is None else max(value, floor)

    figure = file_figure(figsize=(5 * len(blocks), 10.8))
    for index, kind in enumerate(blocks):
        top = figure.add_subplot(3, len(blocks), index + 1)
        bottom = figure.add_subplot(3, len(blocks), len(blocks) + index + 1)
        through = figure.add_subplot(3, len(blocks), 2 * len(blocks) + index + 1)
        for metric in results['metrics']:
            cells = [c for c in results['curves']
                     if (c['metric'], c['block']) == (metric, kind)]
            line, = top.semilogy(depths, [shown(c['last_trained'])
                                          for c in cells], marker='o',
                                 label=f'{metric}, trained')
            top.fill_between(depths, [shown(c['last_trained_low'])
                                      for c in cells],
                             [shown(c['last_trained_high']) for c in cells],
                             color=line.get_color(), alpha=0.2)
            top.semilogy(depths, [shown(c['last_initial']) for c in cells],
                         linestyle='--', color=line.get_color(),
                         label=f'{metric}, initialisation')
            bottom.errorbar(depths, [math.nan if c['test_acc'] is None
                                     else c['test_acc'] for c in cells],
                            yerr=[0.0 if c['test_acc_std'] is None
                                  else c['test_acc_std'] for c in cells],
                            marker='o', color=line.get_color(), label=metric,
                            capsize=3)
            runs = [r for r in results['runs'] if (r['metric'], r['block'],
                                                   r['depth']) == (metric, kind,
                                                                   deepest)]
            for key, style in (('trained', '-'), ('initial', '--')):
                finished = [r[key] for r in runs if r[key] is not None]
                if not finished:  # every seed diverged
                    continue
                mean = [statistics.fmean(r[k] for r in finished)
                        for k in range(deepest + 1)]
                through.semilogy(range(deepest + 1), [max(m, floor) for m in mean],
                                 linestyle=style, color=line.get_color(),
                                 label=f'{metric}, {key}')
        for ax in (top, bottom):
            ax.set_xscale('log', base=2)
            ax.set_xticks(depths, [f'{d}' for d in depths], minor=False)
            ax.set_xticks([], minor=True)
            ax.set_xlabel('depth d (blocks)')
            ax.grid(alpha=0.3, which='both')
        top.set_title(kind)
        top.set_ylabel('distance to rank one after block d')
        bottom.set_ylabel('held-out accuracy')
        through.set_title(f'{kind}: through the {deepest}-block stack')
        through.set_xlabel('block')
        through.set_ylabel('distance to rank one')
        through.grid(alpha=0.3, which='both')
        for ax in (top, bottom, through):
            ax.legend(fontsize=7)
    figure.suptitle(f"{results['data']} point sets: {results['seeds']} seeds, "
                    f"{results['epochs']} epochs of training")
    figure.tight_layout()
    path = out / 'rank_collapse_trained.png'
    with atomic_writer(path) as file:
        figure.savefig(file, format='png', dpi=110)


def main(args: argparse.Namespace) -> int:
    for name in ('channels', 'set_size', 'num_train', 'num_test', 'epochs',
                 'seeds'):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
    if args.first_seed < 0:
        raise ValueError('--first-seed must not be negative')
    if min(args.depths) < 1:
        raise ValueError('--depths must be at least 1')
    if not args.lr > 0:
        raise ValueError('--lr must be positive')
    out = Path(args.out or Path('runs') / NAME)
    if args.merge:
        parts = []
        for folder in args.merge:
            path = Path(folder) / 'results.json'
            if not path.is_file():
                raise FileNotFoundError(f"--merge: no results.json in '{folder}'")
            parts.append(json.loads(path.read_text()))
        results = merge(parts)
    else:
        results = measure(parse_names(args.metrics, METRICS, 'metric'),
                          parse_names(args.blocks, BLOCKS, 'block kind'),
                          sorted(set(args.depths)), args.seeds, args.channels,
                          args.set_size, args.num_train, args.num_test,
                          args.epochs, args.lr, not args.no_progress,
                          args.first_seed, args.data, args.root,
                          Placement.of(args.device, args.precision))
    write(results, out)
    print(f'\n{NAME}: results in {out}/\n')
    print(summary_table(results))
    return 0
