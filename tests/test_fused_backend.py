"""The fused sparse path of MetricAttentionConv against its message-passing
(scatter) path: same outputs, weights and gradients, no E x H x C tensor, and
'auto' choosing the path that can serve the call."""
from __future__ import annotations

import pytest
import torch
from conftest import random_graph
from torch.profiler import ProfilerActivity, profile
from torch_geometric.explain.algorithm.utils import clear_masks, set_masks

from pyg_metric_attn import MetricAttentionConv
from pyg_metric_attn.nn import edge_attention
from pyg_metric_attn.nn.sparse_attention import sparse_metric_attention
from pyg_metric_attn.utils.csr import HeadBlockCSR
from pyg_metric_attn.utils.point_sets import fully_connected_edge_index

METRICS = ['metric', 'l2', 'dot']


def messy_graph(num_src, num_dst, generator):
    """Random edges among all but the last three destinations (isolated), plus
    duplicated edges and self-loops."""
    edges = random_graph(num_src, num_dst - 3, 0.25, generator)
    duplicates = edges[:, :7]
    loops = torch.arange(0, min(num_src, num_dst - 3), 3).repeat(2, 1)
    return torch.cat([edges, duplicates, loops], 1)


def run(conv, backend, x, edge_index, edge_attr, seed=0):
    """Output, attention weights and all gradients for one backend."""
    conv.backend = backend
    conv.zero_grad()
    xs = [t.detach().requires_grad_() for t in (x if isinstance(x, tuple) else (x,))]
    torch.manual_seed(seed)  # the same dropout draw on both paths
    out, (ei, alpha) = conv(tuple(xs) if isinstance(x, tuple) else xs[0],
                            edge_index, edge_attr, return_attention_weights=True)
    weight = torch.linspace(-1, 1, out.numel(), dtype=out.dtype,
                            device=out.device).view_as(out)
    (out * weight).sum().backward()
    grads = [t.grad for t in xs] + [p.grad for p in conv.parameters()]
    return out.detach(), ei, alpha.detach(), grads


def rel_error(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def assert_same(fused, scatter, tolerance):
    """Outputs and weights within ``tolerance`` relative; each gradient within
    ``tolerance`` of the norm of all gradients (parameters whose gradient is
    analytically zero, e.g. phi's output bias, carry only rounding noise)."""
    assert torch.equal(fused[1], scatter[1])  # the same edges, same order
    assert rel_error(fused[0], scatter[0]) < tolerance
    assert rel_error(fused[2], scatter[2]) < tolerance
    total = torch.cat([grad.flatten() for grad in scatter[3]]).norm()
    for grad_fused, grad_scatter in zip(fused[3], scatter[3], strict=True):
        assert float((grad_fused - grad_scatter).norm() / total) < tolerance


CASES = {
    'heads-concat-edge-features': dict(heads=3, edge_dim=4, residual=True),
    'mean-value-free-learned-t': dict(heads=2, concat=False, value=False,
                                      learn_time_scale=True, time_scale=0.4),
    'self-loops-fill-mean': dict(heads=2, add_self_loops=True, edge_dim=4),
    'dropout': dict(heads=4, dropout=0.3),
}


@pytest.mark.parametrize('dtype,tolerance', [(torch.float32, 1e-5),
                                             (torch.float64, 1e-12)])
@pytest.mark.parametrize('metric', METRICS)
@pytest.mark.parametrize('case', list(CASES))
def test_fused_equals_scatter(case, metric, dtype, tolerance, device):
    g = torch.Generator().manual_seed(len(case))
    n = 40
    edge_index = messy_graph(n, n, g).to(device)
    edge_attr = torch.randn(edge_index.size(1), 4, generator=g,
                            dtype=dtype).to(device)
    x = torch.randn(n, 8, generator=g, dtype=dtype).to(device)
    torch.manual_seed(1)
    kwargs = dict(add_self_loops=False) | CASES[case]
    conv = MetricAttentionConv(8, 8, metric=metric, **kwargs).to(device, dtype)
    if kwargs.get('edge_dim') is None:
        edge_attr = None
    scatter = run(conv, 'scatter', x, edge_index, edge_attr)
    fused = run(conv, 'fused', x, edge_index, edge_attr)
    assert_same(fused, scatter, tolerance)
    if case == 'dropout':  # dropped weights are exact zeros on both paths
        assert torch.equal(fused[2] == 0, scatter[2] == 0)
        assert bool((fused[2] == 0).any())


@pytest.mark.parametrize('metric', METRICS)
def test_fused_equals_scatter_bipartite(metric):
    g = torch.Generator().manual_seed(5)
    n_src, n_dst = 31, 17
    edge_index = messy_graph(n_src, n_dst, g)
    x_src = torch.randn(n_src, 6, generator=g)
    x_dst = torch.randn(n_dst, 5, generator=g)
    torch.manual_seed(2)
    conv = MetricAttentionConv((6, 5), 4, heads=2, metric=metric,
                               add_self_loops=False)
    scatter = run(conv, 'scatter', (x_src, x_dst), edge_index, None)
    fused = run(conv, 'fused', (x_src, x_dst), edge_index, None)
    assert_same(fused, scatter, 1e-5)


@pytest.mark.parametrize('metric', METRICS)
def test_fused_gradcheck(metric, device):
    g = torch.Generator().manual_seed(6)
    edge_index = messy_graph(7, 7, g).to(device)
    edge_attr = torch.randn(edge_index.size(1), 2, dtype=torch.double,
                            generator=g).to(device)
    conv = MetricAttentionConv(4, 3, heads=2, metric=metric, edge_dim=2,
                               learn_time_scale=True, time_scale=0.5,
                               backend='fused', add_self_loops=False)
    conv = conv.to(device, torch.double)
    x = torch.randn(7, 4, dtype=torch.double, generator=g).to(device) \
        .requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x, *params: conv(x, edge_index, edge_attr),
        (x, *conv.parameters()), fast_mode=True)


