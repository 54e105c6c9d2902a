"""How much of a trained human_seg model's accuracy drop under a
perturbation comes from its input descriptor (the HKS) and how much from
the mesh operators and connectivity it runs on: each perturbed copy of the
meshes read up to eight ways,

- ``perturbed``: as ``experiment human_seg_robust`` scores it (its own HKS,
  operators and connectivity);
- ``original inputs``: the perturbed mesh with the original mesh's HKS
  carried over (``human_seg_robust.carried``: the original vertices keep
  theirs; a vertex Loop subdivision adds on an edge takes the mean of that
  edge's two original vertices; a decimated copy's vertices, which move,
  take their nearest original vertex's), so only the operators and
  connectivity differ;
- ``only inputs perturbed`` (perturbations that keep the vertices and the
  faces: jitter, anisotropic scaling, rotation): the original mesh with the
  perturbed copy's HKS, so only the descriptor differs;
- ``invariant model``: the original mesh's vertex logits carried to the
  copy's vertices as the HKS above and read out at its faces: what a model
  exactly invariant to the perturbation would lose, the cost of reading a
  vertex model out at faces it did not see (subdivision's corner faces
  lean towards their one original vertex); for decimation an
  approximation, each vertex taking its nearest original vertex's logits;
- ``only added vertices perturbed``, ``only original vertices perturbed``
  (Loop subdivision): the invariant model's vertex logits with those of the
  vertices subdivision adds replaced by the copy's own, or the copy's own
  logits at the original vertices with every added vertex taking the mean
  of its edge's two ends (:func:`partly_own`): the model's change beyond
  the readout split by vertex kind (the added vertices, three quarters of
  the copy's and at least two corners of each of its faces, weigh more);
- ``at the original faces``: the perturbed copy's face logits averaged
  over the faces that stem from one original face and scored against the
  original labels, at the resolution the labels were drawn (an invariant
  model loses nothing here; ``experiment human_seg_robust``'s drop at the
  original faces; not for decimation, which leaves original faces without
  faces);
- ``ground truth``: the labels themselves read out as a vertex model is
  (each original vertex the mean of its faces' one-hot labels, carried and
  averaged at the copy's faces): what the labels' resolution alone costs.

    python -m benchmarks.mesh_input_transplant RUN [RUN ...] [--split val] \
        [--perturbations subdivision,decimation,jitter,anisotropic_scaling] \
        [--out FOLDER]

``RUN``: folders written by ``pyg-metric-attn train human_seg`` whose model
reads HKS inputs; the perturbed meshes are those of ``experiment
human_seg_robust`` (seed 0), read from or written to the run's processed
folder. Writes ``transplant.md``, ``transplant.json`` and ``transplant.png``
to ``--out``.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch_geometric.utils import scatter
from tqdm.auto import tqdm

from benchmarks.mesh_feature_drift import SAME_VERTICES, parse_arguments
from pyg_metric_attn.datasets import BODY_PARTS, PerturbedMeshes
from pyg_metric_attn.experiments.human_seg_robust import (
    carried,
    score_set,
    split_meshes,
)
from pyg_metric_attn.experiments.run_folder import load_run
from pyg_metric_attn.training.eval_mode import eval_mode
from pyg_metric_attn.training.segmentation import face_logits

#: The readings of each perturbation, in the order of the table.
WAYS = ('perturbed', 'original inputs', 'only inputs perturbed',
        'invariant model', 'only added vertices perturbed',
        'only original vertices perturbed', 'at the original faces',
        'ground truth')
#: The readings of a Loop subdivision by which of its vertices keep the
#: copy's own logits (:func:`partly_own`).
OWN_VERTICES = {'only added vertices perturbed': 'added',
                'only original vertices perturbed': 'original'}
#: The perturbations this script reads.
READABLE = (*SAME_VERTICES, 'decimation')


def ground_truth_drop(meshes, copies, num_classes: int) -> float:
    """Points the labels themselves lose to the copies' faces when read out
    as a vertex model is: each original vertex takes the mean of its faces'
    one-hot labels, carried to the copies (:func:`carried`) and averaged at
    the faces, against the same readout at the original faces."""
    correct = [0, 0]
    faces = [0, 0]
    for mesh, copy in zip(meshes, copies, strict=True):
        labels = F.one_hot(mesh.y, num_classes).to(torch.float64)
        at_vertices = scatter(labels.repeat(3, 1), mesh.face.flatten(), dim=0,
                              dim_size=mesh.num_nodes, reduce='mean')
        for i, (values, target) in enumerate((
                (face_logits(at_vertices, mesh.face), mesh.y),
                (face_logits(carried(at_vertices, copy, mesh), copy.face),
                 copy.y))):
            correct[i] += int((values.argmax(-1) == target).sum())
            faces[i] += target.numel()
    return 100 * (correct[0] / faces[0] - correct[1] / faces[1])


def partly_own(own: torch.Tensor, original: torch.Tensor, copy, mesh,
               own_vertices: str) -> torch.Tensor:
    """Vertex logits of a Loop-subdivided copy that are the copy's ``own``
    only at ``own_vertices``: ``'added'``, the vertices subdivision adds
    (the original ones keep the original mesh's logits ``original``), or
    ``'original'``, the original mesh's vertices, the copy's first (every
    added vertex then takes the mean of its edge's two ends, as in
    :func:`carried`)."""
    count = original.size(0)
    if own_vertices == 'added':
        values = carried(original, copy, mesh).clone()
        values[count:] = own[count:]
        return values
    if own_vertices == 'original':
        return carried(own[:count], copy, mesh)
    raise ValueError(f"own_vertices is 'added' or 'original', not "
                     f"{own_vertices!r}")


def carried_logits_accuracies(task, model, meshes, copies,
                              subdivided: bool) -> dict[str, float]:
    """The face accuracy on the copies of vertex logits carried from the
    original meshes and read out at the copies' faces: ``'invariant
    model'``, the original logits (:func:`carried`), what a model exactly
    invariant to the perturbation scores; for a Loop subdivision
    (``subdivided``) also the readings of :data:`OWN_VERTICES`."""
    correct: dict[str, int] = {}
    faces = 0
    with eval_mode(model):
        for mesh, copy in zip(meshes, copies, strict=True):
            original = task.forward(model, mesh)
            readings = {'invariant model': carried(original, copy, mesh)}
            if subdivided:
                own = task.forward(model, copy)
                readings.update(
                    {way: partly_own(own, original, copy, mesh, own_vertices)
                     for way, own_vertices in OWN_VERTICES.items()})
            for way, logits in readings.items():
                predicted = face_logits(logits, copy.face).argmax(-1)
                correct[way] = correct.get(way, 0) + int(
                    (predicted == copy.y).sum())
            faces += copy.y.numel()
    return {way: count / faces for way, count in correct.items()}


def with_hks(mesh, hks: torch.Tensor, source_face: torch.Tensor):
    """A copy of ``mesh`` whose HKS inputs are ``hks`` and whose faces stem
    from the original faces ``source_face``."""
    mesh = mesh.clone()
    mesh.hks, mesh.source_face = hks, source_face
    return mesh


def transplant(run: str, split: str, perturbations: list[str]) -> dict:
    """``{perturbation: {way: drop in points}}`` of one run, and the
    accuracy on the unperturbed meshes under ``'original'``."""
    task, model, description = load_run(run, 'human_seg', {},
                                        command='mesh_input_transplant')
    if task.config.features != 'hks':
        raise ValueError(f"'{run}' reads {task.config.features!r} inputs, "
                         f"not HKS")
    if task.config.mesh_area is not None:
        raise ValueError(f"'{run}' scales every mesh to an area "
                         f"(mesh_area), which recomputes its HKS from its own "
                         f"eigenpairs: HKS carried from another mesh are not "
                         f"what it reads")
    meshes = split_meshes(task, split)
    root = Path(meshes.processed_root) / 'robustness'
    originals = [task.predict(model, mesh) for mesh in meshes]
    base = score_set(task, model, meshes, originals, False)['face_acc']
    result = {'original': 100 * base}
    for perturbation in perturbations:
        copies = list(PerturbedMeshes(
            root, meshes, perturbation, 0, pre_transform=task.preprocessing,
            num_workers=task.config.num_workers, log=False))
        ways = {'perturbed': copies,
                'original inputs': [with_hks(copy, carried(mesh.hks, copy, mesh),
                                             copy.source_face)
                                    for mesh, copy in zip(meshes, copies,
                                                          strict=True)]}
        if perturbation in SAME_VERTICES and perturbation != 'subdivision':
            # The original mesh with the copy's HKS: its faces and labels
            # are the original's, every face its own source.
            ways['only inputs perturbed'] = [
                with_hks(mesh, copy.hks, copy.source_face)
                for mesh, copy in zip(meshes, copies, strict=True)]
        labels = [mesh.y for mesh in meshes]
        scored = {way: score_set(task, model, sets, originals, True, labels)
                  for way, sets in tqdm(ways.items(), desc=f'{Path(run).name} '
                                        f'{perturbation}')}
        result[perturbation] = {way: 100 * (base - row['face_acc'])
                                for way, row in scored.items()}
        result[perturbation].update({
            way: 100 * (base - accuracy) for way, accuracy in
            carried_logits_accuracies(task, model, meshes, copies,
                                      perturbation == 'subdivision').items()})
        result[perturbation]['ground truth'] = ground_truth_drop(
            meshes, copies, len(BODY_PARTS))
        if scored['perturbed']['source_face_acc'] is not None:
            result[perturbation]['at the original faces'] = 100 * (
                base - scored['perturbed']['source_face_acc'])
    print(description)
    return result


def main() -> None:
    args, perturbations = parse_arguments(
        __doc__, 'subdivision,decimation,jitter,anisotropic_scaling',
        'runs/mesh_input_transplant', READABLE,
        **{'--split': dict(choices=('test', 'val'), default='test')})
    results = {run: transplant(run, args.split, perturbations)
               for run in args.runs}
    lines = [f'Drop in face accuracy (points) on the {args.split} meshes, '
             f'perturbation seed 0.', '',
             '| run | accuracy % | perturbation | ' + ' | '.join(WAYS) + ' |',
             '|---|---|---|' + '---|' * len(WAYS)]
    for run, result in results.items():
        for perturbation in perturbations:
            row = result[perturbation]
            lines.append(f"| {Path(run).name} | {result['original']:.2f} | "
                         f'{perturbation} | ' + ' | '.join(
                             f'{row[way]:.2f}' if way in row else '-'
                             for way in WAYS) + ' |')
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / 'transplant.md').write_text('\n'.join(lines) + '\n')
    (out / 'transplant.json').write_text(json.dumps(results, indent=1))
    plot(results, args.split, out / 'transplant.png')
    print('\n'.join(lines))


def plot(results: dict, split: str, path: Path) -> None:
    """One panel per perturbation: each run's drop, read each way."""
    from pyg_metric_attn.visualization import file_figure

    perturbations = [key for key in next(iter(results.values()))
                     if key != 'original']
    figure = file_figure(figsize=(5 * len(perturbations), 4))
    width = 0.8 / len(results)
    for panel, perturbation in enumerate(perturbations):
        ax = figure.add_subplot(1, len(perturbations), panel + 1)
        for index, (run, result) in enumerate(results.items()):
            drops = result[perturbation]
            ax.bar([WAYS.index(way) + (index - (len(results) - 1) / 2) * width
                    for way in drops], list(drops.values()), width,
                   label=Path(run).name)
        ax.set_xticks(range(len(WAYS)), WAYS, rotation=30, ha='right')
        ax.set_title(perturbation)
        ax.set_ylabel('drop in face accuracy (points)')
        ax.grid(alpha=0.3, axis='y')
    ax.legend(fontsize=7)
    figure.suptitle(f'human_seg {split} meshes: where the drop comes from')
    figure.tight_layout()
    figure.savefig(path, dpi=110)


if __name__ == '__main__':
    main()
