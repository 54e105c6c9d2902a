from pyg_metric_attn.nn.models.decoding import beam_search, greedy_decode
from pyg_metric_attn.nn.models.diffusion_net import (
    DiffusionNet,
    DiffusionNetBlock,
    DiffusionNetConfig,
)
from pyg_metric_attn.nn.models.ipn import IPN
from pyg_metric_attn.nn.models.mesh_former import (
    MetricMeshFormer,
    MetricMeshFormerBlock,
    MetricMeshFormerConfig,
)
from pyg_metric_attn.nn.models.mesh_forward import mesh_forward
from pyg_metric_attn.nn.models.point_set_classifier import PointSetClassifier
from pyg_metric_attn.nn.models.transformer import (
    MetricTransformer,
    MetricTransformerDecoderLayer,
    MetricTransformerEncoderLayer,
)

__all__ = ['DiffusionNet', 'DiffusionNetBlock', 'DiffusionNetConfig', 'IPN',
           'MetricMeshFormer', 'MetricMeshFormerBlock',
           'MetricMeshFormerConfig', 'MetricTransformer', 'PointSetClassifier',
           'MetricTransformerDecoderLayer', 'MetricTransformerEncoderLayer',
           'beam_search', 'greedy_decode', 'mesh_forward']
