r"""DiffusionNet (Sharp, Attaiki, Crane & Ovsjanikov, ACM TOG 2022): learned
heat diffusion, spatial gradient features and per-vertex MLPs, the baseline
of the mesh tasks, written from the paper's description with this library's
:class:`~pyg_metric_attn.nn.HeatDiffusion` and
:class:`~pyg_metric_attn.nn.SpatialGradientFeatures`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.nn import Dropout, ReLU, Sequential
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.nn.inits import reset
from torch_geometric.typing import OptTensor

from pyg_metric_attn.nn.heat_diffusion import HeatDiffusion, MeshSpectrum
from pyg_metric_attn.nn.models.model_config import model_config
from pyg_metric_attn.nn.spatial_gradient import (
    SpatialGradientFeatures,
    TangentGradient,
)


class DiffusionNetBlock(torch.nn.Module):
    r"""One residual DiffusionNet block,

    .. math::
        \mathbf{u} &= \mathrm{HeatDiffusion}(\mathbf{h})
            = \Phi \, e^{-t_c \Lambda} \, \Phi^{\top} M \, \mathbf{h}_c
            \ \text{per channel } c, \\
        \mathbf{w}_i &= \tanh\left(\mathrm{Re}\left(\overline{\nabla
            \mathbf{u}_i} \odot A \, \nabla \mathbf{u}_i\right)\right), \\
        \mathbf{h}_i &\leftarrow \mathbf{h}_i + \mathrm{MLP}\left(
            [\mathbf{h}_i \,\|\, \mathbf{u}_i \,\|\, \mathbf{w}_i]\right),

    with :math:`\nabla \mathbf{u}_i \in \mathbb{C}^C` the tangent gradients
    of the diffused channels at vertex :math:`i` as complex numbers,
    :math:`A` a learned complex :math:`C \times C` matrix
    (:class:`~pyg_metric_attn.nn.SpatialGradientFeatures`) and the MLP
    shared by all vertices: ``Linear(3C, C) -> ReLU -> Dropout ->
    Linear(C, C) -> ReLU -> Dropout -> Linear(C, C)``. The diffusion times
    :math:`t_c` are learned (:class:`~pyg_metric_attn.nn.HeatDiffusion`).

    Args:
        channels (int): Width :math:`C`.
        dropout (float): Dropout in the MLP. (default: :obj:`0.5`)
        gradient_features (bool): Add the gradient features :math:`\mathbf{w}`
            (without them the MLP reads :math:`[\mathbf{h} \| \mathbf{u}]`).
            (default: :obj:`True`)

    Shapes:
        - **input:** vertex features :math:`(N, C)`, the meshes'
          :class:`~pyg_metric_attn.nn.heat_diffusion.MeshSpectrum` and
          :class:`~pyg_metric_attn.nn.spatial_gradient.TangentGradient`
        - **output:** vertex features :math:`(N, C)`
    """
    def __init__(self, channels: int, dropout: float = 0.5,
                 gradient_features: bool = True):
        super().__init__()
        self.diffusion = HeatDiffusion(channels)
        self.gradient_features = (SpatialGradientFeatures(channels)
                                  if gradient_features else None)
        inputs = (3 if gradient_features else 2) * channels
        self.mlp = Sequential(Linear(inputs, channels), ReLU(), Dropout(dropout),
                              Linear(channels, channels), ReLU(),
                              Dropout(dropout), Linear(channels, channels))

    def reset_parameters(self) -> None:
        for child in self.children():
            reset(child)

    def forward(self, h: Tensor, spectrum: MeshSpectrum,
                gradient: TangentGradient | None = None) -> Tensor:
        diffused = self.diffusion.diffuse(h, spectrum)
        features = [h, diffused]
        if self.gradient_features is not None:
            if gradient is None:
                raise ValueError("A DiffusionNet block with gradient features "
                                 "needs the meshes' 'grad_index' and "
                                 "'grad_weight': preprocess them with "
                                 "MeshPreprocessing(gradients=True)")
            features.append(self.gradient_features(gradient.apply(diffused)))
        return h + self.mlp(torch.cat(features, dim=-1))


@dataclass(frozen=True)
class DiffusionNetConfig:
    r"""The architecture of a :class:`DiffusionNet`, everything but its input
    and output widths (defaults: the paper's segmentation network).

    Args:
        hidden_channels (int): Width :math:`C`. (default: :obj:`128`)
        num_layers (int): Blocks. (default: :obj:`4`)
        dropout (float): Dropout in the blocks' MLPs. (default: :obj:`0.5`)
        gradient_features (bool): Spatial gradient features in every block.
            (default: :obj:`True`)
    """
    hidden_channels: int = 128
    num_layers: int = 4
    dropout: float = 0.5
    gradient_features: bool = True

    def __post_init__(self) -> None:
        for name in ('hidden_channels', 'num_layers'):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"'{name}' must be a positive integer, got "
                                 f"{value!r}")
        if not 0 <= self.dropout < 1:
            raise ValueError(f"'dropout' must be in [0, 1), got {self.dropout!r}")


class DiffusionNet(torch.nn.Module):
    r"""DiffusionNet (Sharp et al. 2022): ``Linear`` :math:`\to`
    ``num_layers`` :class:`DiffusionNetBlock` :math:`\to` ``Linear``,
    per-vertex outputs,

    .. math::
        \mathbf{h}^{(0)} = X W_{in}, \qquad
        \mathbf{h}^{(l)} = \mathrm{Block}_l(\mathbf{h}^{(l-1)}), \qquad
        Y = \mathbf{h}^{(L)} W_{out}.

    The network sees the surface only through its operators: the Laplacian
    eigenpairs of the diffusion and the tangent gradient operators (as
    :class:`~pyg_metric_attn.transforms.MeshPreprocessing` stores them with
    ``spectral_basis > 0`` and ``gradients=True``), so with intrinsic inputs
    (heat kernel signatures) its outputs do not depend on the mesh's pose,
    its vertex numbering or, approximately, its discretisation.

    Args:
        in_channels (int): Input features per vertex.
        out_channels (int): Outputs per vertex (e.g. classes).
        config (DiffusionNetConfig, optional): The architecture.
            (default: :obj:`DiffusionNetConfig()`)
        **kwargs (optional): Fields of :class:`DiffusionNetConfig` that
            replace those of ``config``, e.g. ``hidden_channels=64``.

    Shapes:
        - **input:** vertex features :math:`(N, F_{in})`, ``evecs``
          :math:`(N, m)`, ``evals`` :math:`(B, m)`, ``mass`` :math:`(N)`,
          ``grad_index`` :math:`(2, nnz)`, ``grad_weight`` :math:`(nnz, 2)`
          *(optional without gradient features)*, ``batch`` :math:`(N)`
          *(optional)*
        - **output:** vertex outputs :math:`(N, F_{out})`
    """
    #: The keyword arguments of :meth:`forward` that a batch of meshes
    #: prepared by :class:`~pyg_metric_attn.transforms.MeshPreprocessing`
    #: carries under the same names (how a task feeds any mesh model).
    mesh_inputs = ('evecs', 'evals', 'mass', 'grad_index', 'grad_weight',
                   'batch')

    def __init__(self, in_channels: int, out_channels: int,
                 config: DiffusionNetConfig | None = None, **kwargs: Any):
        super().__init__()
        config = model_config(DiffusionNetConfig, config, kwargs, 'DiffusionNet')
        self.config = config
        self.in_channels, self.out_channels = in_channels, out_channels
        self.lin_in = Linear(in_channels, config.hidden_channels)
        self.blocks = torch.nn.ModuleList([
            DiffusionNetBlock(config.hidden_channels, config.dropout,
                              config.gradient_features)
            for _ in range(config.num_layers)
        ])
        self.lin_out = Linear(config.hidden_channels, out_channels)

    def reset_parameters(self) -> None:
        for child in self.children():
            reset(child)

    def forward(self, x: Tensor, evecs: Tensor, evals: Tensor, mass: Tensor,
                grad_index: OptTensor = None, grad_weight: OptTensor = None,
                batch: OptTensor = None) -> Tensor:
        spectrum = MeshSpectrum.from_batch(evecs, evals, mass, batch)
        gradient = None  # checked once, shared by every block
        if grad_index is not None and grad_weight is not None:
            gradient = TangentGradient.from_batch(grad_index, grad_weight,
                                                  x.size(0))
        h = self.lin_in(x)
        for block in self.blocks:
            h = block(h, spectrum, gradient)
        return self.lin_out(h)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.in_channels}, '
                f'{self.out_channels}, {self.config})')
