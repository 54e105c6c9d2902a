"""PyG transforms for triangle meshes (``data.pos`` ``[V, 3]``, ``data.face``
``[3, F]``)."""
from __future__ import annotations

from pathlib import Path

import torch
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform
from torch_geometric.utils import to_dense_batch

from pyg_metric_attn.geometry.cache import OperatorCache
from pyg_metric_attn.geometry.mesh import normalize_positions
from pyg_metric_attn.geometry.operators import mesh_operators
from pyg_metric_attn.geometry.spectral import hks_times


class NormalizeMesh(BaseTransform):
    r"""Centres ``data.pos`` on the vertex mean and scales it to unit maximum
    radius (see :func:`~pyg_metric_attn.geometry.normalize_positions`)."""
    def forward(self, data: Data) -> Data:
        pos = normalize_positions(data.pos.double().numpy())
        data.pos = torch.from_numpy(pos).to(data.pos.dtype)
        return data


class MeshOperators(BaseTransform):
    r"""Adds DiffusionNet's per-mesh operators (see
    :func:`~pyg_metric_attn.geometry.mesh_operators`) as attributes: those named
    in ``keep`` among ``'hks'`` ``[V, hks_count]``, ``'mass'`` ``[V]``,
    ``'evals'`` ``[1, k]``, ``'evecs'`` ``[V, k]``, ``'frames'``, and the
    sparse ``'laplacian'``, ``'grad_x'``, ``'grad_y'``.

    Args:
        k (int): Number of eigenpairs. (default: :obj:`128`)
        hks_count (int): Number of heat kernel signature scales.
            (default: :obj:`16`)
        gradients (bool): Also compute tangent frames and gradient operators.
        laplacian (str): ``'auto'``, ``'cotan'`` or ``'robust'``.
        cache_dir (str or Path, optional): Content-keyed operator cache.
        keep (tuple of str): Which operators to attach.
            (default: :obj:`('hks', 'mass')`)
    """
    def __init__(self, k: int = 128, hks_count: int = 16, gradients: bool = False,
                 laplacian: str = 'auto', cache_dir: str | Path | None = None,
                 keep: tuple[str, ...] = ('hks', 'mass')):
        self.k = k
        self.hks_count = hks_count
        self.gradients = gradients
        self.laplacian = laplacian
        self.cache = OperatorCache(cache_dir)
        self.keep = tuple(keep)

    def forward(self, data: Data) -> Data:
        operators = mesh_operators(
            data.pos.double().numpy(), data.face.t().numpy(), self.k,
            self.hks_count, self.gradients, self.laplacian,
            name=str(getattr(data, 'name', 'mesh')), cache=self.cache)
        for key in self.keep:
            if key not in operators:
                raise KeyError(f"Unknown operator '{key}'; computed: "
                               f"{sorted(operators)}")
            value = operators[key]
            data[key] = value.unsqueeze(0) if key == 'evals' else value
        return data

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}(k={self.k}, '
                f'hks_count={self.hks_count}, gradients={self.gradients}, '
                f'laplacian={self.laplacian!r}, keep={self.keep})')


class RandomRotation(BaseTransform):
    r"""Rotates ``data.pos`` by a uniformly random rotation of :math:`SO(3)`
    (QR of a Gaussian matrix, sign-corrected), e.g. to augment ``xyz`` inputs."""
    def __init__(self, generator: torch.Generator | None = None):
        self.generator = generator

    def forward(self, data: Data) -> Data:
        data.pos = data.pos @ random_rotation(self.generator).to(data.pos.dtype).T
        return data


def random_rotation(generator: torch.Generator | None = None) -> torch.Tensor:
    """A uniformly random ``3 x 3`` rotation matrix."""
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=generator,
                                       dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    if torch.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def rescaled_heat_kernel_signatures(evals: torch.Tensor, evecs: torch.Tensor,
                                    batch: torch.Tensor, scale: torch.Tensor,
                                    count: int = 16) -> torch.Tensor:
    r"""Heat kernel signatures of a batch of meshes at diffusion times
    stretched per mesh, :math:`h(v, t) = \sum_k e^{-\lambda_k s_b t}
    \phi_k(v)^2` with :math:`t` the ``count`` times of
    :func:`~pyg_metric_attn.geometry.hks_times` and :math:`s_b` the ``scale``
    of the vertex's mesh :math:`b` (:math:`s_b = 1` gives the stored HKS).

    Scaling a mesh by :math:`a` maps :math:`\lambda \to \lambda / a^2` and
    the mass-normalised :math:`\phi^2 \to \phi^2 / a^2`, so these are
    :math:`a^2` times the HKS of the mesh scaled by :math:`a = s^{-1/2}`:
    random scales augment HKS inputs with size changes (e.g. other people's
    proportions after normalisation) while keeping their range.

    Args:
        evals (torch.Tensor): Eigenvalues per mesh ``[B, K]``.
        evecs (torch.Tensor): Mass-orthonormal eigenvectors ``[V, K]``.
        batch (torch.Tensor): Mesh of every vertex ``[V]`` (sorted).
        scale (torch.Tensor): Positive time factor per mesh ``[B]``.
        count (int, optional): Number of HKS times. (default: :obj:`16`)
    """
    if evals.dim() != 2 or evecs.dim() != 2 or evals.size(1) != evecs.size(1):
        raise ValueError(f"Expected 'evals' [B, K] and 'evecs' [V, K], got "
                         f"{tuple(evals.shape)} and {tuple(evecs.shape)}")
    if scale.shape != (evals.size(0),) or not bool((scale > 0).all()):
        raise ValueError(f"'scale' must hold one positive factor per mesh "
                         f"({evals.size(0)}), got shape {tuple(scale.shape)}")
    times = torch.from_numpy(hks_times(count)).to(evals.dtype)
    decay = torch.exp(-(scale[:, None, None] * times[None, :, None])
                      * evals[:, None, :])  # [B, S, K]
    squared, mask = to_dense_batch(evecs.square(), batch,
                                   batch_size=evals.size(0))  # [B, V, K]
    return (squared @ decay.transpose(1, 2))[mask]
