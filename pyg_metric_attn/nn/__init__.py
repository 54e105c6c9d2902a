"""Layers and models. Mesh operators' containers (``MeshSpectrum``,
``TangentGradient``) stay in their modules,
:mod:`~pyg_metric_attn.nn.heat_diffusion` and
:mod:`~pyg_metric_attn.nn.spatial_gradient`."""
from pyg_metric_attn.nn.aggr import MetricAttentionalAggregation
from pyg_metric_attn.nn.conv import MetricAttentionConv
from pyg_metric_attn.nn.dense import MetricMultiheadAttention
from pyg_metric_attn.nn.heat_diffusion import HeatDiffusion
from pyg_metric_attn.nn.models import (
    IPN,
    DiffusionNet,
    DiffusionNetConfig,
    MetricMeshFormer,
    MetricMeshFormerConfig,
    MetricTransformer,
    PointSetClassifier,
)
from pyg_metric_attn.nn.pseudo_metric import ResidualTanhMLP
from pyg_metric_attn.nn.spatial_gradient import SpatialGradientFeatures
from pyg_metric_attn.nn.time_scale import TimeScale, matched_time_scale

__all__ = ['DiffusionNet', 'DiffusionNetConfig', 'HeatDiffusion', 'IPN',
           'MetricAttentionConv',
           'MetricAttentionalAggregation', 'MetricMeshFormer',
           'MetricMeshFormerConfig', 'MetricMultiheadAttention',
           'MetricTransformer', 'PointSetClassifier', 'ResidualTanhMLP',
           'SpatialGradientFeatures',
           'TimeScale', 'matched_time_scale']
