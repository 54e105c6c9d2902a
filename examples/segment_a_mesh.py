"""Segment a human mesh into 8 body parts with the model shipped in the package
(no training, no network).

    python examples/segment_a_mesh.py [MESH ...] [--out FOLDER]

MESH: .obj, .ply, .off or .stl files of people; without any, a procedural
humanoid is written to FOLDER/humanoid.obj and segmented. Per mesh, FOLDER
gets NAME.ply (faces coloured by part), NAME.png (a rendering) and NAME.txt
(a part label per face), and the share of the faces of each part is printed.
The command line does the same: ``pyg-metric-attn predict human_seg MESH``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np


def write_humanoid(path: Path, seed: int = 7) -> Path:
    """A procedural humanoid as an OBJ file (the one the tests pin the
    shipped model's labels on: ``synthetic_human``, seed 7, 2000 faces)."""
    import trimesh

    from pyg_metric_attn.datasets.synthetic_humans import synthetic_human

    pos, face, _ = synthetic_human(np.random.default_rng(seed), target_faces=2000)
    path.parent.mkdir(parents=True, exist_ok=True)
    trimesh.Trimesh(pos, face, process=False).export(path)
    return path


def main() -> int:
    from pyg_metric_attn.pretrained import human_seg

    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('meshes', nargs='*', type=Path, metavar='MESH')
    parser.add_argument('--out', type=Path, default=Path('segmented'))
    args = parser.parse_args()
    meshes = args.meshes or [write_humanoid(args.out / 'humanoid.obj')]
    segmenter = human_seg()
    print(segmenter.description)
    failed = 0
    for path, outcome in segmenter.predict_files(meshes, args.out):
        if isinstance(outcome, Exception):
            print(f'error: {outcome}')
            failed += 1
            continue
        labels = np.loadtxt(outcome.replace('{ply,png,txt}', 'txt'), dtype=int,
                            ndmin=1)
        shares = np.bincount(labels, minlength=len(segmenter.classes)) / len(labels)
        parts = ', '.join(f'{name} {100 * share:.0f}%' for name, share in
                          zip(segmenter.classes, shares, strict=True))
        print(f'{path} -> {outcome}\n  {parts}')
    return 1 if failed else 0


if __name__ == '__main__':
    raise SystemExit(main())
