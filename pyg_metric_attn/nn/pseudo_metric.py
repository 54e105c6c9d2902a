r"""Learnable feature maps that define the attention pseudo-metric.

Metric-attention (Ruan & Zhang, arXiv 2412.18288, Algorithm 1) scores a pair
of nodes by :math:`-\|\phi(h_i) - \phi(h_j)\|^2 / t`. The map :math:`\phi` is
shared by both sides of the pair, so the score is a (pseudo-)metric:

* ``'metric'``: :class:`ResidualTanhMLP`, a one-hidden-layer MLP with a
  residual connection, :math:`\phi(u) = P u + W_2 \tanh(W_1 u + b_1) + b_2`.
* ``'l2'``: a tied linear map :math:`\phi(u) = W u` (L2 self-attention of
  Kim et al. 2021 with :math:`W_Q = W_K`).
* ``'dot'``: the dot-product baseline, with separate query and key maps.
"""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor
from torch_geometric.nn.dense.linear import Linear

Metric = Literal['metric', 'l2', 'dot']
METRICS: tuple[str, ...] = ('metric', 'l2', 'dot')


def check_metric(metric: str) -> str:
    """Return ``metric`` if it names a supported pseudo-metric, else raise."""
    if metric not in METRICS:
        raise ValueError(f"Unknown metric '{metric}'; expected one of {METRICS}")
    return metric


class ResidualTanhMLP(torch.nn.Module):
    r"""The learnable map :math:`\phi` of metric-attention.

    .. math::
        \phi(u) = P u + W_2 \tanh(W_1 u + b_1) + b_2

    :math:`P` is the identity when ``in_channels == out_channels`` and a
    learnable linear map (no bias) otherwise.

    Args:
        in_channels (int): Size of :math:`u`.
        out_channels (int): Size of :math:`\phi(u)`.
        hidden_channels (int): Width :math:`d_{mlp}` of the hidden layer.
    """
    def __init__(self, in_channels: int, out_channels: int, hidden_channels: int):
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.hidden_channels = hidden_channels
        self.hidden = Linear(in_channels, hidden_channels, bias=True,
                             weight_initializer='glorot', bias_initializer='zeros')
        self.out = Linear(hidden_channels, out_channels, bias=True,
                          weight_initializer='glorot', bias_initializer='zeros')
        if in_channels == out_channels:
            self.skip = None
        else:
            self.skip = Linear(in_channels, out_channels, bias=False,
                               weight_initializer='glorot')
        self.reset_parameters()

    def reset_parameters(self) -> None:
        self.hidden.reset_parameters()
        self.out.reset_parameters()
        if self.skip is not None:
            self.skip.reset_parameters()

    def forward(self, u: Tensor) -> Tensor:
        skip = u if self.skip is None else self.skip(u)
        return skip + self.out(torch.tanh(self.hidden(u)))

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.in_channels}, '
                f'{self.out_channels}, hidden_channels={self.hidden_channels})')


def tied_map(metric: str, in_channels: int, out_channels: int,
             mlp_channels: int) -> torch.nn.Module:
    """The map applied to both ends of an edge for ``'metric'`` and ``'l2'``."""
    if metric == 'metric':
        return ResidualTanhMLP(in_channels, out_channels, mlp_channels)
    if metric == 'l2':
        # A bias would cancel in z_i - z_j, so there is none.
        return Linear(in_channels, out_channels, bias=False,
                      weight_initializer='glorot')
    raise ValueError(f"'{metric}' has no tied map")


def metric_maps(metric: str, first_channels: int, second_channels: int,
                out_channels: int, mlp_channels: int, bias: bool = False,
                separate: bool = False
                ) -> tuple[torch.nn.Module, torch.nn.Module | None]:
    """The maps of an attention's two ends (queries and keys) into its logit
    space, ``(first_map, second_map)`` as :func:`embed_pair` takes them:
    ``'dot'`` gets two linear maps (:math:`W_Q, W_K`, glorot, biases zero
    where ``bias``); ``'metric'`` and ``'l2'`` get the :func:`tied_map` of
    the first end and :obj:`None` (both ends share it), unless ``separate``
    gives the second end a tied map of its own (another input width)."""
    if check_metric(metric) == 'dot':
        first, second = (Linear(channels, out_channels, bias=bias,
                                weight_initializer='glorot',
                                bias_initializer='zeros')
                         for channels in (first_channels, second_channels))
        return first, second
    first = tied_map(metric, first_channels, out_channels, mlp_channels)
    return first, (tied_map(metric, second_channels, out_channels, mlp_channels)
                   if separate else None)


def embed_pair(first_map: torch.nn.Module, second_map: torch.nn.Module | None,
               first: Tensor, second: Tensor) -> tuple[Tensor, Tensor]:
    """``(first_map(first), second_map(second))``; without ``second_map`` both
    go through the tied ``first_map``, once where ``second is first``."""
    z_first = first_map(first)
    if second_map is not None:
        return z_first, second_map(second)
    return z_first, z_first if second is first else first_map(second)
