from pyg_metric_attn.nn.conv import MetricAttentionConv
from pyg_metric_attn.nn.models import IPN
from pyg_metric_attn.nn.pseudo_metric import ResidualTanhMLP

__all__ = ['IPN', 'MetricAttentionConv', 'ResidualTanhMLP']
