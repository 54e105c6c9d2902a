"""Time the human segmentation preprocessing (k=128 eigenpairs + 16-scale HKS
for all 399 meshes): from scratch, again from the operator cache (processed
files deleted), and loading the processed files.

    python benchmarks/mesh_preprocessing.py --root ../shared/datasets/human_seg \
        [--processed-dir datasets/human_seg_processed] [--former]

``--former`` times what ``MetricMeshFormer`` needs on top: the meshes keep
their 128 eigenpairs and carry tangent gradient operators. The meshes go
through ``MeshPreprocessing`` with its operator cache in
``PROCESSED/operators``.

The processed files stay in ``--processed-dir`` if given (it must not exist
yet), else in a temporary folder that is removed.
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from pyg_metric_attn.datasets import HumanSegmentation
from pyg_metric_attn.transforms import MeshPreprocessing


def load_both(root: str, processed: Path, workers: int,
              former: bool) -> tuple[float, int]:
    options = dict(spectral_basis=128, gradients=True) if former else {}
    preprocess = MeshPreprocessing(cache_dir=processed / 'operators', **options)
    start = time.perf_counter()
    count = sum(len(HumanSegmentation(root, split, pre_transform=preprocess,
                                      processed_dir=str(processed),
                                      num_workers=workers))
                for split in ('train', 'test'))
    return time.perf_counter() - start, count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument('--root', required=True, help='MeshCNN human_seg folder')
    parser.add_argument('--workers', type=int, default=2)
    parser.add_argument('--processed-dir')
    parser.add_argument('--former', action='store_true',
                        help='also keep the eigenpairs and compute gradient '
                        'operators (MetricMeshFormer\'s inputs)')
    args = parser.parse_args()
    if args.processed_dir and Path(args.processed_dir).exists():
        parser.error(f"'{args.processed_dir}' exists: timing needs a fresh folder")
    with tempfile.TemporaryDirectory() as tmp:
        processed = Path(args.processed_dir or Path(tmp) / 'processed')
        first, count = load_both(args.root, processed, args.workers, args.former)
        # The processed files (PROCESSED/TAG/*.pt), not the operator cache
        # (PROCESSED/operators/ab/KEY.pt).
        for path in processed.glob('*/*.pt'):
            path.unlink()
        cached, _ = load_both(args.root, processed, args.workers, args.former)
        loaded, _ = load_both(args.root, processed, args.workers, args.former)
        entries = len(list((processed / 'operators').rglob('*.pt')))
        if not args.processed_dir:
            shutil.rmtree(processed)
    print(f'| run | meshes | seconds |\n|---|---|---|\n'
          f'| from scratch ({args.workers} workers) | {count} | {first:.1f} |\n'
          f'| processed files deleted, operator cache ({entries} entries) kept '
          f'| {count} | {cached:.1f} |\n'
          f'| processed files present | {count} | {loaded:.1f} |')


if __name__ == '__main__':
    main()
