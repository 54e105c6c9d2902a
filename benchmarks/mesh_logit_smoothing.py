"""Does smoothing a trained human_seg model's vertex logits over the surface
make it lose less to remeshing? Each mesh's vertex logits ``z`` are
diffused by one implicit heat step before its faces average them,

    z_tau = (M + tau L)^-1 M z

(``L`` the mesh's Laplacian, ``M`` its vertex areas, as the model's
operators: :func:`~pyg_metric_attn.geometry.laplacian.laplacian`). ``tau``
is a time in the units of the processed meshes, so the smoothing reaches
as far on a mesh and on its finer or coarser copies: a ripple of the logits
at a copy's own resolution is damped, the segments are not. For every
``tau`` the run is scored on the original meshes of ``--split`` and on
their perturbed copies (seed 0, read from or written to the run's
processed folder): for ``test`` and ``val`` those of ``experiment
human_seg_robust`` (``tau = 0`` reads exactly what that experiment reads);
for ``train`` the run's training meshes and the copies its ``-o
augment_copies`` drew first, the ones it trained on (does the model fit a
perturbation's labels where it has seen them?).

    python -m benchmarks.mesh_logit_smoothing RUN [RUN ...] [--split val|test|train] \\
        [--perturbations subdivision,decimation,jitter] \\
        [--taus 0,1e-5,3e-5,1e-4,3e-4,1e-3] [--out FOLDER] [--threads 1]

Writes ``smoothing.md``, ``smoothing.json`` and ``smoothing.png`` to
``--out``.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spl
import torch
from tqdm.auto import tqdm

from benchmarks.mesh_feature_drift import parse_arguments
from pyg_metric_attn.datasets import PerturbedMeshes
from pyg_metric_attn.experiments.human_seg_robust import split_meshes
from pyg_metric_attn.experiments.run_folder import load_run
from pyg_metric_attn.geometry import PERTURBATIONS
from pyg_metric_attn.geometry.laplacian import laplacian
from pyg_metric_attn.training.segmentation import face_logits

TAUS = (0.0, 1e-5, 3e-5, 1e-4, 3e-4, 1e-3)


def heat_steps(vertex_logits: torch.Tensor, pos: torch.Tensor,
               face: torch.Tensor, taus: list[float]) -> list[torch.Tensor]:
    """``vertex_logits`` ``[V, C]`` after one implicit heat step of each
    time in ``taus`` on the mesh ``(pos, face [3, F])``; ``tau = 0`` gives
    them back unchanged. A step keeps constants and the area-weighted mean
    (``L``'s rows and columns sum to zero)."""
    if any(not tau >= 0 for tau in taus):
        raise ValueError(f"A heat step's time must be >= 0, got {list(taus)}")
    logits = vertex_logits.double().numpy()
    L, mass, _ = laplacian(pos.double().numpy(), face.t().numpy())
    M = sp.diags(mass)
    weighted = M @ logits
    smoothed = []
    for tau in taus:
        values = (logits if tau == 0 else
                  spl.splu((M + tau * L).tocsc()).solve(weighted))
        smoothed.append(torch.from_numpy(np.ascontiguousarray(values)).to(
            vertex_logits.dtype))
    return smoothed


def accuracies(task, model, meshes, taus: list[float],
               progress: bool = True, desc: str = '') -> list[float]:
    """Face accuracy (%) on ``meshes`` of the model's smoothed vertex
    logits, one per ``tau``."""
    hits, faces = np.zeros(len(taus)), 0
    for mesh in tqdm(meshes, desc=desc, disable=not progress):
        for index, logits in enumerate(heat_steps(
                task.vertex_scores(model, mesh), mesh.pos, mesh.face, taus)):
            hits[index] += int((face_logits(logits, mesh.face).argmax(-1)
                                == mesh.y).sum())
        faces += mesh.y.numel()
    return (100 * hits / faces).tolist()


def smoothing_drops(run: str, split: str, perturbations: list[str],
                    taus: list[float], progress: bool = True
                    ) -> dict[str, list[float]]:
    """``{'original': accuracy per tau, perturbation: drop (points) per
    tau}`` of one run."""
    task, model, description = load_run(run, 'human_seg', {},
                                        command='mesh_logit_smoothing')
    print(description)
    if split == 'train':
        meshes = task.datasets()[0]
        variants = Path(meshes.processed_root) / 'augmentation'
    else:
        meshes = split_meshes(task, split)
        variants = Path(meshes.processed_root) / 'robustness'
    original = accuracies(task, model, meshes, taus, progress, 'original')
    results = {'original': original}
    for name in perturbations:
        copies = PerturbedMeshes(variants, meshes, name, 0,
                                 pre_transform=task.preprocessing,
                                 num_workers=task.config.num_workers,
                                 log=progress)
        results[name] = [base - acc for base, acc in zip(
            original, accuracies(task, model, copies, taus, progress, name),
            strict=True)]
    return results


def markdown(results: dict[str, dict[str, list[float]]], taus: list[float],
             split: str) -> str:
    """The table of :func:`smoothing_drops` of each run: one row per run
    and ``tau``."""
    kinds = list(dict.fromkeys(kind for result in results.values()
                               for kind in result if kind != 'original'))
    lines = [f'Vertex logits smoothed by one implicit heat step '
             f'(M + tau L)^-1 M z before the face readout, {split} meshes: '
             'accuracy (%) on the original meshes and drop (points) of each '
             'perturbation (seed 0).', '',
             '| run | tau | original % | ' + ' | '.join(kinds) + ' |',
             '|---|---|---|' + '---|' * len(kinds)]
    for run, result in results.items():
        for index, tau in enumerate(taus):
            lines.append(f"| {Path(run).name} | {tau:g} | "
                         f"{result['original'][index]:.2f} | " + ' | '.join(
                             f'{result[kind][index]:.2f}' if kind in result
                             else '-' for kind in kinds) + ' |')
    return '\n'.join(lines) + '\n'


def plot(results: dict[str, dict[str, list[float]]], taus: list[float],
         path: Path) -> None:
    """Accuracy and drops against ``tau`` (``tau = 0`` at the left edge),
    one line style per run."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    x = range(len(taus))
    fig, (acc_axes, drop_axes) = plt.subplots(1, 2, figsize=(11, 4))
    colors, styles = plt.get_cmap('tab10').colors, ('-', '--', ':', '-.')
    for index, (run, result) in enumerate(results.items()):
        name, style = Path(run).name, styles[index % len(styles)]
        acc_axes.plot(x, result['original'], style, marker='o', label=name)
        kinds = [kind for kind in result if kind != 'original']
        for color, kind in enumerate(kinds):
            drop_axes.plot(x, result[kind], style, marker='o',
                           color=colors[color % len(colors)],
                           label=f'{name}: {kind}')
    acc_axes.set(ylabel='original meshes, face accuracy (%)')
    drop_axes.set(ylabel='drop (points)')
    for axes in (acc_axes, drop_axes):
        axes.set_xticks(list(x), [f'{tau:g}' for tau in taus])
        axes.set_xlabel('heat step time tau')
        axes.legend(fontsize=7)
    fig.suptitle('human_seg: vertex logits smoothed before the readout')
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    args, perturbations = parse_arguments(
        __doc__, 'subdivision,decimation,jitter', 'runs/mesh_logit_smoothing',
        PERTURBATIONS,
        **{'--split': dict(choices=('test', 'val', 'train'), default='val'),
           '--taus': dict(default=','.join(f'{tau:g}' for tau in TAUS),
                          help='heat step times, comma-separated')})
    taus = [float(tau) for tau in args.taus.split(',')]
    results = {run: smoothing_drops(run, args.split, perturbations, taus)
               for run in args.runs}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown(results, taus, args.split)
    (out / 'smoothing.md').write_text(table)
    (out / 'smoothing.json').write_text(json.dumps(
        dict(split=args.split, taus=taus, runs=results), indent=1))
    plot(results, taus, out / 'smoothing.png')
    print(table)


if __name__ == '__main__':
    main()
