"""Where a trained MetricMeshFormer's gradient features move when the test
meshes are made differently: per diffusion channel of every block, against
the channel's learned diffusion time, the change of the diffused channel
and of the magnitude of its tangent gradient (what the block's spatial
gradient features are built from), at the original vertices, relative to
the original's (``||h' - h|| / ||h||`` per channel and mesh, averaged over
the meshes). And, as a check of the operator itself, the same change of the
gradient magnitude of the vertex positions, a smooth function whose
gradient a consistent operator gives alike on both meshes.

    python -m benchmarks.mesh_gradient_drift RUN [RUN ...] [--split val] \\
        [--perturbations subdivision] [--out FOLDER]

``RUN``: folders written by ``pyg-metric-attn train human_seg`` with
``--attention metricformer`` and gradient features; the perturbed meshes
are those of ``experiment human_seg_robust`` (seed 0), read from or written
to the run's processed folder. Writes ``gradient_drift.md``,
``gradient_drift.json`` and ``gradient_drift.png`` to ``--out``.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from benchmarks.mesh_feature_drift import load, parse_arguments, stage_features
from pyg_metric_attn.nn.models import MetricMeshFormer
from pyg_metric_attn.nn.spatial_gradient import vertex_gradients

#: Channels are grouped into this many groups by diffusion time.
TIME_GROUPS = 4


def relative_change(moved: torch.Tensor, original: torch.Tensor) -> np.ndarray:
    """``||moved - original|| / ||original||`` per column ``[C]``."""
    moved, original = moved.double(), original.double()
    return ((moved - original).norm(dim=0)
            / original.norm(dim=0).clamp_min(1e-30)).numpy()


def gradient_magnitude(values: torch.Tensor, mesh) -> torch.Tensor:
    """``|grad values|`` ``[N, C]`` in each vertex's tangent plane (its
    frame's rotation does not change it)."""
    return vertex_gradients(values.float(), mesh.grad_index,
                            mesh.grad_weight).norm(dim=1)


def gradient_drift(run: str, split: str, perturbation: str) -> dict:
    """``{'blocks': [{'time', 'diffused', 'gradient'} per block: one value
    per channel], 'positions': mean relative change of |grad pos|}`` of
    one run under one perturbation that keeps the original vertices."""
    task, model, description, meshes, copies = load(run, [perturbation], split)
    if not isinstance(model, MetricMeshFormer) or any(
            block.gradient_features is None for block in model.blocks):
        raise ValueError(f"'{run}' is not a MetricMeshFormer with gradient "
                         f"features")
    copies = copies[perturbation]
    diffused: list[list[np.ndarray]] = [[] for _ in model.blocks]
    gradient: list[list[np.ndarray]] = [[] for _ in model.blocks]
    positions = []
    for mesh, copy in tqdm(list(zip(meshes, copies, strict=True)),
                           desc=f'{Path(run).name} {perturbation}'):
        count = mesh.pos.size(0)
        before, after = stage_features(task, model, mesh), stage_features(
            task, model, copy)
        for b in range(len(model.blocks)):
            h, moved = before[f'{b}.diffused'], after[f'{b}.diffused']
            diffused[b].append(relative_change(moved[:count], h))
            gradient[b].append(relative_change(
                gradient_magnitude(moved, copy)[:count],
                gradient_magnitude(h, mesh)))
        positions.append(float(relative_change(
            gradient_magnitude(copy.pos, copy)[:count].reshape(-1, 1),
            gradient_magnitude(mesh.pos, mesh).reshape(-1, 1))[0]))
    print(description)
    return {'blocks': [
        {'time': block.diffusion.times.detach().tolist(),
         'diffused': np.mean(diffused[b], axis=0).tolist(),
         'gradient': np.mean(gradient[b], axis=0).tolist()}
        for b, block in enumerate(model.blocks)],
        'positions': float(np.mean(positions))}


def by_time(block: dict) -> list[dict]:
    """The block's channels in :data:`TIME_GROUPS` groups of rising
    diffusion time: each group's time range and mean changes."""
    time = np.asarray(block['time'])
    groups = np.array_split(np.argsort(time), TIME_GROUPS)
    return [dict(shortest=float(time[g].min()), longest=float(time[g].max()),
                 diffused=float(np.mean(np.asarray(block['diffused'])[g])),
                 gradient=float(np.mean(np.asarray(block['gradient'])[g])))
            for g in groups]


def time_correlation(block: dict) -> float:
    """Pearson correlation of the log diffusion time with the change of
    the gradient magnitude, over the block's channels."""
    return float(np.corrcoef(np.log(block['time']), block['gradient'])[0, 1])


def markdown(results: dict[str, dict], split: str, perturbation: str) -> str:
    lines = [f'{perturbation}, {split} meshes: relative change at the original '
             'vertices, per diffusion channel, in groups of rising diffusion '
             'time (mean over the channels of a group).', '',
             '| run | block | diffusion time | diffused | gradient magnitude |',
             '|---|---|---|---|---|']
    for run, result in results.items():
        for b, block in enumerate(result['blocks']):
            for group in by_time(block):
                lines.append(f"| {Path(run).name} | {b} | {group['shortest']:.4f}"
                             f"-{group['longest']:.4f} | {group['diffused']:.3f} "
                             f"| {group['gradient']:.3f} |")
    lines += ['', '| run | block | correlation of log time and gradient change |',
              '|---|---|---|']
    for run, result in results.items():
        lines += [f'| {Path(run).name} | {b} | {time_correlation(block):+.2f} |'
                  for b, block in enumerate(result['blocks'])]
    lines += ['', '| run | gradient magnitude of the positions |', '|---|---|']
    lines += [f"| {Path(run).name} | {result['positions']:.3f} |"
              for run, result in results.items()]
    return '\n'.join(lines)


def plot(results: dict[str, dict], perturbation: str, path: Path) -> None:
    """Per run, each channel's gradient change against its diffusion time,
    coloured by block."""
    import matplotlib
    matplotlib.use('Agg')
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(results), squeeze=False, sharey=True,
                             figsize=(5 * len(results), 4))
    for ax, (run, result) in zip(axes[0], results.items(), strict=True):
        for b, block in enumerate(result['blocks']):
            ax.scatter(block['time'], block['gradient'], s=10, label=f'block {b}')
        ax.axhline(result['positions'], color='gray', linestyle='--',
                   label='positions')
        ax.set_xscale('log')
        ax.set_xlabel('diffusion time')
        ax.set_title(Path(run).name, fontsize=8)
    axes[0][0].set_ylabel(f'relative change of |gradient| ({perturbation})')
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    args, perturbations = parse_arguments(
        __doc__, 'subdivision', 'runs/mesh_gradient_drift',
        **{'--split': dict(default='test', choices=('test', 'val'))})
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {perturbation: {run: gradient_drift(run, args.split, perturbation)
                              for run in args.runs}
               for perturbation in perturbations}
    text = '\n\n'.join(markdown(by_run, args.split, perturbation)
                       for perturbation, by_run in results.items())
    (out / 'gradient_drift.md').write_text(text + '\n')
    (out / 'gradient_drift.json').write_text(json.dumps(results, indent=1))
    plot(results[perturbations[0]], perturbations[0], out / 'gradient_drift.png')
    print(text)


if __name__ == '__main__':
    main()
