r"""Heat diffusion on meshes in a truncated Laplacian eigenbasis."""
from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.nn import Parameter
from torch_geometric.typing import OptTensor
from torch_geometric.utils import to_dense_batch


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
        num_nodes = h.size(0)
        if h.dim() != 2 or h.size(1) != self.channels:
            raise ValueError(f"'h' must have shape [N, {self.channels}], got "
                             f"{list(h.shape)}")
        if evecs.dim() != 2 or evecs.size(0) != num_nodes:
            raise ValueError(f"'evecs' must have shape [{num_nodes}, m], got "
                             f"{list(evecs.shape)}")
        if mass.shape != (num_nodes, ):
            raise ValueError(f"'mass' must have shape [{num_nodes}], got "
                             f"{list(mass.shape)}")
        if batch is None:
            batch = torch.zeros(num_nodes, dtype=torch.long, device=h.device)
        num_meshes = int(batch.max()) + 1 if num_nodes else 0
        if evals.shape != (num_meshes, evecs.size(1)):
            raise ValueError(f"'evals' must have shape [{num_meshes}, "
                             f"{evecs.size(1)}] (meshes, eigenpairs), got "
                             f"{list(evals.shape)}")
        if num_nodes == 0:
            return h
        weighted, mask = to_dense_batch(h * mass[:, None], batch)  # [B, V, C]
        basis, _ = to_dense_batch(evecs, batch)  # [B, V, m]; padding rows 0
        spectrum = basis.transpose(1, 2) @ weighted  # [B, m, C]
        decay = torch.exp(-evals[:, :, None] * self.log_time.exp())
        return (basis @ (decay * spectrum))[mask]

    def extra_repr(self) -> str:
        return (f'{self.channels}, min_time={self.min_time}, '
                f'max_time={self.max_time}')
