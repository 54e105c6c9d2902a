"""Metric-attention (Ruan & Zhang, arXiv 2412.18288) for PyTorch Geometric."""
from pyg_metric_attn.nn import (
    IPN,
    MetricAttentionConv,
    MetricMultiheadAttention,
    ResidualTanhMLP,
)

__version__ = '0.1.0'

__all__ = ['IPN', 'MetricAttentionConv', 'MetricMultiheadAttention',
           'ResidualTanhMLP', '__version__']
