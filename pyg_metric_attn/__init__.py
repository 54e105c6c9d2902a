"""Metric-attention (Ruan & Zhang, arXiv 2412.18288) for PyTorch Geometric."""
from pyg_metric_attn.nn import IPN, MetricAttentionConv, ResidualTanhMLP

__version__ = '0.1.0'

__all__ = ['IPN', 'MetricAttentionConv', 'ResidualTanhMLP', '__version__']
