"""PyG transforms of this library: the preprocessing of meshes for the mesh
models, and augmentations."""
from pyg_metric_attn.transforms.mesh import RandomRotation
from pyg_metric_attn.transforms.mesh_preprocessing import MeshPreprocessing

__all__ = ['MeshPreprocessing', 'RandomRotation']
