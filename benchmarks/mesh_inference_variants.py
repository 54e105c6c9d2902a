"""Two changes at inference only: do they make a trained human_seg model
lose less to remeshing? Each is read on the original meshes of ``--split``
and on their perturbed copies (seed 0, those of ``experiment
human_seg_robust``, read from or written to the run's processed folder),
beside the plain prediction:

* **averaged over deformed copies** (``--copies K``, test-time
  augmentation): a mesh's face prediction is the mean of the face
  probabilities on the mesh itself and on ``K`` copies of it deformed by
  the kinds of ``--kinds`` in turn (default: anisotropic scaling and
  jitter, deformations the recipe trains on), the copies drawn as
  :class:`~pyg_metric_attn.datasets.PerturbedMeshes` draws them, with seeds
  ``1000 + k`` (cached beside the robustness copies);
* **at the training resolution** (coarsened): a mesh with more than
  :data:`COARSEN_ABOVE` times the median face count of the run's training
  meshes is decimated to that count
  (:func:`~pyg_metric_attn.geometry.perturbations.decimate`), processed as
  the training meshes were and predicted there, and each of its faces takes
  the prediction of the decimated mesh's face with the nearest centroid.
  Of the robustness copies only Loop subdivision's have that many faces.

    python -m benchmarks.mesh_inference_variants RUN [RUN ...] [--split val|test] \\
        [--perturbations subdivision,decimation,anisotropic_scaling,jitter] \\
        [--copies 4] [--kinds anisotropic_scaling,jitter] [--out FOLDER] [--threads 1]

Writes ``variants.md``, ``variants.json`` and ``variants.png`` to
``--out``.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from benchmarks.mesh_feature_drift import parse_arguments
from pyg_metric_attn.datasets import PerturbedMeshes
from pyg_metric_attn.experiments.human_seg_robust import split_meshes
from pyg_metric_attn.experiments.run_folder import load_run
from pyg_metric_attn.geometry import PERTURBATIONS
from pyg_metric_attn.geometry.perturbations import decimate, nearest_faces

#: A mesh is predicted at the training resolution when it has more than
#: this many times the training meshes' median face count.
COARSEN_ABOVE = 1.5
#: Seed of the first deformed copy of the averaging (far from the seeds of
#: the robustness copies, 0 upwards).
FIRST_COPY_SEED = 1000
VARIANTS = ('plain', 'averaged', 'coarsened')


def averaged_probabilities(task, model, meshes, kinds: list[str],
                           copies: int, cache: Path,
                           own: list[torch.Tensor] | None = None
                           ) -> list[torch.Tensor]:
    """Per mesh of ``meshes``, the face probabilities ``[F, C]`` averaged
    over the mesh and ``copies`` copies of it deformed by ``kinds`` in turn
    (copy ``k``: ``kinds[k % len(kinds)]``, seed ``FIRST_COPY_SEED + k``);
    ``copies = 0`` gives the plain probabilities. The deformations must
    keep the faces (the copies' faces are the mesh's). ``own``: the meshes'
    own face probabilities, where the caller has them already."""
    if copies and not kinds:
        raise ValueError('Averaging over deformed copies needs a kind')

    def probabilities(mesh_set):
        return [task.face_scores(model, mesh).softmax(-1) for mesh in mesh_set]

    total = probabilities(meshes) if own is None else own
    for k in range(copies):
        kind = kinds[k % len(kinds)]
        deformed = PerturbedMeshes(cache, meshes, kind, FIRST_COPY_SEED + k,
                                   pre_transform=task.preprocessing,
                                   num_workers=task.config.num_workers,
                                   log=False)
        for mesh, copy in zip(meshes, deformed, strict=True):
            if not torch.equal(copy.face, mesh.face):
                raise ValueError(f"'{kind}' changes the faces of {mesh.name}: "
                                 "only deformations that keep them can be "
                                 "averaged")
        total = [sum_ + probs for sum_, probs in zip(
            total, probabilities(deformed), strict=True)]
    return [probs / (1 + copies) for probs in total]


def at_training_resolution(task, model, mesh, faces: int,
                           plain: torch.Tensor | None = None) -> torch.Tensor:
    """Predicted face labels ``[F]`` of one processed ``mesh``: the plain
    prediction (``plain``, where the caller has it already) unless it has
    more than :data:`COARSEN_ABOVE` x ``faces`` faces; then it is decimated
    to about ``faces`` faces, processed as the training meshes were and
    predicted there, and each of its faces takes the prediction of the
    decimated face with the nearest centroid."""
    count = mesh.face.size(1)
    if count <= COARSEN_ABOVE * faces:
        return task.predict(model, mesh) if plain is None else plain
    pos, face = mesh.pos.double().numpy(), mesh.face.t().numpy()
    coarse_pos, coarse_face = decimate(pos, face, faces / count)
    coarse = task.prepare_mesh(coarse_pos, coarse_face, mesh.name)
    if not np.array_equal(coarse.face.t().numpy(), coarse_face):
        raise RuntimeError(f"{mesh.name}: processing renumbered the decimated "
                           "mesh's faces; its predictions cannot be carried "
                           "back")
    nearest = nearest_faces(coarse_pos, coarse_face, pos, face)
    return task.predict(model, coarse)[torch.from_numpy(nearest)]


def accuracies(task, model, meshes, kinds: list[str], copies: int,
               faces: int, cache: Path) -> dict[str, float]:
    """Face accuracy (%) on ``meshes`` of each of :data:`VARIANTS` (the
    model run once per mesh for the plain prediction, which the other two
    variants reuse)."""
    labels = [mesh.y for mesh in meshes]
    scores = [task.face_scores(model, mesh) for mesh in meshes]
    plain = [face_scores.argmax(-1) for face_scores in scores]
    averaged = [probs.argmax(-1) for probs in averaged_probabilities(
        task, model, meshes, kinds, copies, cache,
        own=[face_scores.softmax(-1) for face_scores in scores])]
    coarsened = [at_training_resolution(task, model, mesh, faces, plain=p)
                 for mesh, p in zip(meshes, plain, strict=True)]
    total = sum(y.numel() for y in labels)
    return {name: 100 * sum(int((p == y).sum()) for p, y in zip(
        predictions, labels, strict=True)) / total
        for name, predictions in zip(VARIANTS, (plain, averaged, coarsened),
                                     strict=True)}


def variant_drops(run: str, split: str, perturbations: list[str],
                  copies: int, kinds: list[str], progress: bool = True
                  ) -> dict[str, dict[str, float]]:
    """``{'original': accuracy per variant, perturbation: drop (points)
    per variant}`` of one run, and ``'training_faces'``: the median face
    count of its training meshes."""
    task, model, description = load_run(run, 'human_seg', {},
                                        command='mesh_inference_variants')
    print(description)
    model.eval()
    faces = int(np.median([mesh.face.size(1) for mesh in task.datasets()[0]]))
    meshes = split_meshes(task, split)
    variants = Path(meshes.processed_root) / 'robustness'
    sets = {'original': meshes}
    for name in perturbations:
        sets[name] = PerturbedMeshes(variants, meshes, name, 0,
                                     pre_transform=task.preprocessing,
                                     num_workers=task.config.num_workers,
                                     log=progress)
    results: dict = {'training_faces': faces}
    for name, mesh_set in tqdm(sets.items(), desc=Path(run).name,
                               disable=not progress):
        read = accuracies(task, model, mesh_set, kinds, copies, faces,
                          variants / 'averaging')
        results[name] = read if name == 'original' else {
            variant: results['original'][variant] - read[variant]
            for variant in VARIANTS}
    return results


def markdown(results: dict[str, dict], split: str, copies: int,
             kinds: list[str]) -> str:
    """One row per run and variant: accuracy on the original meshes and
    the drop of each perturbation."""
    sets = list(dict.fromkeys(name for result in results.values()
                              for name in result
                              if name not in ('original', 'training_faces')))
    lines = [f'Inference variants, {split} meshes: accuracy (%) on the '
             'original meshes and drop (points) of each perturbation (seed 0). '
             f'averaged: face probabilities averaged over the mesh and {copies} '
             f"copies deformed by {', '.join(kinds)}; coarsened: meshes with "
             f'more than {COARSEN_ABOVE:g}x the training median face count '
             'predicted at that count and carried back by nearest centroid.',
             '', '| run | variant | original % | ' + ' | '.join(sets) + ' |',
             '|---|---|---|' + '---|' * len(sets)]
    for run, result in results.items():
        for variant in VARIANTS:
            lines.append(f"| {Path(run).name} | {variant} | "
                         f"{result['original'][variant]:.2f} | " + ' | '.join(
                             f'{result[name][variant]:.2f}' if name in result
                             else '-' for name in sets) + ' |')
    return '\n'.join(lines) + '\n'


def plot(results: dict[str, dict], path: Path) -> None:
    """The drops of each perturbation, a panel per run, a bar per
    variant."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    fig, panels = plt.subplots(1, len(results), sharey=True, squeeze=False,
                               figsize=(4.5 * len(results), 4))
    width = 0.8 / len(VARIANTS)
    for axes, (run, result) in zip(panels[0], results.items(), strict=True):
        sets = [name for name in result
                if name not in ('original', 'training_faces')]
        for offset, variant in enumerate(VARIANTS):
            axes.bar([index + (offset - 1) * width
                      for index in range(len(sets))],
                     [result[name][variant] for name in sets], width,
                     label=variant)
        axes.set_xticks(range(len(sets)),
                        [name.replace('_', '\n') for name in sets], fontsize=8)
        axes.axhline(0.5, color='grey', linestyle=':', label='target 0.5')
        axes.set_title(Path(run).name, fontsize=8)
    panels[0][0].set_ylabel('drop (points)')
    panels[0][0].legend(fontsize=8)
    fig.suptitle('human_seg: drops under perturbation, by inference variant')
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    args, perturbations = parse_arguments(
        __doc__, 'subdivision,decimation,anisotropic_scaling,jitter',
        'runs/mesh_inference_variants', PERTURBATIONS,
        **{'--split': dict(choices=('test', 'val'), default='val'),
           '--copies': dict(type=int, default=4,
                            help='deformed copies averaged with each mesh'),
           '--kinds': dict(default='anisotropic_scaling,jitter',
                           help='their deformations, comma-separated, in turn')})
    kinds = args.kinds.split(',')
    unknown = sorted(set(kinds) - {'anisotropic_scaling', 'jitter',
                                   'rotation'})
    if unknown:
        raise SystemExit(f'--kinds {unknown}: only deformations that keep the '
                         'faces (anisotropic_scaling, jitter, rotation)')
    results = {run: variant_drops(run, args.split, perturbations, args.copies,
                                  kinds) for run in args.runs}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown(results, args.split, args.copies, kinds)
    (out / 'variants.md').write_text(table)
    (out / 'variants.json').write_text(json.dumps(
        dict(split=args.split, copies=args.copies, kinds=kinds,
             coarsen_above=COARSEN_ABOVE, runs=results), indent=1))
    plot(results, out / 'variants.png')
    print(table)


if __name__ == '__main__':
    main()
