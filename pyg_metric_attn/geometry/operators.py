"""All per-mesh operators in one call, cached on disk by content."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pyg_metric_attn.geometry.cache import OperatorCache, operator_cache_key
from pyg_metric_attn.geometry.gradients import gradient_operators, tangent_frames
from pyg_metric_attn.geometry.laplacian import laplacian
from pyg_metric_attn.geometry.mesh import check_mesh
from pyg_metric_attn.geometry.spectral import (
    eigendecomposition,
    heat_kernel_signature,
)


def _sparse_to_torch(matrix) -> torch.Tensor:
    coo = matrix.tocoo()
    index = torch.from_numpy(np.stack([coo.row, coo.col]).astype(np.int64))
    return torch.sparse_coo_tensor(index, torch.from_numpy(coo.data).float(),
                                   coo.shape, check_invariants=True).coalesce()


def mesh_operators(pos: np.ndarray, face: np.ndarray, k: int = 128,
                   hks_count: int = 16, gradients: bool = False,
                   laplacian_method: str = 'auto', name: str = 'mesh',
                   cache: OperatorCache | None = None) -> dict[str, Any]:
    """The operators of one mesh (positions as given; normalise first).

    Returns float32 tensors: ``mass`` ``[V]``, ``evals`` ``[k]``, ``evecs``
    ``[V, k]``, ``hks`` ``[V, hks_count]``, ``laplacian`` (sparse ``[V, V]``),
    with ``gradients=True`` also ``frames`` ``[V, 3, 3]`` and sparse
    ``grad_x``, ``grad_y``; and ``laplacian_method`` (``'cotan'`` or
    ``'robust'``). Computed in float64. With a ``cache``, an entry for the
    same content and settings is reused.

    A mesh of ``V <= k`` vertices has only ``V`` eigenpairs: they are padded
    to ``k`` with zero eigenvectors (eigenvalue: the largest one), which add
    nothing to a spectral diffusion or an HKS but let the mesh be batched
    with others.
    """
    pos = np.asarray(pos, dtype=np.float64)
    face = np.asarray(face, dtype=np.int64)
    check_mesh(pos, face, name)
    settings = dict(k=k, hks_count=hks_count, gradients=gradients,
                    laplacian=laplacian_method)
    key = operator_cache_key(pos, face, settings)
    cache = cache or OperatorCache(None)
    entry = cache.load(key)
    if entry is not None:
        return entry

    L, mass, method = laplacian(pos, face, laplacian_method)
    evals, evecs = eigendecomposition(L, mass, k, name)
    missing = k - len(evals)
    if missing > 0:
        evals = np.concatenate([evals, np.full(missing, evals[-1])])
        evecs = np.pad(evecs, ((0, 0), (0, missing)))
    entry = {
        'mass': torch.from_numpy(mass).float(),
        'evals': torch.from_numpy(evals).float(),
        'evecs': torch.from_numpy(evecs).float(),
        'hks': torch.from_numpy(heat_kernel_signature(evals, evecs,
                                                      hks_count)).float(),
        'laplacian': _sparse_to_torch(L),
        'laplacian_method': method,
    }
    if gradients:
        frames = tangent_frames(pos, face)
        grad_x, grad_y = gradient_operators(pos, face, frames)
        entry.update(frames=torch.from_numpy(frames).float(),
                     grad_x=_sparse_to_torch(grad_x),
                     grad_y=_sparse_to_torch(grad_y))
    cache.save(key, entry)
    return entry
