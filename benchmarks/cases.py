"""What the benchmarks measure: sparse graph layers and dense attention kernels.

A *case* is a JSON-able dict naming a suite, a variant and its sizes. :func:`build`
turns it into a zero-argument ``step`` that runs one forward (under
``torch.no_grad``) or one forward + backward pass.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

# Sparse suite: PyG's attention layers and MetricAttentionConv per backend.
SPARSE_BASELINE = 'GATConv'
SPARSE_VARIANTS = ('GATConv', 'GATv2Conv', 'TransformerConv',
                   'metric-scatter', 'metric-fused', 'l2-scatter', 'l2-fused',
                   'dot-scatter', 'dot-fused')
# Dense suite: SDPA, metric-SDPA (auto form, without the denormal flush, and
# each form forced) and the naive cdist + softmax.
DENSE_BASELINE = 'sdpa-dot'
DENSE_VARIANTS = ('sdpa-dot', 'metric-sdpa', 'metric-sdpa-unflushed',
                  'metric-key-bias', 'metric-augmented', 'naive-cdist')
MODES = ('forward', 'forward_backward')


def sparse_layer(variant: str, channels: int, heads: int) -> torch.nn.Module:
    """``channels -> heads x channels`` with each layer's defaults (self-loops
    where the layer adds them)."""
    from torch_geometric import nn

    if variant in ('GATConv', 'GATv2Conv', 'TransformerConv'):
        return getattr(nn, variant)(channels, channels, heads=heads)
    from pyg_metric_attn import MetricAttentionConv

    metric, backend = variant.split('-')
    return MetricAttentionConv(channels, channels, heads=heads, metric=metric,
                               backend=backend)


def random_edge_index(num_nodes: int, degree: int,
                      generator: torch.Generator) -> Tensor:
    """``num_nodes * degree`` uniformly random directed edges."""
    return torch.randint(0, num_nodes, (2, num_nodes * degree),
                         generator=generator)


def dense_attention(variant: str) -> Callable[[Tensor, Tensor, Tensor], Tensor]:
    """``(q, k, v) [B, H, L, d] -> [B, H, L, d]`` for one dense variant
    (``t = 1``)."""
    import torch.nn.functional as F

    from pyg_metric_attn.nn import functional
    from pyg_metric_attn.utils import denormals

    if variant == 'sdpa-dot':
        return F.scaled_dot_product_attention
    if variant == 'metric-sdpa':
        return lambda q, k, v: functional.dense_metric_attention(q, k, v)[0]
    if variant == 'metric-sdpa-unflushed':  # a fresh process per case
        os.environ[denormals.SWITCH] = '0'
        return dense_attention('metric-sdpa')
    if variant == 'metric-key-bias':
        return lambda q, k, v: functional._key_bias_sdpa(
            *functional.centred(q, k), v, 1.0, None, 0.0)
    if variant == 'metric-augmented':
        return lambda q, k, v: functional._augmented_sdpa(
            *functional.centred(q, k), v, 1.0, None, False, 0.0)
    if variant == 'naive-cdist':
        return lambda q, k, v: torch.softmax(-torch.cdist(q, k).square(),
                                             dim=-1) @ v
    raise ValueError(f"Unknown dense variant '{variant}'")


def build(case: dict[str, Any], mode: str,
          device: torch.device) -> Callable[[], Any]:
    """The ``step`` of one case in one mode; inputs are made here, so they
    count towards the process' baseline memory, not the step's."""
    generator = torch.Generator().manual_seed(0)
    backward = mode == 'forward_backward'
    if case['suite'] == 'sparse':
        x = torch.randn(case['nodes'], case['channels'],
                        generator=generator).to(device)
        edge_index = random_edge_index(case['nodes'], case['degree'],
                                       generator).to(device)
        torch.manual_seed(0)
        layer = sparse_layer(case['variant'], case['channels'],
                             case['heads']).to(device).train(backward)

        def sparse_step() -> None:
            out = layer(x, edge_index)
            if backward:
                out.sum().backward()
        return _graded(sparse_step, backward)

    shape = (case['batch'], case['heads'], case['length'], case['head_dim'])
    q, k, v = ((torch.randn(shape, generator=generator)
                 * case.get('scale', 1.0))
               .to(device).requires_grad_(backward) for _ in range(3))
    attention = dense_attention(case['variant'])

    def dense_step() -> None:
        out = attention(q, k, v)
        if backward:
            out.sum().backward()
    return _graded(dense_step, backward)


def _graded(step: Callable[[], None], backward: bool) -> Callable[[], None]:
    """Run ``step`` with autograd on for training, off for inference."""
    def run() -> None:
        with torch.set_grad_enabled(backward):
            step()
    return run


def sparse_cases(quick: bool) -> list[dict[str, Any]]:
    nodes = (1_000, 10_000) if quick else (1_000, 10_000, 100_000)
    degrees = (20, ) if quick else (10, 20, 50)
    heads = (4, ) if quick else (1, 4)
    return [dict(suite='sparse', variant=variant, nodes=n, degree=d, heads=h,
                 channels=64)
            for n in nodes for d in degrees for h in heads
            for variant in SPARSE_VARIANTS]


def dense_cases(quick: bool) -> list[dict[str, Any]]:
    """Unit-scale inputs (``scale``: the standard deviation of q, k and v),
    whose distance logits reach the denormal range of the softmax."""
    lengths = (256, 1024) if quick else (256, 1024, 4096)
    return [dict(suite='dense', variant=variant, length=length, batch=8,
                 heads=8, head_dim=64, scale=1.0)
            for length in lengths for variant in DENSE_VARIANTS]


def group_key(case: dict[str, Any]) -> tuple:
    """Cases compared with one baseline: everything but the variant."""
    return tuple((k, v) for k, v in sorted(case.items()) if k != 'variant')
