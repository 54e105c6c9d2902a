from pyg_metric_attn.nn.models.ipn import ATTENTIONS, IPN, propagation_module
from pyg_metric_attn.nn.models.mesh_former import (
           MetricMeshFormer,
           MetricMeshFormerBlock,
)

__all__ = ['ATTENTIONS', 'IPN', 'MetricMeshFormer', 'MetricMeshFormerBlock',
           'propagation_module']
