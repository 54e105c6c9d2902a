"""Data sets: the human segmentation benchmark, any folder of meshes,
procedural humanoids, perturbed copies of meshes, MNIST (IDX files) and its digits as point clouds of
their ink pixels, Multi30k with its subword tokenizer, and a synthetic
node-classification graph (stochastic block model).

Names are imported on first use, so that each needs only its own extra: the
mesh data sets need ``pyg-metric-attn[mesh]``, the subword tokenizer
``[experiments]``; MNIST (and its point clouds), Multi30k's text, batching
and the stochastic block model need neither.
"""
from __future__ import annotations

import importlib
from typing import Any

#: Public name -> the module that defines it.
_MODULES = {
    'bucket_batches': 'batching', 'pad_sequences': 'batching',
    'HumanSegmentation': 'human_segmentation',
    'IDXFormatError': 'idx', 'read_idx': 'idx',
    'image_point_cloud': 'image_points',
    'image_point_clouds': 'image_points',
    'MeshDataset': 'mesh_dataset', 'majority_label': 'mesh_dataset',
    'mesh_data': 'mesh_dataset',
    'MeshFolder': 'mesh_folder',
    'MNIST': 'mnist',
    'MNISTPointClouds': 'mnist_point_clouds',
    'PerturbedMeshes': 'perturbed_meshes', 'RandomCopies': 'perturbed_meshes',
    'Multi30k': 'multi30k',
    'stochastic_block_graph': 'stochastic_block',
    'SPECIAL_TOKENS': 'subword', 'SubwordTokenizer': 'subword',
    'BODY_PARTS': 'synthetic_humans', 'SyntheticHumans': 'synthetic_humans',
}

__all__ = sorted(_MODULES)


def __getattr__(name: str) -> Any:
    if name not in _MODULES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f'{__name__}.{_MODULES[name]}')
    return getattr(module, name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_MODULES))
