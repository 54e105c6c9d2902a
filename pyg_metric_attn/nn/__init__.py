from pyg_metric_attn.nn.conv import MetricAttentionConv
from pyg_metric_attn.nn.dense import MetricMultiheadAttention
from pyg_metric_attn.nn.heat_diffusion import HeatDiffusion, MeshSpectrum
from pyg_metric_attn.nn.models import IPN
from pyg_metric_attn.nn.pseudo_metric import ResidualTanhMLP
from pyg_metric_attn.nn.spatial_gradient import (
    SpatialGradientFeatures,
    TangentGradient,
    vertex_gradients,
)

__all__ = ['HeatDiffusion', 'IPN', 'MeshSpectrum', 'MetricAttentionConv',
           'MetricMultiheadAttention', 'ResidualTanhMLP',
           'SpatialGradientFeatures', 'TangentGradient', 'vertex_gradients']
