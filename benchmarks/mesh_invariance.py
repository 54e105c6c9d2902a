"""Check that a human_seg model's face predictions do not depend on how the
mesh files number their vertices, faces and face corners (or, with
``--perturbation rotation``, on the pose): every mesh of a split is
renumbered (rotated) at random (``--renumberings`` times, by
:func:`~pyg_metric_attn.geometry.perturb_mesh`), each copy goes through the
task's whole preprocessing (operators computed from the new file), and the
face logits are compared with the original's. The accuracy under these and
the remeshing perturbations: ``pyg-metric-attn experiment human_seg_robust``.

    python benchmarks/mesh_invariance.py --root ../shared/datasets/human_seg \
        [--run runs/human_seg/artifacts/metricformer-seed0] [--attention metricformer]

``--run``: a folder with a checkpoint (``best.pt`` or ``last.pt``) of the
task's default model of that kind; without it, a seeded random
initialisation.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch

from pyg_metric_attn.datasets.mesh_io import read_mesh
from pyg_metric_attn.experiments.tasks.human_seg import HumanSegTask
from pyg_metric_attn.geometry import perturb_mesh
from pyg_metric_attn.training.segmentation import face_logits
from pyg_metric_attn.training.trainer import load_best_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--root', required=True, help='MeshCNN human_seg folder')
    parser.add_argument('--split', default='test')
    parser.add_argument('--attention', default='metricformer')
    parser.add_argument('--run', help='checkpoint folder of a trained model')
    parser.add_argument('--renumberings', type=int, default=3)
    parser.add_argument('--perturbation', choices=('renumbering', 'rotation'),
                        default='renumbering')
    args = parser.parse_args()
    task = HumanSegTask(progress=False)
    torch.manual_seed(0)
    model = task.build_model(args.attention).eval()
    if args.run:
        load_best_model(model, args.run)
    rng = np.random.default_rng(0)
    faces = changed = 0
    largest = 0.0
    paths = sorted((Path(args.root) / args.split).glob('*.obj'))
    for path in paths:
        pos, face = read_mesh(path)
        with torch.no_grad():
            mesh = task.prepare_mesh(pos, face, path.stem)
            logits = face_logits(task.forward(model, mesh), mesh.face)
            for _ in range(args.renumberings):
                new_pos, new_face, source_face = perturb_mesh(
                    pos, face, args.perturbation, rng)
                new_mesh = task.prepare_mesh(new_pos, new_face, path.stem)
                new_logits = face_logits(task.forward(model, new_mesh),
                                         new_mesh.face)
                reference = logits[source_face]
                faces += len(face)
                changed += int((new_logits.argmax(1)
                                != reference.argmax(1)).sum())
                largest = max(largest, float((new_logits - reference).abs().max()))
    print(f'{args.attention} ({args.run or "random initialisation"}), '
          f'{len(paths)} {args.split} meshes x {args.renumberings} '
          f'{args.perturbation}s: {changed} of {faces} face predictions changed '
          f'({100 * changed / faces:.2f}%), largest logit change {largest:.2e}')


if __name__ == '__main__':
    main()
