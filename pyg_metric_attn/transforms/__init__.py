"""PyG transforms of this library: the preprocessing of meshes for the mesh
models, its scaling to a set surface area, and augmentations."""
from pyg_metric_attn.transforms.mesh import (
    RandomRotation,
    random_rotation,
    rescaled_heat_kernel_signatures,
)
from pyg_metric_attn.transforms.mesh_area import AreaNormalization, scale_to_area
from pyg_metric_attn.transforms.mesh_preprocessing import MeshPreprocessing

__all__ = ['AreaNormalization', 'MeshPreprocessing', 'RandomRotation',
           'random_rotation', 'rescaled_heat_kernel_signatures', 'scale_to_area']
