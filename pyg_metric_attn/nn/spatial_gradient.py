r"""Tangent-plane gradients of vertex features and DiffusionNet's rotation
invariant features built from them."""
from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor
from torch.nn import Linear

from pyg_metric_attn.utils.csr import _csr_matrix


class TangentGradient(NamedTuple):
    r"""The tangent gradient operators of a batch of meshes, checked and
    assembled once so that every block of a network applies them without
    doing so again.

    :math:`G^{(x)}, G^{(y)}` are given as one list of nonzeros: ``index``
    ``[2, nnz]`` (rows, columns) and ``weight`` ``[nnz, 2]`` (the :math:`x`
    and :math:`y` coefficients), as
    :class:`~pyg_metric_attn.transforms.MeshPreprocessing` stores them with
    ``gradients=True`` (``grad_index``, ``grad_weight``; batched meshes:
    block diagonal), and applied as one sparse CSR matrix
    :math:`[G^{(x)}; G^{(y)}]` of shape ``[2N, N]`` (a sparse product, in
    float32: far faster than gathering every nonzero's features).
    """
    index: Tensor  #: ``[2, nnz]``
    weight: Tensor  #: ``[nnz, 2]``
    operator: Tensor  #: :math:`[G^{(x)}; G^{(y)}]`, CSR ``[2N, N]`` float32

    @classmethod
    def from_batch(cls, grad_index: Tensor, grad_weight: Tensor,
                   num_nodes: int) -> TangentGradient:
        """Checks the shapes and that every index is below ``num_nodes``,
        then assembles the operator."""
        if grad_index.dim() != 2 or grad_index.size(0) != 2:
            raise ValueError(f"'grad_index' must have shape [2, nnz], got "
                             f"{list(grad_index.shape)}")
        if grad_weight.shape != (grad_index.size(1), 2):
            raise ValueError(f"'grad_weight' must have shape "
                             f"[{grad_index.size(1)}, 2], got "
                             f"{list(grad_weight.shape)}")
        if grad_index.numel() and int(grad_index.max()) >= num_nodes:
            raise IndexError(f"'grad_index' refers to vertex "
                             f"{int(grad_index.max())} but there are "
                             f"{num_nodes} rows")
        if grad_index.numel() and int(grad_index.min()) < 0:
            raise IndexError(f"'grad_index' holds the negative index "
                             f"{int(grad_index.min())}")
        row, col = grad_index
        rows = torch.cat([row, row + num_nodes])  # G^(x) above G^(y)
        cols = torch.cat([col, col])
        order = torch.argsort(rows * num_nodes + cols)  # by row, then column
        rows, cols = rows[order], cols[order]
        crow = torch.searchsorted(rows, torch.arange(
            2 * num_nodes + 1, device=rows.device, dtype=rows.dtype))
        values = grad_weight.t().reshape(-1).float()[order]
        operator = _csr_matrix(crow, cols, values, (2 * num_nodes, num_nodes))
        return cls(grad_index, grad_weight, operator)

    def apply(self, h: Tensor) -> Tensor:
        r""":math:`g_{i,a,c} = \sum_j G^{(a)}_{ij} h_{j,c}`: ``[N, C]`` to
        ``[N, 2, C]``."""
        num_nodes = self.operator.size(1)
        if h.dim() != 2 or h.size(0) != num_nodes:
            raise ValueError(f"'h' must have shape [{num_nodes}, C], got "
                             f"{list(h.shape)}")
        # float32 throughout, also under autocast (sparse kernels take no
        # mixed dtypes).
        with torch.autocast(h.device.type, enabled=False):
            out = self.operator @ h.float()  # [2N, C]
        return out.view(2, num_nodes, -1).transpose(0, 1).to(h.dtype)


def vertex_gradients(h: Tensor, grad_index: Tensor, grad_weight: Tensor) -> Tensor:
    r"""Gradient of every feature channel in each vertex's tangent frame,

    .. math::
        g_{i,a,c} = \sum_j G^{(a)}_{ij} \, h_{j,c}, \qquad a \in \{x, y\},

    with the operators as :class:`TangentGradient` stores them. Returns
    ``[N, 2, C]``.
    """
    if h.dim() != 2:
        raise ValueError(f"'h' must have shape [N, C], got {list(h.shape)}")
    return TangentGradient.from_batch(grad_index, grad_weight,
                                      h.size(0)).apply(h)


class SpatialGradientFeatures(torch.nn.Module):
    r"""Rotation-invariant features of tangent gradients (Sharp et al. 2022),

    .. math::
        \mathbf{f}_i = \tanh\left(\mathrm{Re}\left(\overline{\mathbf{g}_i}
        \odot A \mathbf{g}_i\right)\right),

    where :math:`\mathbf{g}_i = g_{i,x} + \mathrm{i}\, g_{i,y} \in
    \mathbb{C}^C` are the channels' gradients at vertex :math:`i` as complex
    numbers and :math:`A = A_{re} + \mathrm{i}\, A_{im}` a learned complex
    :math:`C \times C` matrix. Rotating a vertex's tangent frame multiplies
    :math:`\mathbf{g}_i` by a unit complex number, which cancels: the features
    do not depend on the arbitrary frame, yet see the directions of the
    gradients relative to each other.

    Args:
        channels (int): Feature channels :math:`C`.
    """
    def __init__(self, channels: int):
        super().__init__()
        self.channels = channels
        self.real = Linear(channels, channels, bias=False)
        self.imag = Linear(channels, channels, bias=False)

    def reset_parameters(self) -> None:
        self.real.reset_parameters()
        self.imag.reset_parameters()

    def forward(self, gradients: Tensor) -> Tensor:
        """``gradients`` ``[N, 2, C]`` (:func:`vertex_gradients`) to
        ``[N, C]``."""
        if gradients.dim() != 3 or gradients.shape[1:] != (2, self.channels):
            raise ValueError(f"'gradients' must have shape [N, 2, "
                             f"{self.channels}], got {list(gradients.shape)}")
        gx, gy = gradients.unbind(1)
        ax = self.real(gx) - self.imag(gy)
        ay = self.real(gy) + self.imag(gx)
        return torch.tanh(gx * ax + gy * ay)

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}({self.channels})'
