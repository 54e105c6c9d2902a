r"""Heat diffusion on meshes in a truncated Laplacian eigenbasis."""
from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor
from torch.nn import Parameter
from torch_geometric.typing import OptTensor
from torch_geometric.utils import to_dense_batch


class MeshSpectrum(NamedTuple):
    r"""The eigenbases of a batch of meshes, padded to dense ``[B, V, m]``
    once so that every :class:`HeatDiffusion` of a network reuses them."""
    basis: Tensor  #: :math:`\Phi` ``[B, V, m]`` (padding rows zero)
    mass_basis: Tensor  #: :math:`M \Phi` ``[B, V, m]``
    evals: Tensor  #: :math:`\Lambda` ``[B, m]``
    batch: Tensor  #: mesh of every vertex ``[N]``

    @classmethod
    def from_batch(cls, evecs: Tensor, evals: Tensor, mass: Tensor,
                   batch: OptTensor = None) -> MeshSpectrum:
        """From the stacked ``evecs`` ``[N, m]``, ``evals`` ``[B, m]`` and
        ``mass`` ``[N]`` of the meshes (``batch``: sorted mesh index per
        vertex, :obj:`None` for one mesh)."""
        num_nodes = evecs.size(0)
        if evecs.dim() != 2:
            raise ValueError(f"'evecs' must have shape [N, m], got "
                             f"{list(evecs.shape)}")
        if mass.shape != (num_nodes, ):
            raise ValueError(f"'mass' must have shape [{num_nodes}], got "
                             f"{list(mass.shape)}")
        if batch is None:
            batch = torch.zeros(num_nodes, dtype=torch.long, device=evecs.device)
        if batch.shape != (num_nodes, ):
            raise ValueError(f"'batch' must have shape [{num_nodes}], got "
                             f"{list(batch.shape)}")
        num_meshes = int(batch.max()) + 1 if num_nodes else 0
        if evals.shape != (num_meshes, evecs.size(1)):
            raise ValueError(f"'evals' must have shape [{num_meshes}, "
                             f"{evecs.size(1)}] (meshes, eigenpairs), got "
                             f"{list(evals.shape)}")
        if num_nodes == 0:  # no meshes: nothing to pad
            empty = evecs.new_zeros(0, 0, evecs.size(1))
            return cls(empty, empty, evals, batch)
        basis, _ = to_dense_batch(evecs, batch, batch_size=num_meshes)
        mass_basis, _ = to_dense_batch(evecs * mass[:, None], batch,
                                       batch_size=num_meshes)
        return cls(basis, mass_basis, evals, batch)


class HeatDiffusion(torch.nn.Module):
    r"""Heat diffusion of every feature channel for a learned time,

    .. math::
        \mathbf{h}_c \leftarrow \Phi \, e^{-t_c \Lambda} \, \Phi^{\top}
        M \, \mathbf{h}_c,

    with :math:`L \Phi = M \Phi \Lambda` the first :math:`m` eigenpairs of the
    mesh's cotan Laplacian :math:`L` and lumped mass :math:`M`
    (:math:`\Phi^{\top} M \Phi = I`). With all eigenpairs this is
    :math:`e^{-t_c M^{-1} L} \mathbf{h}_c`, the heat kernel whose
    :math:`\exp(-d^2 / t)` form metric-attention learns in feature space
    (the spectral diffusion of DiffusionNet, Sharp et al. 2022).

    The times :math:`t_c = \exp(s_c)` are learned, initialised log-spaced
    over ``[min_time, max_time]`` across the channels.

    Args:
        channels (int): Feature channels, each with its own time.
        min_time (float): Smallest initial time. (default: :obj:`1e-3`)
        max_time (float): Largest initial time. (default: :obj:`1e-1`)
    """
    def __init__(self, channels: int, min_time: float = 1e-3,
                 max_time: float = 1e-1):
        super().__init__()
        if not 0 < min_time <= max_time:
            raise ValueError(f"Need 0 < 'min_time' <= 'max_time', got "
                             f"{min_time} and {max_time}")
        self.channels = channels
        self.min_time, self.max_time = min_time, max_time
        self.log_time = Parameter(torch.empty(channels))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.log_time.copy_(torch.linspace(math.log(self.min_time),
                                               math.log(self.max_time),
                                               self.channels))

    @property
    def times(self) -> Tensor:
        r"""The diffusion time :math:`t_c` of every channel ``[channels]``."""
        return self.log_time.exp()

    def forward(self, h: Tensor, evecs: Tensor, evals: Tensor, mass: Tensor,
                batch: OptTensor = None) -> Tensor:
        r"""
        Args:
            h (torch.Tensor): Vertex features ``[N, channels]``.
            evecs (torch.Tensor): :math:`\Phi` of every mesh, stacked
                ``[N, m]``.
            evals (torch.Tensor): :math:`\Lambda` per mesh ``[B, m]``.
            mass (torch.Tensor): Lumped vertex masses ``[N]``.
            batch (torch.Tensor, optional): Mesh of every vertex (sorted);
                :obj:`None`: one mesh.
        """
        return self.diffuse(h, MeshSpectrum.from_batch(evecs, evals, mass, batch))

    def diffuse(self, h: Tensor, spectrum: MeshSpectrum) -> Tensor:
        """The diffusion of ``h`` ``[N, channels]`` on meshes whose
        :class:`MeshSpectrum` is prepared (once per batch, for every layer)."""
        if h.dim() != 2 or h.size(1) != self.channels:
            raise ValueError(f"'h' must have shape [N, {self.channels}], got "
                             f"{list(h.shape)}")
        if h.size(0) != spectrum.batch.numel():
            raise ValueError(f"'h' has {h.size(0)} vertices, the spectrum "
                             f"{spectrum.batch.numel()}")
        if h.size(0) == 0:
            return h
        dense, mask = to_dense_batch(h, spectrum.batch,
                                     max_num_nodes=spectrum.basis.size(1),
                                     batch_size=spectrum.basis.size(0))
        coefficients = spectrum.mass_basis.transpose(1, 2) @ dense  # [B, m, C]
        decay = torch.exp(-spectrum.evals[:, :, None] * self.times)
        return (spectrum.basis @ (decay * coefficients))[mask]

    def extra_repr(self) -> str:
        return (f'{self.channels}, min_time={self.min_time}, '
                f'max_time={self.max_time}')
