"""PyG transforms of this library."""
from pyg_metric_attn.transforms.mesh import (
    MeshOperators,
    NormalizeMesh,
    RandomRotation,
    random_rotation,
    rescaled_heat_kernel_signatures,
)

__all__ = ['MeshOperators', 'NormalizeMesh', 'RandomRotation', 'random_rotation',
           'rescaled_heat_kernel_signatures']
