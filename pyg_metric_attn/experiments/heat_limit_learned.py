r"""``pyg-metric-attn experiment heat_limit_learned``: heat diffusion under a
learned metric (the paper's section 3), measured.

For each manifold (circle, sphere; :mod:`pyg_metric_attn.theory.manifolds`),
a metric map :math:`\phi` (the residual tanh MLP of ``'metric'`` attention,
:func:`~pyg_metric_attn.nn.pseudo_metric.tied_map`, acting on the manifold's
points in the ambient space) is first trained on a small task solved by
attention propagation alone: predict a smooth function of the points,
:math:`y = \sum_k \tanh(s\, x_k)` (optionally observed with Gaussian
noise), at fresh query points as :math:`\hat y_q = \sum_k
\mathrm{softmax}_k(-\|\phi(x_q) - \phi(x_k)\|^2 / t_{train})\, y_k` over
random key points (kernel regression with a learned metric: a metric that
stretches where the function bends lowers the smoothing bias, so
:math:`\phi` moves away from an isometry). With noise the map also learns to
shrink the directions along which the function is flat (a variance gain),
towards a degenerate metric where the limit needs much smaller :math:`t`;
the default is noise-free. Then :math:`\phi` is frozen (in float64) and, over a grid of
sample sizes :math:`n`, times :math:`t` and samples, the error of
:math:`(S f - f)/(t/4)` with :math:`S` built from
:math:`\|\phi(x_i) - \phi(x_j)\|^2` is measured against

* the target of the metric induced by :math:`\phi`
  (:func:`~pyg_metric_attn.theory.induced_drift_diffusion`), which the
  theory says is the limit;
* the Euclidean target (:math:`\phi` the identity), and the Euclidean target
  times the one scale factor that brings it closest to the induced one (so
  that a :math:`\phi` that only rescales does not count as a new metric),

each error an RMS over the points relative to the RMS of the induced target
(the same yardstick for the three).

Written to the output folder: ``results.json`` (every cell, the training
curves, the map's stretch), ``summary.md``, ``heat_limit_learned.png`` and
each trained map as ``phi_<manifold>.pt`` (checksummed; its ``config``
holds the :func:`~pyg_metric_attn.nn.pseudo_metric.tied_map` arguments).
"""
from __future__ import annotations

import argparse
import copy
import itertools
import statistics
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm import tqdm

from pyg_metric_attn.experiments.heat_limit import parse_names
from pyg_metric_attn.nn.functional import dense_metric_attention
from pyg_metric_attn.nn.pseudo_metric import tied_map
from pyg_metric_attn.theory import (
    MANIFOLDS,
    ManifoldSample,
    induced_drift_diffusion,
    propagation_generator,
    pullback_metric,
    relative_rms,
)
from pyg_metric_attn.theory.manifolds import DENSITIES
from pyg_metric_attn.training import seed_everything
from pyg_metric_attn.training.device import Placement, add_placement_arguments
from pyg_metric_attn.utils.io import (
    atomic_writer,
    save_verified,
    write_results,
)

NAME = 'heat_limit_learned'
SIZES = (500, 1000, 2000, 4000, 8000)
TIMES = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)
TARGETS = ('learned', 'euclidean_scaled', 'euclidean')
# Training draws use sampler seeds from here on, apart from the measurement's.
TRAIN_SEED_OFFSET = 1_000_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('--manifolds', default='circle,sphere',
                        help=f"comma-separated, of {', '.join(MANIFOLDS)}")
    parser.add_argument('--density', default='uniform', choices=DENSITIES)
    parser.add_argument('--sizes', type=int, nargs='+', default=list(SIZES),
                        help='sample sizes n')
    parser.add_argument('--times', type=float, nargs='+', default=list(TIMES),
                        help='heat-kernel times t')
    parser.add_argument('--seeds', type=int, default=3,
                        help='samples per cell')
    training = parser.add_argument_group('training of phi')
    training.add_argument('--hidden', type=int, default=16,
                          help='hidden width of phi')
    training.add_argument('--steps', type=int, default=400)
    training.add_argument('--lr', type=float, default=3e-3)
    training.add_argument('--train-time', type=float, default=0.05,
                          help='heat-kernel time t of the regression')
    training.add_argument('--keys', type=int, default=400,
                          help='points attended to per step')
    training.add_argument('--queries', type=int, default=200,
                          help='points predicted per step')
    training.add_argument('--noise', type=float, default=0.0,
                          help='standard deviation of the observation noise')
    training.add_argument('--sharpness', type=float, default=2.0,
                          help='s of the regressed sum_k tanh(s x_k)')
    training.add_argument('--train-seed', type=int, default=0)
    add_placement_arguments(training)  # the measurement: float64, CPU
    parser.add_argument('--out', help=f'output folder (default: runs/{NAME})')
    parser.add_argument('--no-progress', action='store_true')


