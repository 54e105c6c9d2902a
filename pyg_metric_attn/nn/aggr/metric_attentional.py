r"""Learnable-query metric pooling."""
from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.nn.aggr import Aggregation
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.utils import softmax

from pyg_metric_attn.nn.pseudo_metric import check_metric, tied_map
from pyg_metric_attn.nn.time_scale import TimeScale, resolve_time_scale


class MetricAttentionalAggregation(Aggregation):
    r"""Pools each set (graph, point cloud) into :math:`k` vectors by
    metric-attention from :math:`k` learned query points :math:`q_m`:

    .. math::
        \alpha_{mj} = \mathrm{softmax}_{j \in \mathcal{S}}\left(
        -\|\phi(q_m) - \phi(x_j)\|^2 / t\right), \qquad
        \mathbf{o}_m = \sum_{j \in \mathcal{S}} \alpha_{mj}\, W_v \mathbf{x}_j,

    with the same map :math:`\phi` on queries and members (the paper's
    learnable-query attention :math:`f(q, k)\, g(v) / C`, with the metric
    similarity). The result is the :math:`k \times C` matrix of each set,
    flattened to :math:`k C` (or averaged over the queries).

    Args:
        in_channels (int): Size :math:`F` of each member's features.
        out_channels (int): Size :math:`C` of each pooled vector.
        num_queries (int, optional): Number :math:`k` of learned queries.
            (default: :obj:`4`)
        metric (str, optional): ``'metric'`` (:math:`\phi` a residual tanh
            MLP) or ``'l2'`` (:math:`\phi` linear). (default: :obj:`'metric'`)
        metric_channels (int, optional): Size :math:`D` of :math:`\phi`.
            (default: :obj:`in_channels`)
        mlp_channels (int, optional): Hidden width of :math:`\phi` for
            ``'metric'``. (default: :obj:`metric_channels`)
        time_scale (float or str, optional): The heat-kernel time :math:`t`,
            or ``'matched'`` (:math:`t = 2\sqrt{D}`; see
            :mod:`~pyg_metric_attn.nn.time_scale` for when the paper's
            :math:`t = 1` saturates). (default: :obj:`1.0`)
        learn_time_scale (bool, optional): Learn :math:`t`.
            (default: :obj:`False`)
        concat (bool, optional): Flatten the :math:`k` vectors (:obj:`True`)
            or average them. (default: :obj:`True`)

    Shapes:
        - **input:** members :math:`(N, F)`, their set ``index`` :math:`(N)`
          (sorted or not) or ``ptr``, optional ``dim_size`` :math:`B`
        - **output:** :math:`(B, k C)` with ``concat``, else :math:`(B, C)`;
          a set without members gives zeros
    """
    def __init__(self, in_channels: int, out_channels: int, num_queries: int = 4,
                 metric: str = 'metric', metric_channels: int | None = None,
                 mlp_channels: int | None = None, time_scale: float | str = 1.0,
                 learn_time_scale: bool = False, concat: bool = True):
        super().__init__()
        if check_metric(metric) == 'dot':
            raise ValueError("MetricAttentionalAggregation scores by a distance: "
                             "metric must be 'metric' or 'l2' (PyG's "
                             "AttentionalAggregation is the dot/gate baseline)")
        for name, value in (('in_channels', in_channels),
                            ('out_channels', out_channels),
                            ('num_queries', num_queries)):
            if value <= 0:
                raise ValueError(f"'{name}' must be positive, got {value}")
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.num_queries = num_queries
        self.metric = metric
        self.metric_channels = metric_channels or in_channels
        self.concat = concat
        self.query = torch.nn.Parameter(torch.empty(num_queries, in_channels))
        self.phi = tied_map(metric, in_channels, self.metric_channels,
                            mlp_channels or self.metric_channels)
        self.lin_value = Linear(in_channels, out_channels, bias=False,
                                weight_initializer='glorot')
        self.time_scale = TimeScale(resolve_time_scale(
            time_scale, metric, self.metric_channels), learn_time_scale)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # Queries start at the scale of standardised features.
        torch.nn.init.normal_(self.query)
        self.phi.reset_parameters()
        self.lin_value.reset_parameters()
        self.time_scale.reset_parameters()

    def forward(self, x: Tensor, index: Tensor | None = None,
                ptr: Tensor | None = None, dim_size: int | None = None,
                dim: int = -2) -> Tensor:
        if x.dim() != 2 or x.size(1) != self.in_channels or dim not in (0, -2):
            raise ValueError(f"'x' must be [num_members, {self.in_channels}] "
                             f"aggregated along dim 0, got {list(x.shape)} "
                             f"and dim={dim}")
        # (Aggregation.__call__ has filled in index or ptr, and dim_size.)
        members = self.phi(x)                                   # [N, D]
        queries = self.phi(self.query)                          # [k, D]
        # Direct differences in float64 sums: exact for far-apart sets.
        distance = (members.unsqueeze(1) - queries.unsqueeze(0)).square().sum(
            -1, dtype=torch.float64)                            # [N, k]
        logits = -distance / self.time_scale()
        alpha = softmax(logits, index, ptr, dim_size, dim=0).to(x.dtype)
        values = self.lin_value(x)                              # [N, C]
        pooled = self.reduce(alpha.unsqueeze(-1) * values.unsqueeze(1),
                             index, ptr, dim_size, dim=0, reduce='sum')  # [B, k, C]
        return pooled.flatten(1) if self.concat else pooled.mean(1)

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.in_channels}, '
                f'{self.out_channels}, num_queries={self.num_queries}, '
                f'metric={self.metric!r})')
