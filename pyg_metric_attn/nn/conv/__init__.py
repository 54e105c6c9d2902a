from pyg_metric_attn.nn.conv.metric_attention_conv import MetricAttentionConv

__all__ = ['MetricAttentionConv']
