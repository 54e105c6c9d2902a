r"""The one preprocessing of a triangle mesh for the mesh models: what the
data sets store and what ``predict`` computes for a mesh file."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform
from torch_geometric.utils import remove_self_loops, to_undirected

from pyg_metric_attn.geometry.cache import OperatorCache, operator_cache_key
from pyg_metric_attn.geometry.gradients import (
    gradient_coefficients,
    gradient_operators,
)
from pyg_metric_attn.geometry.laplacian import LAPLACIANS, laplacian
from pyg_metric_attn.geometry.mesh import MeshError, check_mesh, normalize_positions
from pyg_metric_attn.geometry.smoothing import smoothing_rounds, taubin_smoothing
from pyg_metric_attn.geometry.spectral import (
    eigendecomposition,
    heat_kernel_signature,
)
from pyg_metric_attn.utils import point_sets
from pyg_metric_attn.utils.optional import needs_extra

with needs_extra('mesh'):
    from threadpoolctl import threadpool_limits


class MeshPreprocessing(BaseTransform):
    r"""Prepares a triangle mesh (``data.pos`` ``[V, 3]`` as read from its
    file, ``data.face`` ``[3, F]``) for the mesh models, DiffusionNet's way.

    Sets, and leaves every other attribute as it is:

    * ``pos``: centred on the vertex mean and scaled to unit maximum radius
      (:func:`~pyg_metric_attn.geometry.normalize_positions`), float32;
    * ``edge_index``: the mesh edges in both directions (sorted, no
      self-loops) ``[2, 2E]``;
    * ``hks`` and ``x = hks``: ``hks_count`` heat kernel signatures
      ``[V, hks_count]`` at times log-spaced in :math:`[10^{-2}, 1]` from the
      ``k`` smallest eigenpairs of the Laplacian;
    * ``mass``: the lumped vertex areas ``[V]``;
    * with ``spectral_basis = m > 0``: the first ``m`` eigenpairs, ``evals``
      ``[1, m]`` and ``evecs`` ``[V, m]`` (mass-orthonormal; for
      :class:`~pyg_metric_attn.nn.HeatDiffusion`);
    * with ``gradients``: the tangent gradient operators as ``grad_index``
      ``[2, nnz]`` and ``grad_weight`` ``[nnz, 2]`` (for
      :class:`~pyg_metric_attn.nn.spatial_gradient.TangentGradient` and
      :class:`~pyg_metric_attn.nn.SpatialGradientFeatures`);
    * with ``farthest_point_ranks``: ``farthest_point_rank`` ``[V]``, the
      step at which farthest point sampling of ``pos`` picks each vertex
      (:func:`~pyg_metric_attn.utils.point_sets.farthest_point_ranks`),
      from which :class:`~pyg_metric_attn.nn.models.MetricMeshFormer` takes
      the keys of its global step at any ``global_stride`` instead of
      sampling them in every forward pass.

    With ``smoothing = s > 0`` every operator is computed from the positions
    after ``s`` rounds of :func:`~pyg_metric_attn.geometry.taubin_smoothing`
    (``pos`` itself is kept): vertex noise reaches the HKS, eigenpairs and
    gradients damped, and so do part of the differences a finer meshing of
    the surface makes. The rounds act over edges, not a distance: a coarser
    mesh is smoothed over a wider patch of its surface. The smoothing's
    ``lam`` and ``pass_band`` are the function's defaults; a change of them
    needs a new :attr:`version`.

    These are exactly what :class:`~pyg_metric_attn.nn.models.MetricMeshFormer`
    and the IPN read. The operators compose the functions of
    :mod:`pyg_metric_attn.geometry`: :func:`~pyg_metric_attn.geometry.laplacian`
    (cotan; the tufted robust Laplacian where a mesh has non-manifold edges or
    vertices or zero-area faces with ``'auto'``),
    :func:`~pyg_metric_attn.geometry.eigendecomposition` (a mesh of
    :math:`V \le k` vertices has its :math:`V` eigenpairs padded to ``k``
    with zero eigenvectors, which add nothing to a diffusion or an HKS but let
    it be batched with others),
    :func:`~pyg_metric_attn.geometry.heat_kernel_signature`,
    :func:`~pyg_metric_attn.geometry.gradient_operators` and
    :func:`~pyg_metric_attn.geometry.gradient_coefficients`. They are computed
    in float64 from the float32 positions the models see, on one BLAS thread
    (so that a mesh gets the same bits in a data set's worker process as in
    the main process), and stored as float32.

    Args:
        k (int): Laplacian eigenpairs for the HKS. (default: :obj:`128`)
        hks_count (int): HKS scales. (default: :obj:`16`)
        spectral_basis (int): Eigenpairs kept as ``evals``, ``evecs``, at most
            ``k``; :obj:`0` keeps none. (default: :obj:`0`)
        gradients (bool): Keep the tangent gradient operators.
            (default: :obj:`False`)
        laplacian (str): ``'auto'``, ``'cotan'`` or ``'robust'``.
            (default: :obj:`'auto'`)
        smoothing (int): Taubin smoothing rounds before the operators.
            (default: :obj:`0`)
        farthest_point_ranks (bool): Keep the farthest-point ranks of the
            vertices. (default: :obj:`False`)
        cache_dir (str or Path, optional): A content-keyed cache of the
            operators (:class:`~pyg_metric_attn.geometry.OperatorCache`): an
            entry holds ``hks``, ``mass`` and, where kept, ``evals``,
            ``evecs``, ``grad_index``, ``grad_weight``,
            ``farthest_point_rank``, under the SHA-256 of
            the normalised positions, the faces, these settings and
            :attr:`version`; it is written atomically and verified on load.
            It does not change the output, so the ``repr`` leaves it out.
            (default: :obj:`None`: no cache)
    """
    #: Bump when the output changes: cache entries and processed data sets
    #: of other versions are then not read (version 1: the operators of the
    #: data sets before this transform, the same values).
    version = 2

    def __init__(self, k: int = 128, hks_count: int = 16, spectral_basis: int = 0,
                 gradients: bool = False, laplacian: str = 'auto',
                 cache_dir: str | Path | None = None, smoothing: int = 0,
                 farthest_point_ranks: bool = False):
        if k < 1 or hks_count < 1:
            raise ValueError(f"'k' and 'hks_count' must be positive, got {k} and "
                             f"{hks_count}")
        if not 0 <= spectral_basis <= k:
            raise ValueError(f"'spectral_basis' must be in [0, k={k}], got "
                             f"{spectral_basis}")
        if laplacian not in LAPLACIANS:
            raise ValueError(f"Unknown Laplacian '{laplacian}'; expected one of "
                             f"{LAPLACIANS}")
        self.k = k
        self.hks_count = hks_count
        self.spectral_basis = spectral_basis
        self.gradients = gradients
        self.laplacian = laplacian
        self.smoothing = smoothing_rounds(smoothing, 'smoothing')
        self.farthest_point_ranks = farthest_point_ranks
        self.cache = OperatorCache(cache_dir)

    @property
    def settings(self) -> dict[str, Any]:
        """The settings that determine the output (``smoothing`` and
        ``farthest_point_ranks`` where set, so that the keys and names of
        the operators without them stay as they were)."""
        settings = dict(k=self.k, hks_count=self.hks_count,
                        spectral_basis=self.spectral_basis,
                        gradients=self.gradients, laplacian=self.laplacian)
        if self.smoothing:
            settings['smoothing'] = self.smoothing
        if self.farthest_point_ranks:
            settings['farthest_point_ranks'] = True
        return settings

    @property
    def tag(self) -> str:
        """The settings and :attr:`version` in a name for files and folders,
        e.g. ``v2_k128_hks16_auto_basis128_grad`` (``_taubin2`` after it with
        ``smoothing=2``, then ``_fps`` with ``farthest_point_ranks``)."""
        tag = f'v{self.version}_k{self.k}_hks{self.hks_count}_{self.laplacian}'
        if self.spectral_basis:
            tag += f'_basis{self.spectral_basis}'
        if self.gradients:
            tag += '_grad'
        if self.smoothing:
            tag += f'_taubin{self.smoothing}'
        return f'{tag}_fps' if self.farthest_point_ranks else tag

    def forward(self, data: Data) -> Data:
        name = str(data.name) if 'name' in data else 'mesh'
        if data.pos is None or data.face is None:
            raise MeshError(f"{name}: needs 'pos' [V, 3] and 'face' [3, F]")
        if data.face.dim() != 2 or data.face.size(0) != 3:
            raise MeshError(f"{name}: 'face' must have shape [3, F], got "
                            f"{list(data.face.shape)}")
        face = data.face.detach().cpu().long()
        raw = data.pos.detach().cpu().double().numpy()
        check_mesh(raw, face.t().numpy(), name)
        pos = normalize_positions(raw).astype(np.float32)  # what the models see
        data.pos = torch.from_numpy(pos)
        data.edge_index = _mesh_edge_index(face, len(pos))
        # The operators of those positions (float32, computed in float64).
        for key, value in self.operators(pos.astype(np.float64),
                                         face.t().numpy(), name).items():
            data[key] = value
        data.x = data.hks
        return data

    def operators(self, pos: np.ndarray, face: np.ndarray,
                  name: str = 'mesh') -> dict[str, Tensor]:
        """``hks``, ``mass`` and, where kept, ``evals``, ``evecs``,
        ``grad_index``, ``grad_weight``, ``farthest_point_rank`` of a mesh
        ``(pos [V, 3] float64, face [F, 3] int64)`` whose positions are
        normalised, from the cache where it holds them."""
        key = operator_cache_key(pos, face, {'version': self.version,
                                             **self.settings})
        entry = self.cache.load(key)
        if entry is None:
            with threadpool_limits(1):
                entry = self._compute(pos, face, name)
            self.cache.save(key, entry)
        return entry

    def _compute(self, pos: np.ndarray, face: np.ndarray,
                 name: str) -> dict[str, Tensor]:
        out = {}
        if self.farthest_point_ranks:  # of the float32 positions, unsmoothed
            out['farthest_point_rank'] = point_sets.farthest_point_ranks(
                torch.from_numpy(pos).float())
        pos = taubin_smoothing(pos, face, self.smoothing)
        L, mass, _ = laplacian(pos, face, self.laplacian)
        evals, evecs = eigendecomposition(L, mass, self.k, name)
        missing = self.k - len(evals)
        if missing > 0:  # V <= k: pad (see the class docstring)
            evals = np.concatenate([evals, np.full(missing, evals[-1])])
            evecs = np.pad(evecs, ((0, 0), (0, missing)))
        hks = heat_kernel_signature(evals, evecs, self.hks_count)
        out['hks'] = torch.from_numpy(hks).float()
        out['mass'] = torch.from_numpy(mass).float()
        if self.spectral_basis:
            basis = self.spectral_basis
            out['evals'] = torch.from_numpy(evals[None, :basis]).float()  # [1, m]
            out['evecs'] = torch.from_numpy(evecs[:, :basis]).float()  # [V, m]
        if self.gradients:
            index, weight = gradient_coefficients(*gradient_operators(pos, face))
            out['grad_index'] = torch.from_numpy(index)  # [2, nnz]
            out['grad_weight'] = torch.from_numpy(weight).float()  # [nnz, 2]
        return out

    def __repr__(self) -> str:
        settings = ', '.join(f'{key}={value!r}'
                             for key, value in self.settings.items())
        return f'{self.__class__.__name__}({settings})'


def _mesh_edge_index(face: Tensor, num_nodes: int) -> Tensor:
    """The undirected edges of the triangles ``face`` ``[3, F]``, both
    directions, sorted, without self-loops (of degenerate triangles)."""
    sides = torch.cat([face[[0, 1]], face[[1, 2]], face[[2, 0]]], dim=1)
    edge_index, _ = remove_self_loops(sides)
    return to_undirected(edge_index, num_nodes=num_nodes)

