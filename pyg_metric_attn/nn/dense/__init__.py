"""Dense (all-pairs) attention modules for sequences and point sets."""
from pyg_metric_attn.nn.dense.multihead import MetricMultiheadAttention

__all__ = ['MetricMultiheadAttention']
