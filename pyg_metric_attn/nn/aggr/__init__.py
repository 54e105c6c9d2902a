from pyg_metric_attn.nn.aggr.metric_attentional import MetricAttentionalAggregation

__all__ = ['MetricAttentionalAggregation']
