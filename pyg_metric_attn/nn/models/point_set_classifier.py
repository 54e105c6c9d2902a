r"""Classification of whole point sets: attention within each set, then a
pooling module, then an MLP."""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.nn.models import MLP
from torch_geometric.typing import OptTensor

from pyg_metric_attn.utils.point_sets import propagate_within_sets


class PointSetClassifier(torch.nn.Module):
    r"""One class per point set (a point cloud, a graph without edges):

    .. math::
        H^{(0)} = \sigma(X W_{in}), \qquad
        H^{(l)} = \sigma(\mathrm{conv}_l(H^{(l-1)})), \qquad
        \mathbf{g}_s = \mathrm{pool}(\{\mathbf{h}^{(L)}_i : i \in s\}),
        \qquad \mathbf{y}_s = \mathrm{MLP}(\mathbf{g}_s),

    every layer attending among all points of each set
    (:func:`~pyg_metric_attn.utils.point_sets.propagate_within_sets`: the
    dense kernel of :class:`~pyg_metric_attn.nn.MetricAttentionConv`, or any
    PyG layer on the sets' all-pairs edges). The pooling is a module, as
    :class:`~torch_geometric.nn.conv.GPSConv` takes its ``conv``: any PyG
    :class:`~torch_geometric.nn.aggr.Aggregation`, e.g.
    :class:`~pyg_metric_attn.nn.MetricAttentionalAggregation`,
    :class:`~torch_geometric.nn.aggr.MeanAggregation` or
    :class:`~torch_geometric.nn.aggr.AttentionalAggregation`.

    Args:
        in_channels (int): Size of each point's features.
        hidden_channels (int): Width of the points' features, and of the
            MLP's hidden layer.
        out_channels (int): Number of classes.
        convs (sequence of torch.nn.Module): The attention layers, each
            mapping ``hidden_channels`` to ``hidden_channels`` features
            (may be empty: a PointNet-style model).
        pool (torch.nn.Module): Pools the points of each set, called as
            ``pool(h, batch, dim_size=num_sets)``.
        pool_channels (int, optional): Size of ``pool``'s output per set,
            e.g. :math:`kC` for a
            :class:`~pyg_metric_attn.nn.MetricAttentionalAggregation` of
            :math:`k` queries that concatenates them.
            (default: :obj:`hidden_channels`)
        act (callable, optional): The activation :math:`\sigma` (also the
            MLP's). (default: :func:`torch.relu`)

    Shapes:
        - **input:** point features :math:`(N, F_{in})`, ``batch``
          :math:`(N)` (sorted set index; :obj:`None`: one set), optional
          ``num_sets`` :math:`B` (sets without points get the MLP's output
          of the pooling's empty-set value)
        - **output:** class logits :math:`(B, F_{out})`
    """
    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 convs: Sequence[torch.nn.Module], pool: torch.nn.Module,
                 pool_channels: int | None = None,
                 act: Callable[[Tensor], Tensor] = torch.relu):
        super().__init__()
        if not isinstance(pool, torch.nn.Module):
            raise TypeError(f"'pool' must be a module (e.g. a PyG "
                            f"Aggregation), got {type(pool).__name__}")
        for index, conv in enumerate(convs):
            if not isinstance(conv, torch.nn.Module):
                raise TypeError(f"'convs[{index}]' must be a module, got "
                                f"{type(conv).__name__}")
        self.pool_channels = pool_channels or hidden_channels
        self.act = act
        self.lin_in = Linear(in_channels, hidden_channels)
        self.convs = torch.nn.ModuleList(convs)
        self.pool = pool
        self.mlp = MLP([self.pool_channels, hidden_channels, out_channels],
                       act=act, norm=None)

    def reset_parameters(self) -> None:
        self.lin_in.reset_parameters()
        for conv in self.convs:
            conv.reset_parameters()
        if hasattr(self.pool, 'reset_parameters'):
            self.pool.reset_parameters()
        self.mlp.reset_parameters()

    def forward(self, x: Tensor, batch: OptTensor = None,
                num_sets: int | None = None) -> Tensor:
        """Class logits per set."""
        h = self.act(self.lin_in(x))                            # [N, hidden]
        edge_index = None
        for conv in self.convs:
            h, edge_index = propagate_within_sets(conv, h, batch, edge_index)
            h = self.act(h)                                     # [N, hidden]
        pooled = self.pool(h, batch, dim_size=num_sets)         # [B, pool]
        if pooled.dim() != 2 or pooled.size(1) != self.pool_channels:
            raise ValueError(f"'pool' ({type(self.pool).__name__}) gave "
                             f"{list(pooled.shape)} but the classifier takes "
                             f"[num_sets, {self.pool_channels}]: set "
                             f"'pool_channels' to its output size")
        return self.mlp(pooled)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.lin_in.in_channels}, '
                f'{self.lin_in.out_channels}, {self.mlp.out_channels}, '
                f'num_layers={len(self.convs)}, pool={self.pool})')
