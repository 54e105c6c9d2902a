"""Numerics of MetricAttentionConv on mini-batches of graphs (issue 14, part 1).

The reference is float64 attention by direct differences over the layer's own
(float32) embeddings, captured with forward hooks: that isolates the attention
computation from the rounding a float32 embedding of far-off inputs carries
anyway (about 4e-4 in alpha for a linear phi at offset 1e4, whatever the
attention does).
"""
from __future__ import annotations

import math
import os

import pytest
import torch
from torch_geometric.utils import softmax

from pyg_metric_attn import MetricAttentionConv
from pyg_metric_attn.nn.triton import HAVE_TRITON

METRICS = ['metric', 'l2', 'dot']
BACKENDS = ['fused', 'scatter']
# (backend, compiled); Triton runs in its interpreter without a GPU.
RUNS = [('fused', False), ('scatter', False), ('auto', True)] + (
    [('triton', False)] if HAVE_TRITON else [])


def far_apart_batch(offset: float, scale: float, num_graphs: int = 2,
                    num_nodes: int = 30, degree: int = 6, channels: int = 8,
                    seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Graphs of a mini-batch whose features sit around ``+offset``,
    ``-offset``, ...: ``x`` ``[G n, F]`` and ``edge_index`` within graphs."""
    generator = torch.Generator().manual_seed(seed)
    xs, edges = [], []
    for graph in range(num_graphs):
        centre = offset * (-1) ** graph
        xs.append(scale * torch.randn(num_nodes, channels, generator=generator)
                  + centre)
        edges.append(torch.randint(0, num_nodes, (2, num_nodes * degree),
                                   generator=generator) + graph * num_nodes)
    return torch.cat(xs), torch.cat(edges, dim=1)


def capture_embeddings(conv: MetricAttentionConv) -> dict:
    """Record the outputs of the layer's embedding maps on each call."""
    seen: dict = {}
    for name in ('embed_src', 'embed_dst'):
        module = getattr(conv, name)
        if module is not None:
            module.register_forward_hook(
                lambda _m, _i, out, name=name: seen.__setitem__(name, out))
    return seen


def reference_alpha(conv: MetricAttentionConv, seen: dict,
                    edge_index: torch.Tensor, num_dst: int) -> torch.Tensor:
    """float64 softmax of direct-difference logits of the captured points."""
    shape = (-1, conv.heads, conv.metric_channels)
    key = seen['embed_src'].double().view(shape)
    query = seen.get('embed_dst', seen['embed_src']).double().view(shape)
    src, dst = edge_index
    t = float(conv.time_scale)
    if conv.metric == 'dot':
        logits = (query[dst] * key[src]).sum(-1) / (math.sqrt(key.size(-1)) * t)
    else:
        logits = -(query[dst] - key[src]).square().sum(-1) / t
    return softmax(logits, dst, num_nodes=num_dst)


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('metric', METRICS)
@pytest.mark.parametrize('offset,scale', [(1e3, 1.0), (1e4, 1.0), (1e4, 1e2),
                                          (0.0, 1e4), (1e4, 1e4)])
def test_batched_graphs_far_apart_match_float64(metric, backend, offset, scale,
                                                device):
    torch.manual_seed(0)
    x, edge_index = (t.to(device) for t in far_apart_batch(offset, scale))
    conv = MetricAttentionConv(8, 4, heads=2, metric=metric,
                               backend=backend).to(device)
    seen = capture_embeddings(conv)
    out, (edges, alpha) = conv(x, edge_index, return_attention_weights=True)
    expected = reference_alpha(conv, seen, edges, x.size(0))
    assert alpha.dtype == torch.float32
    assert (alpha.double() - expected).abs().max() <= 1e-4
    assert out.isfinite().all()


def test_compiled_layer_matches_float64_on_far_apart_graphs():
    torch.manual_seed(0)
    x, edge_index = far_apart_batch(1e4, 1.0)
    conv = MetricAttentionConv(8, 4, heads=2, metric='l2', add_self_loops=False)
    seen = capture_embeddings(conv)
    compiled = torch.compile(conv, backend='aot_eager', fullgraph=True)
    _, (edges, alpha) = compiled(x, edge_index, return_attention_weights=True)
    expected = reference_alpha(conv, seen, edges, x.size(0))
    assert (alpha.double() - expected).abs().max() <= 1e-4


def skip_triton_where_it_cannot_run(backend: str, device: torch.device) -> None:
    """Triton runs CUDA tensors, and CPU ones only in its interpreter
    (``TRITON_INTERPRET=1``, which conftest.py sets where there is no GPU)."""
    if backend == 'triton' and device.type != 'cuda' \
            and os.environ.get('TRITON_INTERPRET') != '1':
        pytest.skip('Triton on CPU tensors needs TRITON_INTERPRET=1 (a GPU '
                    'machine runs these with --device cuda)')


def run_layer(conv, x, edge_index, compiled: bool):
    if compiled:
        conv = torch.compile(conv, backend='aot_eager', fullgraph=True)
    return conv(x, edge_index)


@pytest.mark.parametrize('bad', [float('nan'), float('inf')])
@pytest.mark.parametrize('backend,compiled', RUNS)
@pytest.mark.parametrize('metric', METRICS)
def test_a_bad_feature_stays_where_its_messages_go(metric, backend, compiled,
                                                   bad, device):
    skip_triton_where_it_cannot_run(backend, device)
    torch.manual_seed(0)
    x, edge_index = (t.to(device) for t in far_apart_batch(0.0, 1.0, num_nodes=20,
                                                           degree=2))
    conv = MetricAttentionConv(8, 4, heads=2, metric=metric, backend=backend,
                               add_self_loops=not compiled).to(device)
    clean = run_layer(conv, x, edge_index, compiled)
    x_bad = x.clone()
    x_bad[0, 3] = bad
    out = run_layer(conv, x_bad, edge_index, compiled)
    # Node 0 reaches its out-neighbours, and itself through its own query
    # wherever it receives messages (always with self-loops).
    reached = torch.zeros(x.size(0), dtype=torch.bool, device=device)
    reached[edge_index[1, edge_index[0] == 0]] = True
    reached[0] = conv.add_self_loops or bool((edge_index[1] == 0).any())
    assert not out[reached].isfinite().all()
    assert out[~reached].isfinite().all()
    torch.testing.assert_close(out[~reached], clean[~reached])


@pytest.mark.parametrize('backend,compiled', RUNS)
@pytest.mark.parametrize('metric', METRICS)
@pytest.mark.parametrize('scale', [1e19, 1e30])
def test_huge_features_give_finite_outputs(metric, backend, compiled, scale,
                                           device):
    """``x * 1e19``: float32 embeddings and values are finite, so is the
    float64 reference; the layer must be too and agree with it: weights
    within 1e-4, and the output (compiled or not) within 1e-4 of the value
    range (a weight error of 1e-4 moves it by that much)."""
    skip_triton_where_it_cannot_run(backend, device)
    torch.manual_seed(0)
    x, edge_index = (t.to(device) for t in far_apart_batch(0.0, 1.0,
                                                           num_nodes=20))
    x = x * scale
    conv = MetricAttentionConv(8, 4, heads=2, metric=metric, backend=backend,
                               add_self_loops=not compiled).to(device)
    out = run_layer(conv, x, edge_index, compiled)
    assert out.isfinite().all()
    seen = capture_embeddings(conv)
    _, (edges, alpha) = conv(x, edge_index, return_attention_weights=True)
    expected = reference_alpha(conv, seen, edges, x.size(0))
    assert (alpha.double() - expected).abs().max() <= 1e-4
    with torch.no_grad():
        values = conv._values(x).double()  # [N, H, C]
    src, dst = edges
    expected_out = torch.zeros_like(values).index_add_(
        0, dst, expected.unsqueeze(-1) * values[src]).flatten(1) + conv.bias
    torch.testing.assert_close(out.double(), expected_out, rtol=0,
                               atol=1e-4 * float(values.abs().max()))
