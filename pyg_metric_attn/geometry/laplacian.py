r"""Discrete Laplace-Beltrami operators of a triangle mesh.

Both return the positive semi-definite weak Laplacian :math:`L` (rows sum to
zero) and the lumped (barycentric) mass :math:`M` (vertex areas, summing to the
surface area), so :math:`L \phi = \lambda M \phi` approximates
:math:`-\Delta \phi = \lambda \phi`.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from pyg_metric_attn.geometry.mesh import face_areas, is_edge_manifold
from pyg_metric_attn.utils.optional import needs_extra

with needs_extra('mesh'):
    import potpourri3d as pp3d
    import robust_laplacian

LAPLACIANS = ('auto', 'cotan', 'robust')


def cotan_laplacian(pos: np.ndarray, face: np.ndarray) -> tuple[sp.csr_matrix,
                                                                  np.ndarray]:
    r"""The cotangent Laplacian :math:`L_{ij} = -\tfrac12(\cot\alpha_{ij} +
    \cot\beta_{ij})`, :math:`L_{ii} = -\sum_{j \ne i} L_{ij}`, and barycentric
    vertex areas (potpourri3d)."""
    pos, face = np.ascontiguousarray(pos, np.float64), np.ascontiguousarray(face)
    L = pp3d.cotan_laplacian(pos, face, denom_eps=1e-10).tocsr()
    return L, pp3d.vertex_areas(pos, face)


def tufted_laplacian(pos: np.ndarray, face: np.ndarray,
                     mollify_factor: float = 1e-5) -> tuple[sp.csr_matrix,
                                                            np.ndarray]:
    """The tufted-cover Laplacian of Sharp & Crane 2020 (robust_laplacian),
    well defined on non-manifold and degenerate meshes, with its lumped mass."""
    pos, face = np.ascontiguousarray(pos, np.float64), np.ascontiguousarray(face)
    L, M = robust_laplacian.mesh_laplacian(pos, face, mollify_factor)
    return L.tocsr(), M.diagonal().copy()


def vertex_fan_counts(face: np.ndarray, num_vertices: int) -> np.ndarray:
    """Number of face fans around each vertex: 1 for a manifold vertex, more for
    a pinch (non-manifold) vertex, 0 for an unreferenced one.

    Corners ``(vertex, face)`` are linked when their faces share an edge at
    that vertex; a vertex has one fan per connected group of its corners.
    """
    num_faces = len(face)
    corner = np.arange(3 * num_faces).reshape(num_faces, 3)  # corner id
    # Each face side (a, b) with its two corners, keyed by the sorted edge.
    sides = np.concatenate([face[:, [0, 1]], face[:, [1, 2]], face[:, [2, 0]]])
    side_corners = np.concatenate([corner[:, [0, 1]], corner[:, [1, 2]],
                                   corner[:, [2, 0]]])
    flip = sides[:, 0] > sides[:, 1]
    sides[flip] = sides[flip][:, ::-1]
    side_corners[flip] = side_corners[flip][:, ::-1]
    order = np.lexsort((sides[:, 1], sides[:, 0]))
    sides, side_corners = sides[order], side_corners[order]
    same = (sides[1:] == sides[:-1]).all(axis=1)  # consecutive sides, same edge
    a = side_corners[:-1][same].reshape(-1)
    b = side_corners[1:][same].reshape(-1)
    graph = sp.coo_matrix((np.ones(len(a)), (a, b)),
                          shape=(3 * num_faces, 3 * num_faces))
    _, component = connected_components(graph, directed=False)
    pairs = np.unique(np.stack([face.reshape(-1), component]), axis=1)
    return np.bincount(pairs[0], minlength=num_vertices)


def laplacian(pos: np.ndarray, face: np.ndarray, method: str = 'auto'
              ) -> tuple[sp.csr_matrix, np.ndarray, str]:
    """``(L, mass, method used)``. ``'auto'`` takes the cotan Laplacian on
    clean manifold meshes and the tufted (robust) one where a mesh has
    non-manifold edges, pinch vertices or zero-area faces."""
    if method not in LAPLACIANS:
        raise ValueError(f"Unknown Laplacian '{method}'; expected one of {LAPLACIANS}")
    if method == 'auto':
        degenerate = (face_areas(pos, face) <= 1e-12 * np.ptp(pos) ** 2).any()
        clean = (not degenerate and is_edge_manifold(face)
                 and vertex_fan_counts(face, len(pos)).max() <= 1)
        method = 'cotan' if clean else 'robust'
    if method == 'cotan':
        return (*cotan_laplacian(pos, face), method)
    return (*tufted_laplacian(pos, face), method)
