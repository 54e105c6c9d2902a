"""The attention types the experiments compare, by name: this library's
metric-attention (``'metric'``, ``'l2'``, ``'dot'``) and PyG's attention
layers in the same slots (``'gat'``, ``'gatv2'``, ``'transformer'``)."""
from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial
from typing import Any

from torch_geometric.nn import GATConv, GATv2Conv, TransformerConv
from torch_geometric.nn.conv import MessagePassing

from pyg_metric_attn.nn.conv import MetricAttentionConv
from pyg_metric_attn.nn.pseudo_metric import METRICS

PYG_ATTENTIONS: dict[str, type[MessagePassing]] = {
    'gat': GATConv, 'gatv2': GATv2Conv, 'transformer': TransformerConv}
ATTENTIONS: tuple[str, ...] = (*METRICS, *PYG_ATTENTIONS)


def layer_class(attention: str) -> type[MessagePassing]:
    """The layer class of an attention type."""
    if attention in METRICS:
        return MetricAttentionConv
    if attention not in PYG_ATTENTIONS:
        raise ValueError(f"Unknown attention '{attention}'; expected one of "
                         f"{ATTENTIONS}")
    return PYG_ATTENTIONS[attention]


def accepted_options(cls: type[MessagePassing]) -> set[str]:
    """The keyword arguments ``cls`` takes, :class:`MessagePassing`'s (which
    PyG's layers pass on) included."""
    names = set()
    for init in (cls.__init__, MessagePassing.__init__):
        names |= {name for name, parameter in
                  inspect.signature(init).parameters.items()
                  if parameter.kind not in (parameter.VAR_POSITIONAL,
                                            parameter.VAR_KEYWORD)}
    return names - {'self', 'in_channels', 'out_channels'}


def check_options(attention: str,
                  options: dict[str, Any]) -> type[MessagePassing]:
    """The layer class of ``attention``; raises where it does not take one
    of ``options`` (its ``metric`` is the attention type's)."""
    cls = layer_class(attention)
    unknown = set(options) - accepted_options(cls)
    if cls is MetricAttentionConv:
        unknown |= {'metric'} & set(options)
    if unknown:
        raise ValueError(f"'{attention}' ({cls.__name__}) takes no options "
                         f"{sorted(unknown)}")
    return cls


def attention_conv(attention: str, in_channels: int, out_channels: int,
                   **options: Any) -> MessagePassing:
    r"""An attention layer of the given type with GATConv-style arguments
    (``heads``, ``concat``, ``dropout``, ...): ``'metric'``, ``'l2'`` and
    ``'dot'`` build :class:`MetricAttentionConv` with that ``metric``;
    ``'gat'``, ``'gatv2'`` and ``'transformer'`` PyG's
    :class:`~torch_geometric.nn.conv.GATConv`,
    :class:`~torch_geometric.nn.conv.GATv2Conv` and
    :class:`~torch_geometric.nn.conv.TransformerConv`. An option the layer
    does not take (e.g. ``time_scale`` for ``'gat'``) raises."""
    cls = check_options(attention, options)
    if cls is MetricAttentionConv:
        options = {**options, 'metric': attention}
    return cls(in_channels, out_channels, **options)


def attention_factory(attention: str,
                      **options: Any) -> Callable[[int, int], MessagePassing]:
    """:func:`attention_conv` of ``attention`` and ``options`` as a factory
    of ``(in_channels, out_channels)``, e.g. the ``conv`` of
    :class:`~pyg_metric_attn.nn.models.IPN`. The options are checked now."""
    check_options(attention, options)
    return partial(attention_conv, attention, **options)


def metric_options(attention: str, **options: Any) -> dict[str, Any]:
    """``options`` of :class:`MetricAttentionConv` for the metric-attention
    types, none for PyG's layers: a task's metric-attention settings (its
    time scale, ...) leave the PyG layers as their papers define them."""
    return dict(options) if attention in METRICS else {}
