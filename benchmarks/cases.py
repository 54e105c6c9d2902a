"""What the benchmarks measure: sparse graph layers, a two-layer graph model
at scale and dense attention kernels.

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
DENSE_VARIANTS = ('sdpa-dot', 'metric-sdpa', 'metric-sdpa-narrow',
                  'metric-sdpa-unflushed', 'metric-key-bias', 'metric-augmented',
                  'naive-cdist')
# Scale suite: TwoLayerNet trained full batch (forward + backward) on uniform
# and power-law graphs of (nodes, edges) up to 2M / 50M.
SCALE_BASELINE = 'GATConv'
SCALE_VARIANTS = ('GATConv', 'metric-fused')
SCALE_GRAPHS = {
    'full': ((10_000, 200_000), (100_000, 2_000_000), (1_000_000, 20_000_000),
             (2_000_000, 50_000_000)),
    'quick': ((10_000, 200_000), (100_000, 2_000_000)),
    'tiny': ((100, 1_000), (200, 2_000)),  # tests: seconds
}
MODES = ('forward', 'forward_backward')
SUITE_MODES = {'sparse': MODES, 'dense': MODES, 'scale': ('forward_backward', )}


def sparse_layer(variant: str, in_channels: int, out_channels: int,
                 heads: int) -> torch.nn.Module:
    """``in_channels -> heads x out_channels`` (concatenated) with each
    layer's defaults (self-loops where the layer adds them)."""
    from torch_geometric import nn

    if variant in ('GATConv', 'GATv2Conv', 'TransformerConv'):
        return getattr(nn, variant)(in_channels, out_channels, heads=heads)
    from pyg_metric_attn import MetricAttentionConv

    metric, backend = variant.split('-')
    return MetricAttentionConv(in_channels, out_channels, heads=heads,
                               metric=metric, backend=backend)


class TwoLayerNet(torch.nn.Module):
    """``conv(C -> H x C/H) -> ELU -> conv(C -> H x C/H)``, heads concatenated:
    the scale suite's model. No other layers, so what grows with the graph
    is the graph layers' memory.

    Args:
        variant (str): The layer (see :func:`sparse_layer`).
        channels (int): Width :math:`C` of the input, hidden and output.
        heads (int): Heads :math:`H` per layer (divides ``channels``).
    """
    def __init__(self, variant: str, channels: int, heads: int):
        super().__init__()
        if channels % heads:
            raise ValueError(f"'heads' ({heads}) must divide 'channels' "
                             f'({channels})')
        self.conv1 = sparse_layer(variant, channels, channels // heads, heads)
        self.conv2 = sparse_layer(variant, channels, channels // heads, heads)

    def reset_parameters(self) -> None:
        self.conv1.reset_parameters()
        self.conv2.reset_parameters()

    def forward(self, x: Tensor, edge_index: Tensor) -> Tensor:
        hidden = torch.nn.functional.elu(self.conv1(x, edge_index))  # [N, C]
        return self.conv2(hidden, edge_index)  # [N, C]


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
    if variant == 'metric-sdpa-narrow':  # MetricMultiheadAttention's layout:
        # a metric width one less than the head, augmented to the head width
        return lambda q, k, v: functional.dense_metric_attention(
            q[..., 1:], k[..., 1:], v)[0]
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
    if case['suite'] in ('sparse', 'scale'):
        x = torch.randn(case['nodes'], case['channels'],
                        generator=generator).to(device)
        torch.manual_seed(0)
        if case['suite'] == 'sparse':
            edge_index = random_edge_index(case['nodes'], case['degree'],
                                           generator).to(device)
            model = sparse_layer(case['variant'], case['channels'],
                                 case['channels'], case['heads'])
        else:
            from benchmarks.graphs import make_graph

            edge_index = make_graph(case['graph'], case['nodes'],
                                    case['edges'], device)
            model = TwoLayerNet(case['variant'], case['channels'],
                                case['heads'])
        model = model.to(device).train(backward)

        def graph_step() -> None:
            out = model(x, edge_index)
            if backward:
                out.sum().backward()
        return _graded(graph_step, backward)

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


def sparse_cases(size: str) -> list[dict[str, Any]]:
    quick = _quick(size, 'sparse')
    nodes = (1_000, 10_000) if quick else (1_000, 10_000, 100_000)
    degrees = (20, ) if quick else (10, 20, 50)
    heads = (4, ) if quick else (1, 4)
    return [dict(suite='sparse', variant=variant, nodes=n, degree=d, heads=h,
                 channels=64)
            for n in nodes for d in degrees for h in heads
            for variant in SPARSE_VARIANTS]


def dense_cases(size: str) -> list[dict[str, Any]]:
    """Unit-scale inputs (``scale``: the standard deviation of q, k and v),
    whose distance logits reach the denormal range of the softmax."""
    lengths = (256, 1024) if _quick(size, 'dense') else (256, 1024, 4096)
    return [dict(suite='dense', variant=variant, length=length, batch=8,
                 heads=8, head_dim=64, scale=1.0)
            for length in lengths for variant in DENSE_VARIANTS]


def scale_cases(size: str) -> list[dict[str, Any]]:
    """Smallest graphs first (their results predict the memory of the
    larger ones: see :func:`benchmarks.scale.skip_reason`)."""
    from benchmarks.graphs import GRAPH_KINDS

    return [dict(suite='scale', variant=variant, graph=kind, nodes=nodes,
                 edges=edges, heads=4, channels=64)
            for nodes, edges in SCALE_GRAPHS[size] for kind in GRAPH_KINDS
            for variant in SCALE_VARIANTS]


def _quick(size: str, suite: str) -> bool:
    if size not in ('full', 'quick'):
        raise ValueError(f"The {suite} suite has sizes 'full' and 'quick', "
                         f"not '{size}'")
    return size == 'quick'


def group_key(case: dict[str, Any]) -> tuple:
    """Cases compared with one baseline: everything but the variant."""
    return tuple((k, v) for k, v in sorted(case.items()) if k != 'variant')