def regression_target(points: Tensor, sharpness: float) -> Tensor:
    r""":math:`\sum_k \tanh(s\, x_k)` over the ambient coordinates, ``[n]``."""
    return torch.tanh(sharpness * points).sum(1)


def train_feature_map(manifold: str, density: str, args: argparse.Namespace,
                      progress: bool = True,
                      placement: Placement | None = None
                      ) -> tuple[torch.nn.Module, dict[str, Any]]:
    """The trained map (on the device of ``placement``) and its training
    record (losses, and the test loss of the learned map against the
    identity)."""
    placement = placement or Placement()
    sampler = MANIFOLDS[manifold]
    ambient = sampler(2).points.size(1)
    seed_everything(args.train_seed)
    phi = placement.move(tied_map('metric', ambient, ambient, args.hidden))
    optimizer = torch.optim.Adam(phi.parameters(), lr=args.lr)
    noise = torch.Generator().manual_seed(args.train_seed)

    def draw(step: int) -> tuple[Tensor, Tensor, Tensor]:
        points = sampler(args.keys + args.queries, density,
                         seed=TRAIN_SEED_OFFSET + args.train_seed * args.steps
                         + step).points.float()
        clean = regression_target(points, args.sharpness)
        noisy = clean + args.noise * torch.randn(clean.shape, generator=noise)
        return placement.move((points, clean, noisy))

    def predict(feature_map, points: Tensor, noisy: Tensor) -> Tensor:
        keys, queries = points[:args.keys], points[args.keys:]
        with placement.autocast():
            out, _ = dense_metric_attention(
                feature_map(queries), feature_map(keys),
                noisy[:args.keys].unsqueeze(1), 'metric', args.train_time)
        return out.squeeze(1).float()  # [queries]

    losses = []
    for step in tqdm(range(args.steps), desc=f'{NAME} phi on {manifold}',
                     disable=not progress, leave=False):
        points, _, noisy = draw(step)
        loss = (predict(phi, points, noisy) - noisy[args.keys:]).square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    with torch.no_grad():  # against the clean function, on fresh draws
        tests = [draw(args.steps + k) for k in range(20)]
        test_loss = {
            name: statistics.fmean(
                float((predict(feature_map, p, y) - c[args.keys:]).square().mean())
                for p, c, y in tests)
            for name, feature_map in (('learned', phi), ('identity', lambda x: x))}
    every = max(1, args.steps // 50)
    return phi, dict(loss=losses[::every], loss_every=every, test_mse=test_loss,
                     config=dict(metric='metric', in_channels=ambient,
                                 out_channels=ambient, mlp_channels=args.hidden))


def stretch(sample: ManifoldSample, feature_map) -> Tensor:
    r"""Local stretch factors of :math:`\phi` on the manifold: the square
    roots of the eigenvalues of :math:`g_0^{-1} g`, ``[n, d]`` (all 1 for an
    isometry)."""
    g = pullback_metric(sample.chart, sample.coords, feature_map)
    lower = torch.linalg.cholesky(pullback_metric(sample.chart, sample.coords))
    half = torch.linalg.solve_triangular(lower, g, upper=False)
    whitened = torch.linalg.solve_triangular(lower, half.mT, upper=False)
    return torch.linalg.eigvalsh(whitened).clamp(min=0).sqrt()


def measure_manifold(manifold: str, density: str, phi: torch.nn.Module,
                     sizes: list[int], times: list[float], seeds: int,
                     progress: bool = True) -> dict[str, Any]:
    feature_map = copy.deepcopy(phi).cpu().double().requires_grad_(False)
    cells, stretches, gaps = [], [], []
    grid = list(itertools.product(sizes, range(seeds)))
    for n, seed in tqdm(grid, desc=f'{NAME} {manifold}', disable=not progress,
                        leave=False):
        sample = MANIFOLDS[manifold](n, density, seed=seed)
        with torch.no_grad():
            mapped = feature_map(sample.points)
        learned = induced_drift_diffusion(sample.chart, sample.coords,
                                          feature_map)
        euclidean = sample.drift_diffusion
        # The one scale that brings the Euclidean target closest to the
        # induced one (least squares).
        scale = float((learned * euclidean).sum() / euclidean.square().sum())
        targets = dict(learned=learned, euclidean_scaled=scale * euclidean,
                       euclidean=euclidean)
        if n == sizes[-1]:
            stretches.append(stretch(sample, feature_map).flatten())
            gaps.append(dict(scale=scale, **{
                name: relative_rms(targets[name], learned)
                for name in TARGETS[1:]}))
        for t in times:
            estimate = propagation_generator(mapped, sample.function, t)
            cells.append(dict(n=n, t=t, seed=seed, **{
                f'error_{name}': relative_rms(estimate, target, learned)
                for name, target in targets.items()}))
    mean = {(name, n, t): statistics.fmean(
        c[f'error_{name}'] for c in cells if (c['n'], c['t']) == (n, t))
        for name in TARGETS for n in sizes for t in times}
    factors = torch.cat(stretches)
    quantiles = torch.tensor([0.0, 0.05, 0.5, 0.95, 1.0], dtype=factors.dtype)
    return dict(
        manifold=manifold, density=density, cells=cells,
        error={name: {f'{n}': {f'{t}': mean[name, n, t] for t in times}
                      for n in sizes} for name in TARGETS},
        best={name: {f'{n}': min(mean[name, n, t] for t in times)
                     for n in sizes} for name in TARGETS},
        best_time={name: {f'{n}': min(times, key=lambda t, n=n, k=name:
                                      mean[k, n, t]) for n in sizes}
                   for name in TARGETS},
        stretch_quantiles=dict(zip(['min', 'q05', 'median', 'q95', 'max'],
                                   torch.quantile(factors, quantiles).tolist(),
                                   strict=True)),
        target_gap={key: statistics.fmean(g[key] for g in gaps)
                    for key in gaps[0]})


def summary_table(results: dict[str, Any]) -> str:
    sizes, times = results['sizes'], results['times']
    lines = ['RMS error of (S f - f)/(t/4), S from |phi(x_i) - phi(x_j)|^2 with '
             'the trained phi, against the learned-metric target / the '
             'Euclidean target times its best scale / the Euclidean target, '
             'each relative to the RMS of the learned-metric target; mean of '
             f"{results['seeds']} samples.", '']
    lines += ['| manifold | n | ' + ' | '.join(f't={t:g}' for t in times) + ' |',
              '|' + '---|' * (2 + len(times))]
    for curve in results['curves']:
        for n in sizes:
            lines.append(f"| {curve['manifold']} | {n} | " + ' | '.join(
                ' / '.join(f"{curve['error'][name][f'{n}'][f'{t}']:.3f}"
                           for name in TARGETS) for t in times) + ' |')
    lines += ['', 'Smallest error over t (at that t), per target:', '',
              '| manifold | n | learned | Euclidean, best scale | Euclidean |',
              '|---|---|---|---|---|']
    for curve in results['curves']:
        for n in sizes:
            lines.append(f"| {curve['manifold']} | {n} | " + ' | '.join(
                f"{curve['best'][name][f'{n}']:.3f} "
                f"(t={curve['best_time'][name][f'{n}']:g})"
                for name in TARGETS) + ' |')
    lines += ['', '| manifold | stretch of phi: min / 5% / median / 95% / max | '
              'targets: learned vs Euclidean, best scale (scale) | '
              'learned vs Euclidean | regression test MSE: learned phi / '
              'identity |', '|---|---|---|---|---|']
    for curve in results['curves']:
        q, gap = curve['stretch_quantiles'], curve['target_gap']
        mse = curve['training']['test_mse']
        lines.append(
            f"| {curve['manifold']} | " + ' / '.join(
                f'{q[k]:.2f}' for k in ('min', 'q05', 'median', 'q95', 'max'))
            + f" | {gap['euclidean_scaled']:.3f} ({gap['scale']:.2f}) | "
            f"{gap['euclidean']:.3f} | {mse['learned']:.4f} / "
            f"{mse['identity']:.4f} |")
    return '\n'.join(lines) + '\n'


def write(results: dict[str, Any], out: Path) -> None:
    from pyg_metric_attn.visualization import file_figure

    write_results(out, results, summary_table(results))
    sizes, times, curves = results['sizes'], results['times'], results['curves']
    figure = file_figure(figsize=(10, 3.8 * len(curves)))
    styles = dict(learned='-', euclidean_scaled='--', euclidean=':')
    labels = dict(learned='learned metric', euclidean_scaled='Euclidean, best scale',
                  euclidean='Euclidean')
    for row, curve in enumerate(curves):
        left = figure.add_subplot(len(curves), 2, 2 * row + 1)
        for n in sizes:
            line, = left.loglog(times, [curve['error']['learned'][f'{n}'][f'{t}']
                                        for t in times], marker='o',
                                label=f'n={n}')
            left.loglog(times, [curve['error']['euclidean_scaled'][f'{n}'][f'{t}']
                                for t in times], linestyle='--',
                        color=line.get_color())
        left.set_title(f"{curve['manifold']}: against the learned-metric target "
                       '(solid), Euclidean best scale (dashed)', fontsize=8)
        left.set_xlabel('t')
        left.set_ylabel('relative error')
        left.legend(fontsize=7)
        right = figure.add_subplot(len(curves), 2, 2 * row + 2)
        for name in TARGETS:
            right.loglog(sizes, [curve['best'][name][f'{n}'] for n in sizes],
                         linestyle=styles[name], marker='o', label=labels[name])
        right.set_title(f"{curve['manifold']}: smallest error over t", fontsize=8)
        right.set_xticks(sizes, [f'{n}' for n in sizes], minor=False)
        right.set_xticks([], minor=True)
        right.set_xlabel('n')
        right.set_ylabel('relative error')
        right.legend(fontsize=7)
        for ax in (left, right):
            ax.grid(alpha=0.3, which='both')
    figure.tight_layout()
    with atomic_writer(out / 'heat_limit_learned.png') as file:
        figure.savefig(file, format='png', dpi=110)


def main(args: argparse.Namespace) -> int:
    manifolds = parse_names(args.manifolds, MANIFOLDS, 'manifold')
    if min(args.sizes) < 2 or min(args.times) <= 0 or args.seeds < 1:
        raise ValueError('sizes must be at least 2, times positive and seeds '
                         'at least 1')
    for name in ('hidden', 'steps', 'keys', 'queries'):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be at least 1")
    if not (args.lr > 0 and args.train_time > 0 and args.noise >= 0):
        raise ValueError('--lr and --train-time must be positive, --noise '
                         'non-negative')
    out = Path(args.out or Path('runs') / NAME)
    out.mkdir(parents=True, exist_ok=True)
    sizes, times = sorted(set(args.sizes)), sorted(set(args.times))
    placement = Placement.of(args.device, args.precision)
    curves = []
    for manifold in manifolds:
        phi, training = train_feature_map(manifold, args.density, args,
                                          not args.no_progress, placement)
        save_verified({'config': training['config'],
                       'state_dict': phi.state_dict()}, out / f'phi_{manifold}.pt')
        curve = measure_manifold(manifold, args.density, phi, sizes, times,
                                 args.seeds, not args.no_progress)
        curves.append(dict(curve, training=training))
    results = dict(sizes=sizes, times=times, seeds=args.seeds,
                   arguments={k: v for k, v in vars(args).items()
                              if k not in ('func',) and not callable(v)},
                   curves=curves)
    write(results, out)
    print(f'\n{NAME}: results in {out}/\n')
    print(summary_table(results))
    return 0
