r"""The information propagation network (IPN) of Ruan & Zhang (2024)."""
from __future__ import annotations

import copy
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.typing import Adj, OptTensor

from pyg_metric_attn.nn.conv import MetricAttentionConv
from pyg_metric_attn.utils.point_sets import propagate_within_sets

#: A propagation layer, or what builds one from ``(in_channels,
#: out_channels)`` (a layer class, or a :func:`functools.partial` of one).
ConvFactory = Callable[[int, int], torch.nn.Module]


class IPN(torch.nn.Module):
    r"""Linear :math:`\to` ``num_layers`` propagation layers :math:`\to`
    Linear, returning class logits (the paper's IPN):

    .. math::
        H^{(0)} = X W_{in}, \qquad H^{(l)} = \mathrm{conv}_l(H^{(l-1)}),
        \qquad Y = H^{(L)} W_{out}.

    With ``dropout > 0`` the inputs :math:`X` and the propagated
    :math:`H^{(L)}` pass through dropout in training (the inputs of the two
    linear maps, as GAT's network drops the inputs of its layers); the
    paper's IPN has none.

    The paper's propagation, and the default, is metric-attention without a
    value map, :math:`H' = S H`
    (``MetricAttentionConv(hidden_channels, hidden_channels, value=False)``).
    Any layer that maps ``hidden_channels`` to ``hidden_channels`` features
    may take its place, as :class:`~torch_geometric.nn.conv.GPSConv` takes
    ``conv``, e.g. ``conv=functools.partial(GATConv, heads=2, concat=False)``.

    On a graph the propagation follows ``edge_index``. On point sets (no
    ``edge_index``) every point attends to every point of its set, the sets
    being given by ``batch`` (the paper's Moon/MNIST setting): layers with a
    ``forward_point_sets`` method (:class:`MetricAttentionConv`) run their
    dense kernel, others run on the sets' all-pairs edges.

    Args:
        in_channels (int): Input feature size.
        hidden_channels (int): Width :math:`d_Q` of the propagated features.
        out_channels (int): Number of classes.
        num_layers (int, optional): Number of propagation layers.
            (default: :obj:`1`)
        conv (torch.nn.Module or callable, optional): The propagation layer,
            or a factory called as ``conv(hidden_channels, hidden_channels)``
            once per layer. A module is the first layer; further layers are
            deep copies of it with their parameters reset.
            (default: the paper's
            ``partial(MetricAttentionConv, value=False)``)
        dropout (float, optional): Dropout probability of the inputs and of
            the propagated features before the output map.
            (default: :obj:`0.0`)

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F_{in})`, edge
          indices :math:`(2, |\mathcal{E}|)` *(optional)*, ``batch``
          :math:`(|\mathcal{V}|)` *(optional)*, edge features
          :math:`(|\mathcal{E}|, D_e)` *(optional)*
        - **output:** class logits :math:`(|\mathcal{V}|, F_{out})`
    """
    #: The keyword arguments of :meth:`forward` that a batch of meshes
    #: prepared by :class:`~pyg_metric_attn.transforms.MeshPreprocessing`
    #: carries under the same names (how a task feeds any mesh model).
    mesh_inputs = ('edge_index',)

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 num_layers: int = 1,
                 conv: torch.nn.Module | ConvFactory | None = None,
                 dropout: float = 0.0):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"'num_layers' must be at least 1, got {num_layers}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"'dropout' must be in [0, 1), got {dropout}")
        if conv is None:
            conv = partial(MetricAttentionConv, value=False)
        if not (isinstance(conv, torch.nn.Module) or callable(conv)):
            raise TypeError(f"'conv' must be a module or a callable that builds "
                            f"one from (in_channels, out_channels), got "
                            f"{type(conv).__name__}")
        if isinstance(conv, torch.nn.Module) and num_layers > 1 and not hasattr(
                conv, 'reset_parameters'):
            raise ValueError(f"{type(conv).__name__} has no 'reset_parameters', "
                             f"so its copies for 'num_layers={num_layers}' "
                             f"would share its initial weights: pass a factory "
                             f"that builds each layer")
        self.lin_in = Linear(in_channels, hidden_channels)
        self.convs = torch.nn.ModuleList(
            self._layers(conv, hidden_channels, num_layers))
        self.lin_out = Linear(hidden_channels, out_channels)
        self.dropout = dropout

    @staticmethod
    def _layers(conv: torch.nn.Module | ConvFactory, channels: int,
                num_layers: int) -> list[torch.nn.Module]:
        if not isinstance(conv, torch.nn.Module):
            return [conv(channels, channels) for _ in range(num_layers)]
        layers = [conv]
        for _ in range(num_layers - 1):
            layers.append(copy.deepcopy(conv))
            layers[-1].reset_parameters()
        return layers

    def reset_parameters(self) -> None:
        self.lin_in.reset_parameters()
        for conv in self.convs:
            conv.reset_parameters()
        self.lin_out.reset_parameters()

    def forward(self, x: Tensor, edge_index: Adj | None = None,
                batch: OptTensor = None, edge_attr: OptTensor = None) -> Tensor:
        """Class logits per node (or point)."""
        h = self.lin_in(F.dropout(x, self.dropout, self.training))
        if edge_index is None:
            h = self._propagate_point_sets(h, batch)
        else:
            for conv in self.convs:
                h = conv(h, edge_index) if edge_attr is None else conv(
                    h, edge_index, edge_attr=edge_attr)
        return self.lin_out(F.dropout(h, self.dropout, self.training))

    def _propagate_point_sets(self, h: Tensor, batch: OptTensor) -> Tensor:
        """All pairs per set: dense kernels where a layer has them, edges
        else."""
        edge_index = None
        for conv in self.convs:
            h, edge_index = propagate_within_sets(conv, h, batch, edge_index)
        return h

    def __repr__(self) -> str:
        dropout = f', dropout={self.dropout}' if self.dropout else ''
        return (f'{self.__class__.__name__}({self.lin_in.in_channels}, '
                f'{self.lin_in.out_channels}, {self.lin_out.out_channels}, '
                f'num_layers={len(self.convs)}, conv={self.convs[0]}{dropout})')
