r"""Tangent-plane gradient operators at the vertices (DiffusionNet-style).

Each vertex gets an orthonormal frame :math:`(x_i, y_i, n_i)`. The gradient of
a vertex function :math:`f` at :math:`i`, in the frame's :math:`(x_i, y_i)`
coordinates, is the least-squares fit :math:`g_i = \arg\min_g \sum_{j \in
\mathcal N(i)} (d_{ij}^\top g - (f_j - f_i))^2`, where :math:`d_{ij}` is the
edge :math:`p_j - p_i` projected onto the tangent plane. It is linear in
:math:`f`, so it is stored as two sparse ``[V, V]`` matrices
(:func:`gradient_operators`), or as one list of their nonzeros with an
:math:`(x, y)` pair of coefficients each (:func:`gradient_coefficients`, the
form :class:`~pyg_metric_attn.nn.spatial_gradient.TangentGradient` reads).
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from pyg_metric_attn.geometry.mesh import face_cross_products, mesh_edges


def vertex_normals(pos: np.ndarray, face: np.ndarray) -> np.ndarray:
    """Area-weighted vertex normals (unit length; +z where they vanish)."""
    cross = face_cross_products(pos, face)
    normals = np.zeros_like(pos, dtype=np.float64)
    for corner in range(3):
        np.add.at(normals, face[:, corner], cross)
    norm = np.linalg.norm(normals, axis=1, keepdims=True)
    normals = np.divide(normals, norm, out=np.zeros_like(normals), where=norm > 0)
    normals[norm[:, 0] == 0] = (0.0, 0.0, 1.0)
    return normals


def tangent_frames(pos: np.ndarray, face: np.ndarray) -> np.ndarray:
    """``[V, 3, 3]`` frames: rows ``x``, ``y`` (tangent basis) and normal
    ``n``. ``x`` is a fixed world axis projected to the tangent plane (the
    one least aligned with ``n``)."""
    normals = vertex_normals(pos, face)
    axes = np.eye(3)[np.argmin(np.abs(normals), axis=1)]
    x = axes - (axes * normals).sum(1, keepdims=True) * normals
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = np.cross(normals, x)
    return np.stack([x, y, normals], axis=1)


def gradient_operators(pos: np.ndarray, face: np.ndarray,
                       frames: np.ndarray | None = None,
                       regularization: float = 1e-8
                       ) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """``(grad_x, grad_y)``: ``grad_x @ f`` is the gradient of ``f`` along each
    vertex's ``x`` axis (see the module docstring)."""
    if frames is None:
        frames = tangent_frames(pos, face)
    edges, _ = mesh_edges(face)
    edges = edges[edges[:, 0] != edges[:, 1]]
    src = np.concatenate([edges[:, 0], edges[:, 1]])
    dst = np.concatenate([edges[:, 1], edges[:, 0]])
    offset = pos[dst] - pos[src]
    d = np.stack([(offset * frames[src, 0]).sum(1),
                  (offset * frames[src, 1]).sum(1)], axis=1)  # [E, 2]
    normal_matrix = np.zeros((len(pos), 2, 2))
    np.add.at(normal_matrix, src, d[:, :, None] * d[:, None, :])
    normal_matrix += regularization * np.eye(2)
    weights = np.einsum('eab,eb->ea', np.linalg.inv(normal_matrix)[src], d)
    operators = []
    for axis in range(2):
        off_diagonal = sp.csr_matrix((weights[:, axis], (src, dst)),
                                     shape=(len(pos), len(pos)))
        diagonal = sp.diags(np.asarray(off_diagonal.sum(axis=1)).ravel())
        operators.append((off_diagonal - diagonal).tocsr())
    return operators[0], operators[1]


def gradient_coefficients(grad_x: sp.spmatrix, grad_y: sp.spmatrix
                          ) -> tuple[np.ndarray, np.ndarray]:
    """The two ``[V, V]`` operators of :func:`gradient_operators` as one list
    of nonzeros: ``index`` ``[2, nnz]`` (rows, columns: the union of both
    sparsity patterns, sorted by row, then column) and ``weight`` ``[nnz, 2]``
    (the ``grad_x`` and ``grad_y`` coefficients, zero where one operator has
    no entry)."""
    x, y = grad_x.tocoo(), grad_y.tocoo()
    num_columns = grad_x.shape[1]
    flat = np.concatenate([x.row.astype(np.int64) * num_columns + x.col,
                           y.row.astype(np.int64) * num_columns + y.col])
    nonzeros, slot = np.unique(flat, return_inverse=True)
    weight = np.zeros((len(nonzeros), 2))
    np.add.at(weight[:, 0], slot[:x.nnz], x.data)
    np.add.at(weight[:, 1], slot[x.nnz:], y.data)
    return np.stack([nonzeros // num_columns, nonzeros % num_columns]), weight
