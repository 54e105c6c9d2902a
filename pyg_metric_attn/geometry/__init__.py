r"""DiffusionNet-style geometry of triangle meshes, one function per operator
with explicit arguments: normalisation, Laplacians, eigenpairs, heat kernel
signatures, tangent gradients, Taubin smoothing, perturbed copies of a mesh
(remeshed, deformed, rotated, renumbered), random rotations, and a
content-keyed operator cache
(:class:`~pyg_metric_attn.transforms.MeshPreprocessing` composes them)."""
from pyg_metric_attn.geometry.cache import OperatorCache, operator_cache_key
from pyg_metric_attn.geometry.gradients import (
    gradient_coefficients,
    gradient_operators,
    tangent_frames,
    vertex_normals,
)
from pyg_metric_attn.geometry.laplacian import (
    cotan_laplacian,
    laplacian,
    tufted_laplacian,
    vertex_fan_counts,
)
from pyg_metric_attn.geometry.mesh import (
    MeshError,
    check_mesh,
    check_surface,
    edge_face_counts,
    face_areas,
    face_normals,
    is_edge_manifold,
    mesh_edges,
    normalize_positions,
    renumber_mesh,
    vertex_to_face_averaging,
)
from pyg_metric_attn.geometry.perturbations import (
    DETERMINISTIC_PERTURBATIONS,
    PERTURBATION_VERSIONS,
    PERTURBATIONS,
    decimate,
    loop_subdivision,
    nearest_faces,
    perturb_mesh,
)
from pyg_metric_attn.geometry.rotation import random_rotation
from pyg_metric_attn.geometry.smoothing import taubin_smoothing, umbrella_operator
from pyg_metric_attn.geometry.spectral import (
    HKS_MIN_TIME,
    eigendecomposition,
    heat_kernel_signature,
    hks_times,
)

__all__ = [
    'DETERMINISTIC_PERTURBATIONS', 'HKS_MIN_TIME', 'PERTURBATIONS',
    'PERTURBATION_VERSIONS', 'MeshError',
    'OperatorCache', 'check_mesh', 'check_surface', 'cotan_laplacian',
    'edge_face_counts', 'eigendecomposition', 'face_areas', 'face_normals',
    'gradient_coefficients', 'gradient_operators', 'heat_kernel_signature',
    'decimate', 'hks_times', 'is_edge_manifold', 'laplacian',
    'loop_subdivision', 'mesh_edges', 'nearest_faces', 'normalize_positions',
    'operator_cache_key', 'perturb_mesh', 'random_rotation', 'renumber_mesh',
    'tangent_frames', 'taubin_smoothing', 'tufted_laplacian', 'umbrella_operator',
    'vertex_fan_counts', 'vertex_normals', 'vertex_to_face_averaging',
]
