"""PyG transforms of this library."""
from pyg_metric_attn.transforms.mesh import (
    MeshOperators,
    NormalizeMesh,
    RandomRotation,
    random_rotation,
    rescaled_heat_kernel_signatures,
)
from pyg_metric_attn.transforms.mesh_preprocessing import MeshPreprocessing

__all__ = ['MeshOperators', 'MeshPreprocessing', 'NormalizeMesh', 'RandomRotation',
           'random_rotation', 'rescaled_heat_kernel_signatures']
