"""The readout floor of Loop subdivision: what a human_seg vertex model
loses on the subdivided meshes even when subdivision does not change it.

A face is read out as the mean of its three vertices' logits
(``face_logits``); one Loop subdivision step splits it into a middle face,
which reads the face's own logits, and three corner faces, which read the
logits at its corner points (``corner_logits``, barycentric (2/3, 1/6,
1/6)), all four carrying the face's label. So the accuracy on the
subdivided faces of vertex logits that subdivision does not change is
read off the original mesh alone, without building the copy (the test
``test_corner_logits_are_what_the_subdivided_corner_faces_read_out`` ties
the two together), on any split, the training meshes included:

- ``RUN``: the trained run's own vertex logits (``experiment
  human_seg_robust`` reads the same floor on the validation or test meshes
  from real copies);
- ``free logits at the centroids``: no model; free logits at every vertex
  of the first run's meshes, fitted by full-batch Adam to each mesh's own
  face labels (the cross entropy at the faces: what training asks);
- ``free logits at the centroids and corners``: the same fit with the cross
  entropy at the corner points added (``-o corner_loss=1``'s loss).

The free fits show what the vertex readout allows at all: fitted at the
centroids only, a perfect fit of the faces still loses at the corner faces
of the part borders; fitted at the corners too, almost nothing.

    python -m benchmarks.mesh_readout_floor RUN [RUN ...] [--split val] \\
        [--steps 500] [--out FOLDER] [--threads 1]

``--split``: ``test``, ``val`` (the meshes the run held out) or
``train`` (its training meshes, originals only). Writes ``floor.md``,
``floor.json`` and ``floor.png`` to ``--out``.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from pyg_metric_attn.datasets import BODY_PARTS
from pyg_metric_attn.experiments.human_seg_robust import split_meshes
from pyg_metric_attn.experiments.run_folder import load_run
from pyg_metric_attn.training.segmentation import corner_logits, face_logits

#: The free-logit fits: reading name -> weight of the corner points' loss.
FREE_FITS = {'free logits at the centroids': 0.0,
             'free logits at the centroids and corners': 1.0}


def subdivided_hits(vertex_logits: torch.Tensor, face: torch.Tensor,
                    labels: torch.Tensor) -> tuple[int, int]:
    """``(hits at the faces, hits at the faces of one Loop subdivision
    step)`` of ``vertex_logits`` carried unchanged to the subdivided mesh:
    per face its middle face (the face's logits) and its three corner faces
    (:func:`corner_logits`), all with the face's label."""
    at_faces = int((face_logits(vertex_logits, face).argmax(-1) == labels).sum())
    at_corners = int((corner_logits(vertex_logits, face).argmax(-1)
                      == labels).sum())
    return at_faces, at_faces + at_corners


def floor_row(hits: list[tuple[int, int]], faces: int) -> dict[str, float]:
    """Accuracies (%) at the faces and at the subdivided faces (four per
    face) and the floor between them (points) of per-mesh ``hits``."""
    at_faces = 100 * sum(hit for hit, _ in hits) / faces
    at_subdivided = 100 * sum(hit for _, hit in hits) / (4 * faces)
    return {'faces_acc': at_faces, 'subdivided_acc': at_subdivided,
            'floor': at_faces - at_subdivided}


def model_floor(task, model, meshes, progress: bool = True) -> dict[str, float]:
    """The floor of a trained model's own vertex logits on ``meshes``."""
    hits = [subdivided_hits(task.vertex_scores(model, mesh), mesh.face, mesh.y)
            for mesh in tqdm(meshes, desc='model', disable=not progress)]
    return floor_row(hits, sum(mesh.y.numel() for mesh in meshes))


def fit_free_logits(meshes, corner_weight: float, steps: int = 500,
                    lr: float = 0.1) -> list[torch.Tensor]:
    """Free logits ``[V, classes]`` per mesh, fitted (Adam, from zeros, all
    meshes in one full batch: their losses add, their logits are apart) to
    the mesh's face labels by the cross entropy at the faces plus
    ``corner_weight`` times that at the corner points."""
    sizes = [mesh.num_nodes for mesh in meshes]
    offsets = torch.tensor([0] + sizes[:-1]).cumsum(0)
    face = torch.cat([mesh.face + offset
                      for mesh, offset in zip(meshes, offsets, strict=True)],
                     dim=1)
    labels = torch.cat([mesh.y for mesh in meshes])
    logits = torch.zeros(sum(sizes), len(BODY_PARTS), requires_grad=True)
    optimizer = torch.optim.Adam([logits], lr=lr)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(face_logits(logits, face), labels)
        if corner_weight:
            loss = loss + corner_weight * F.cross_entropy(
                corner_logits(logits, face).flatten(0, 1), labels.repeat(3))
        loss.backward()
        optimizer.step()
    return list(logits.detach().split(sizes))


def free_floor(meshes, corner_weight: float, steps: int) -> dict[str, float]:
    """The floor of free logits fitted to ``meshes``' own labels."""
    fitted = fit_free_logits(meshes, corner_weight, steps)
    hits = [subdivided_hits(logits, mesh.face, mesh.y)
            for logits, mesh in zip(fitted, meshes, strict=True)]
    return floor_row(hits, sum(mesh.y.numel() for mesh in meshes))


def readout_floors(runs: list[str], split: str, steps: int,
                   progress: bool = True) -> dict[str, dict[str, float]]:
    """``{reading: row}``: each run's floor on its ``split`` meshes, then the
    free fits of :data:`FREE_FITS` on the first run's."""
    results, first = {}, None
    for run in runs:
        task, model, description = load_run(run, 'human_seg', {},
                                            command='mesh_readout_floor')
        meshes = (list(task.datasets()[0]) if split == 'train'
                  else list(split_meshes(task, split)))
        first = meshes if first is None else first
        print(description)
        results[run] = model_floor(task, model, meshes, progress)
    for reading, weight in FREE_FITS.items():
        results[reading] = free_floor(first, weight, steps)
    return results


def markdown(results: dict[str, dict[str, float]], split: str) -> str:
    """The table of :func:`readout_floors`."""
    lines = [f'Readout floor of one Loop subdivision step on the {split} '
             f'meshes (vertex logits carried unchanged to the finer faces).',
             '', '| reading | at the faces % | at the subdivided faces % | '
             'readout floor (points) |', '|---|---|---|---|']
    lines += [f"| {Path(reading).name} | {row['faces_acc']:.2f} | "
              f"{row['subdivided_acc']:.2f} | {row['floor']:.2f} |"
              for reading, row in results.items()]
    return '\n'.join(lines) + '\n'


def plot(results: dict[str, dict[str, float]], split: str, path: Path) -> None:
    """A bar of each reading's floor."""
    import matplotlib

    matplotlib.use('Agg')
    import matplotlib.pyplot as plt

    names = [Path(reading).name for reading in results]
    fig, axes = plt.subplots(figsize=(1.6 + 1.4 * len(names), 4))
    axes.bar(range(len(names)), [row['floor'] for row in results.values()])
    axes.set_xticks(range(len(names)), names, rotation=20, ha='right',
                    fontsize=7)
    axes.set(ylabel='readout floor (points)',
             title=f'Loop subdivision readout floor, {split} meshes')
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument('runs', nargs='+', metavar='RUN')
    parser.add_argument('--split', choices=('test', 'val', 'train'),
                        default='test')
    parser.add_argument('--steps', type=int, default=500,
                        help='Adam steps of the free fits (default: 500)')
    parser.add_argument('--out', default='runs/mesh_readout_floor')
    parser.add_argument('--threads', type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    results = readout_floors(args.runs, args.split, args.steps)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown(results, args.split)
    (out / 'floor.md').write_text(table)
    (out / 'floor.json').write_text(json.dumps(results, indent=1))
    plot(results, args.split, out / 'floor.png')
    print(table)


if __name__ == '__main__':
    main()
