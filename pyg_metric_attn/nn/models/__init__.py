from pyg_metric_attn.nn.models.decoding import beam_search, greedy_decode
from pyg_metric_attn.nn.models.ipn import ATTENTIONS, IPN, propagation_module
from pyg_metric_attn.nn.models.mesh_former import (
    MetricMeshFormer,
    MetricMeshFormerBlock,
)
from pyg_metric_attn.nn.models.transformer import (
    MetricTransformer,
    MetricTransformerDecoderLayer,
    MetricTransformerEncoderLayer,
    matched_time_scale,
)

__all__ = ['ATTENTIONS', 'IPN', 'MetricMeshFormer', 'MetricMeshFormerBlock',
           'MetricTransformer', 'MetricTransformerDecoderLayer',
           'MetricTransformerEncoderLayer', 'beam_search', 'greedy_decode',
           'matched_time_scale', 'propagation_module']