def test_sparse_metric_attention_matches_dense_softmax():
    """The functional kernel against a dense masked softmax in float64."""
    g = torch.Generator().manual_seed(7)
    n_src, n_dst, H, D, C = 9, 6, 2, 3, 4
    edge_index = messy_graph(n_src, n_dst, g)
    q = torch.randn(n_dst, H, D, dtype=torch.double, generator=g) + 50
    k = torch.randn(n_src, H, D, dtype=torch.double, generator=g) + 50
    v = torch.randn(n_src, H, C, dtype=torch.double, generator=g)
    bias = torch.randn(edge_index.size(1), H, dtype=torch.double, generator=g)
    graph = HeadBlockCSR(edge_index, n_src, n_dst, H)
    out, weights = sparse_metric_attention(q, k, v, graph, 'l2', 0.7, bias)
    src, dst = edge_index
    logits = -(q[dst] - k[src]).square().sum(-1) / 0.7 + bias  # [E, H]
    expected_alpha = torch.zeros_like(logits)
    expected = torch.zeros(n_dst, H, C, dtype=torch.double)
    for i in range(n_dst):
        incoming = dst == i
        if incoming.any():
            expected_alpha[incoming] = torch.softmax(logits[incoming], 0)
            expected[i] = torch.einsum('eh,ehc->hc', expected_alpha[incoming],
                                       v[src[incoming]])
    assert torch.allclose(graph.to_edges(weights), expected_alpha, atol=1e-12)
    assert torch.allclose(out, expected, atol=1e-12)
    assert torch.all(out[-3:] == 0)  # isolated destinations


