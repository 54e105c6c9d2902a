"""PyG transforms of this library."""
from pyg_metric_attn.transforms.mesh import (
    MeshOperators,
    NormalizeMesh,
    RandomRotation,
    random_rotation,
)

__all__ = ['MeshOperators', 'NormalizeMesh', 'RandomRotation', 'random_rotation']
