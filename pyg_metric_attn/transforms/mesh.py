"""Augmentations of meshes: random rotations of the positions, heat kernel
signatures at stretched times."""
from __future__ import annotations

import torch
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform
from torch_geometric.utils import to_dense_batch

from pyg_metric_attn.geometry.spectral import HKS_MIN_TIME, hks_times


class RandomRotation(BaseTransform):
    r"""Rotates ``data.pos`` by a uniformly random rotation of :math:`SO(3)`
    (QR of a Gaussian matrix, sign-corrected), e.g. to augment ``xyz`` inputs."""
    def __init__(self, generator: torch.Generator | None = None):
        self.generator = generator

    def forward(self, data: Data) -> Data:
        data.pos = data.pos @ random_rotation(self.generator).to(data.pos.dtype).T
        return data


def random_rotation(generator: torch.Generator | None = None,
                    axis: int | None = None) -> torch.Tensor:
    """A uniformly random ``3 x 3`` rotation matrix: of :math:`SO(3)`, or
    about the coordinate axis ``axis`` (``0``, ``1``, ``2``: x, y, z) by a
    uniform angle (DiffusionNet's augmentation about the up axis)."""
    if axis is not None:
        if axis not in (0, 1, 2):
            raise ValueError(f"'axis' must be 0, 1 or 2 (x, y, z), got {axis!r}")
        angle = 2 * torch.pi * torch.rand((), generator=generator,
                                          dtype=torch.float64)
        cos, sin = torch.cos(angle), torch.sin(angle)
        first, second = [a for a in range(3) if a != axis]
        rotation = torch.eye(3, dtype=torch.float64)
        rotation[first, first] = rotation[second, second] = cos
        rotation[first, second], rotation[second, first] = -sin, sin
        return rotation
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=generator,
                                       dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    if torch.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q


def rescaled_heat_kernel_signatures(evals: torch.Tensor, evecs: torch.Tensor,
                                    batch: torch.Tensor | None,
                                    scale: torch.Tensor,
                                    count: int = 16,
                                    min_time: float = HKS_MIN_TIME
                                    ) -> torch.Tensor:
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
        batch (torch.Tensor, optional): Mesh of every vertex ``[V]``
            (sorted; :obj:`None`: all vertices are one mesh's).
        scale (torch.Tensor): Positive time factor per mesh ``[B]``.
        count (int, optional): Number of HKS times. (default: :obj:`16`)
        min_time (float, optional): The shortest of them (the longest is 1).
            (default: :obj:`1e-2`)
    """
    if evals.dim() != 2 or evecs.dim() != 2 or evals.size(1) != evecs.size(1):
        raise ValueError(f"Expected 'evals' [B, K] and 'evecs' [V, K], got "
                         f"{tuple(evals.shape)} and {tuple(evecs.shape)}")
    if scale.shape != (evals.size(0),) or not bool((scale > 0).all()):
        raise ValueError(f"'scale' must hold one positive factor per mesh "
                         f"({evals.size(0)}), got shape {tuple(scale.shape)}")
    times = torch.from_numpy(hks_times(count, min_time)).to(evals.dtype)
    decay = torch.exp(-(scale[:, None, None] * times[None, :, None])
                      * evals[:, None, :])  # [B, S, K]
    squared, mask = to_dense_batch(evecs.square(), batch,
                                   batch_size=evals.size(0))  # [B, V, K]
    return (squared @ decay.transpose(1, 2))[mask]