def test_head_block_csr_layout():
    g = torch.Generator().manual_seed(8)
    edge_index = messy_graph(5, 4, g)
    H, E = 3, edge_index.size(1)
    graph = HeadBlockCSR(edge_index, 5, 4, H)
    values = torch.randn(E, H, dtype=torch.double, generator=g)
    blocks = graph.from_edges(values)
    assert torch.equal(graph.to_edges(blocks), values)
    # Head h's matrix is the adjacency weighted by values[:, h] (duplicates
    # add), and every kernel computes with it.
    dense = torch.zeros(H, 4, 5, dtype=torch.double)
    for h in range(H):
        dense[h].index_put_((edge_index[1], edge_index[0]), values[:, h],
                            accumulate=True)
    eye_src = torch.eye(5, dtype=torch.double).expand(H, 5, 5)  # [H, N_src, N_src]
    eye_dst = torch.eye(4, dtype=torch.double).expand(H, 4, 4)
    assert torch.allclose(graph.aggregate(blocks, eye_src), dense)
    assert torch.allclose(graph.aggregate_transposed(blocks, eye_dst),
                          dense.transpose(1, 2))
    a = torch.randn(H, 4, 2, dtype=torch.double, generator=g)
    b = torch.randn(H, 5, 2, dtype=torch.double, generator=g)
    products = a @ b.transpose(1, 2)  # [H, 4, 5]
    expected = products[:, edge_index[1], edge_index[0]].t()  # [E, H]
    assert torch.allclose(graph.to_edges(graph.sampled_dot(a, b)), expected)
    rows = torch.randn(H * 4, dtype=torch.double, generator=g)
    assert torch.equal(graph.to_edges(graph.broadcast_rows(rows)),
                       rows.view(H, 4)[:, edge_index[1]].t())
    # Node-major [N, H, K] tensors enter as strided [H, N, K] views, and an
    # output can be written into one.
    node_values = torch.randn(5, H, 2, dtype=torch.double, generator=g)
    out = torch.empty(4, H, 2, dtype=torch.double)
    graph.aggregate(blocks, node_values.transpose(0, 1), out.transpose(0, 1))
    assert torch.allclose(out.transpose(0, 1),
                          dense @ node_values.transpose(0, 1))


def largest_allocation(fn) -> int:
    """Bytes of the largest CPU allocation made while running ``fn``."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max(event.self_cpu_memory_usage for event in prof.events())


@pytest.mark.parametrize('metric', METRICS)
def test_fused_never_allocates_per_edge_channels(metric):
    """Forward and backward of the fused path allocate nothing of E x H x C
    (or even E x C) size; the scatter path does (the check can fail)."""
    g = torch.Generator().manual_seed(9)
    n, H, C = 20, 4, 32
    edge_index = random_graph(n, n, 0.9, g)  # E ~ 360 >> n
    E = edge_index.size(1)
    x = torch.randn(n, C, generator=g, requires_grad=True)
    # Small phi so that no parameter (gradient) is as large as E x C.
    conv = MetricAttentionConv(C, C, heads=H, metric=metric, edge_dim=3,
                               metric_channels=4, mlp_channels=8, dropout=0.2,
                               add_self_loops=False)
    edge_attr = torch.randn(E, 3, generator=g)

    def forward_backward(backend):
        conv.backend = backend
        out, _ = conv(x, edge_index, edge_attr, return_attention_weights=True)
        out.sum().backward()

    per_edge_channels = E * C * x.element_size()
    assert largest_allocation(lambda: forward_backward('fused')) < per_edge_channels
    assert largest_allocation(lambda: forward_backward('scatter')) >= H * \
        per_edge_channels


def test_auto_picks_a_path_that_serves_the_call(monkeypatch):
    g = torch.Generator().manual_seed(10)
    edge_index = random_graph(12, 12, 0.3, g, self_loops=False)
    x = torch.randn(12, 6, generator=g)
    torch.manual_seed(0)
    conv = MetricAttentionConv(6, 4, heads=2)
    fused_calls = []

    def counting(*args, **kwargs):
        fused_calls.append(1)
        return sparse_metric_attention(*args, **kwargs)

    monkeypatch.setattr(edge_attention, 'sparse_metric_attention', counting)
    expected = conv(x, edge_index)
    assert len(fused_calls) == 1  # CPU float32: fused
    seen = []
    handle = conv.register_message_forward_hook(
        lambda module, inputs, out: seen.append(inputs[0]['alpha']))
    assert torch.allclose(conv(x, edge_index), expected, atol=1e-6)
    assert len(fused_calls) == 1 and seen[0].shape == (edge_index.size(1) + 12, 2)
    handle.remove()
    conv.backend = 'fused'
    # PyG explain mode masks the messages: fused serves no explanation.
    set_masks(conv, torch.ones(edge_index.size(1)), edge_index,
              apply_sigmoid=False)
    assert torch.allclose(conv(x, edge_index), expected, atol=1e-6)
    assert len(fused_calls) == 1
    clear_masks(conv)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        conv.backend = 'auto'
        conv(x, edge_index)  # half precision: scatter
        assert len(fused_calls) == 1
        conv.backend = 'fused'
        low = conv(x, edge_index)  # fused computes in float32
    assert len(fused_calls) == 2
    # Only the embeddings and the values are bfloat16 (each rounded once),
    # the rest float32: within 2 units of bfloat16's roundoff of the
    # largest output (measured 0.59 here, at most 1.65 over 20 seeds).
    unit = torch.finfo(torch.bfloat16).eps / 2
    torch.testing.assert_close(low.float(), expected, rtol=0,
                               atol=2 * unit * float(expected.abs().max()))


def test_backend_error():
    with pytest.raises(ValueError, match="Unknown backend 'cuda'"):
        MetricAttentionConv(4, 4, backend='cuda')


@pytest.mark.parametrize('metric', METRICS)
def test_point_set_mode_equals_fused_all_pairs_graph_with_gradients(metric):
    """Dense SDPA (augmented form, as gradients are needed) and the fused
    sparse path on the explicit all-pairs graph: the same outputs and
    gradients."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(21, 6, dtype=torch.double, generator=g) + 10.0
    batch = torch.tensor([0] * 5 + [1] * 12 + [2] * 4)
    torch.manual_seed(3)
    conv = MetricAttentionConv(6, 6, heads=2, metric=metric, residual=True,
                               learn_time_scale=True, time_scale=0.3,
                               backend='fused').double()
    results = []
    for dense in (True, False):
        conv.zero_grad()
        xi = x.clone().requires_grad_()
        out = (conv.forward_point_sets(xi, batch) if dense else
               conv(xi, fully_connected_edge_index(21, batch)))
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype)
         .view_as(out)).sum().backward()
        results.append([out, xi.grad] + [p.grad for p in conv.parameters()])
    for dense, sparse in zip(*results, strict=True):
        assert torch.allclose(dense, sparse, atol=1e-10)


