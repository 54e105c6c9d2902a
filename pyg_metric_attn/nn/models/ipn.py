r"""The information propagation network (IPN) of Ruan & Zhang (2024)."""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from torch_geometric.nn import GATConv, GATv2Conv, TransformerConv
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.typing import Adj, OptTensor

from pyg_metric_attn.nn.conv import MetricAttentionConv
from pyg_metric_attn.nn.pseudo_metric import METRICS
from pyg_metric_attn.utils.point_sets import fully_connected_edge_index

PYG_ATTENTIONS = {'gat': GATConv, 'gatv2': GATv2Conv, 'transformer': TransformerConv}
ATTENTIONS: tuple[str, ...] = METRICS + tuple(PYG_ATTENTIONS)


def attention_conv(attention: str, in_channels: int, out_channels: int,
                   heads: int = 1, concat: bool = True,
                   **kwargs: Any) -> torch.nn.Module:
    r"""An attention layer of the given kind, GATConv-style arguments.

    ``'metric'``, ``'l2'`` and ``'dot'`` build :class:`MetricAttentionConv`;
    ``'gat'``, ``'gatv2'`` and ``'transformer'`` build PyG's
    :class:`~torch_geometric.nn.conv.GATConv`,
    :class:`~torch_geometric.nn.conv.GATv2Conv` and
    :class:`~torch_geometric.nn.conv.TransformerConv`. ``kwargs`` go to the
    layer; those a PyG layer does not take (the metric-attention options) are
    dropped for it.
    """
    if attention in METRICS:
        return MetricAttentionConv(in_channels, out_channels, heads=heads,
                                   concat=concat, metric=attention, **kwargs)
    if attention not in PYG_ATTENTIONS:
        raise ValueError(f"Unknown attention '{attention}'; expected one of "
                         f"{ATTENTIONS}")
    metric_only = ('metric_channels', 'mlp_channels', 'time_scale',
                   'learn_time_scale', 'value')
    kwargs = {k: v for k, v in kwargs.items() if k not in metric_only}
    if attention == 'transformer':
        kwargs.pop('add_self_loops', None)  # TransformerConv has no self-loops
    return PYG_ATTENTIONS[attention](in_channels, out_channels, heads=heads,
                                     concat=concat, **kwargs)


def propagation_module(attention: str, channels: int, heads: int = 1,
                       **kwargs: Any) -> torch.nn.Module:
    r"""One ``channels -> channels`` attention layer of the given kind (see
    :func:`attention_conv`), heads averaged (``concat=False``) so every kind
    keeps the width."""
    return attention_conv(attention, channels, channels, heads, concat=False,
                          **kwargs)


class IPN(torch.nn.Module):
    r"""Linear :math:`\to` ``num_layers`` attention propagation modules
    :math:`\to` Linear, returning class logits (the paper's IPN).

    On a graph the propagation follows ``edge_index``. On point sets (no
    ``edge_index``) every point attends to every point of its set, the sets
    being given by ``batch`` (the paper's Moon/MNIST setting).

    Args:
        in_channels (int): Input feature size.
        hidden_channels (int): Width :math:`d_Q` of the propagated features.
        out_channels (int): Number of classes.
        num_layers (int, optional): Number of propagation modules.
            (default: :obj:`1`)
        attention (str, optional): ``'metric'``, ``'l2'``, ``'dot'`` (this
            library's :class:`MetricAttentionConv`) or ``'gat'``, ``'gatv2'``,
            ``'transformer'`` (PyG's layers in the same slots).
            (default: :obj:`'metric'`)
        heads (int, optional): Attention heads per module (averaged).
            (default: :obj:`1`)
        value (bool, optional): Give metric-attention modules a value map. The
            paper propagates the features themselves, :math:`H' = S H`.
            (default: :obj:`False`)
        **kwargs (optional): Further arguments of the propagation modules,
            e.g. ``mlp_channels``, ``time_scale``, ``dropout``, ``edge_dim``.
    """
    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int,
                 num_layers: int = 1, attention: str = 'metric', heads: int = 1,
                 value: bool = False, **kwargs: Any):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"'num_layers' must be at least 1, got {num_layers}")
        self.attention = attention
        self.lin_in = Linear(in_channels, hidden_channels)
        self.convs = torch.nn.ModuleList([
            propagation_module(attention, hidden_channels, heads, value=value,
                               **kwargs) for _ in range(num_layers)
        ])
        self.lin_out = Linear(hidden_channels, out_channels)

    def reset_parameters(self) -> None:
        self.lin_in.reset_parameters()
        for conv in self.convs:
            conv.reset_parameters()
        self.lin_out.reset_parameters()

    def forward(self, x: Tensor, edge_index: Adj | None = None,
                batch: OptTensor = None, edge_attr: OptTensor = None) -> Tensor:
        """Class logits per node (or point)."""
        h = self.lin_in(x)
        if edge_index is None:
            return self.lin_out(self._propagate_point_sets(h, batch))
        for conv in self.convs:
            h = conv(h, edge_index) if edge_attr is None else conv(
                h, edge_index, edge_attr=edge_attr)
        return self.lin_out(h)

    def _propagate_point_sets(self, h: Tensor, batch: OptTensor) -> Tensor:
        """All pairs per set: dense kernels for metric-attention, edges else."""
        if self.attention in METRICS:
            for conv in self.convs:
                h = conv.forward_point_sets(h, batch)
            return h
        edge_index = fully_connected_edge_index(h.size(0), batch, h.device)
        for conv in self.convs:
            h = conv(h, edge_index)
        return h

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.lin_in.in_channels}, '
                f'{self.lin_in.out_channels}, {self.lin_out.out_channels}, '
                f'num_layers={len(self.convs)}, attention={self.attention!r})')
