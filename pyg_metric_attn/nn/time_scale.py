r"""The heat-kernel time scale :math:`t` of :math:`\exp(-d / t)`.

One rule for every attention module of this library (the conv,
:class:`~pyg_metric_attn.nn.MetricMultiheadAttention`,
:class:`~pyg_metric_attn.nn.MetricAttentionalAggregation`,
:class:`~pyg_metric_attn.nn.models.MetricMeshFormer`,
:class:`~pyg_metric_attn.nn.models.MetricTransformer`): ``time_scale`` is a
positive number or ``'matched'``, :func:`matched_time_scale` of the module's
per-head metric dimension :math:`D`.

When the paper's :math:`t = 1` saturates: squared distances between
:math:`D`-dimensional embeddings of unit-scale features are about :math:`2D`,
so with :math:`t = 1` the logits differ by :math:`O(D)` and the softmax is
nearly one-hot, on the nearest key, which on a graph with self-loops is the
node itself. Measured at initialisation (``MetricAttentionConv(D, D)`` with
``metric='metric'``, seed 0, standard normal features, 500 nodes with 10
random neighbours each, where uniform weights would give the self-loop 0.09;
``'l2'`` alike): the self-loop's mean weight is 0.75 at
:math:`D = 4`, 0.98 at :math:`D = 8` and 1.00 from :math:`D = 16` on with
:math:`t = 1`; 0.35, 0.53, 0.84 and 1.00 (:math:`D = 64`) with ``'matched'``;
0.21 to 0.29 for every :math:`D` with :math:`t = 2D`, the scale of the
squared distances (``tests/test_metric_attention_conv.py`` checks these
trends). So :math:`t = 1` suits only a few dimensions per head;
``'matched'`` gives the cross term :math:`q^\top k` the scale it has in
dot-product attention, and :math:`t` of the order of :math:`2D` keeps the
weights soft where self-loops would otherwise win.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.nn import Parameter

from pyg_metric_attn.nn.pseudo_metric import check_metric


class TimeScale(torch.nn.Module):
    r"""The time :math:`t > 0` by which attention divides squared distances.

    A constant :math:`t` (the paper: :math:`t = 1`), or learned as
    :math:`t = \exp(s)` with :math:`s` initialised at :math:`\log t_0`, so it
    stays positive.

    Args:
        value (float): :math:`t_0`, the constant or the initial value.
        learn (bool): Learn :math:`t`.
    """
    def __init__(self, value: float = 1.0, learn: bool = False):
        super().__init__()
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not math.isfinite(value) or value <= 0):
            raise ValueError(f"'time_scale' must be a positive number, got "
                             f"{value!r}")
        self.initial = float(value)
        self.learn = learn
        if learn:
            self.log_value = Parameter(torch.empty(()))
        else:
            self.register_parameter('log_value', None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.log_value is not None:
            with torch.no_grad():
                self.log_value.fill_(math.log(self.initial))

    def forward(self) -> Tensor | float:
        """:math:`t`: a float, or a 0-dim tensor when it is learned."""
        if self.log_value is not None:
            return self.log_value.exp()
        return self.initial

    def extra_repr(self) -> str:
        return f'{self.initial}, learn={self.learn}'


def matched_time_scale(metric: str, head_dim: int) -> float:
    r"""The time scale that gives every attention type the logit scale of
    scaled dot-product attention.

    :math:`-\|q - k\|^2 / t = (2 q^\top k - \|k\|^2) / t - \|q\|^2 / t`, and
    :math:`\|q\|^2` drops out of the softmax, so :math:`t = 2\sqrt{D}` turns
    the cross term into :math:`q^\top k / \sqrt{D}` for ``'metric'`` and
    ``'l2'``; ``'dot'`` already divides by :math:`\sqrt{D}` and keeps
    :math:`t = 1`.
    """
    return 1.0 if check_metric(metric) == 'dot' else 2.0 * math.sqrt(head_dim)


def resolve_time_scale(time_scale: float | str, metric: str,
                       head_dim: int) -> float:
    """``time_scale`` as a number: ``'matched'`` becomes
    :func:`matched_time_scale` of ``metric`` and the per-head metric
    dimension ``head_dim``; a number is returned as it is (checked by
    :class:`TimeScale`)."""
    if time_scale == 'matched':
        return matched_time_scale(metric, head_dim)
    if isinstance(time_scale, str):
        raise ValueError(f"'time_scale' must be a positive number or "
                         f"'matched', got '{time_scale}'")
    return time_scale