def test_explicit_fused_under_dynamo_runs_eagerly():
    g = torch.Generator().manual_seed(12)
    edge_index = random_graph(15, 15, 0.3, g)
    x = torch.randn(15, 8, generator=g)
    conv = MetricAttentionConv(8, 4, heads=2, backend='fused',
                               add_self_loops=False)
    explanation = torch._dynamo.explain(conv)(x, edge_index)
    assert explanation.graph_break_count == 1  # around the sparse kernels
    compiled = torch.compile(conv, backend='eager')
    assert torch.allclose(compiled(x, edge_index), conv(x, edge_index), atol=1e-6)


@pytest.mark.parametrize('metric', METRICS)
def test_a_layer_keeps_no_copy_of_its_points_or_values(metric):
    """What the fused path keeps for its backward, per layer: the logits'
    key blocks b, and the query blocks a only where the ends differ ('dot':
    a tied map's a is b scaled, written again in the backward); the
    layer's own node-major values (read through strided views, no
    head-major copy); the weights."""
    g = torch.Generator().manual_seed(12)
    edge_index = random_graph(9, 9, 0.4, g)
    x = torch.randn(9, 6, generator=g, requires_grad=True)
    conv = MetricAttentionConv(6, 4, heads=2, metric=metric, backend='fused')
    out = conv(x, edge_index)
    nodes, stack = {}, [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None and type(node).__name__ not in nodes:
            nodes[type(node).__name__] = node
            stack.extend(next_node for next_node, _ in node.next_functions)
    kept = nodes['ExpandedLogitsBackward'].saved_tensors
    assert [t.shape for t in kept] == [(2, 9, 4 + (metric != 'dot'))] * (
        2 if metric == 'dot' else 1)
    weights, value = nodes['SparseAggregateBackward'].saved_tensors
    assert value.shape == (9, 2, 4) and value.is_contiguous()
    assert weights.dim() == 1  # [H E]
