"""MetricAttentionConv against an independent dense float64 reference, plus
its PyG conventions (inputs, bipartite graphs, errors, numerics, compile)."""
from __future__ import annotations

import os

import pytest
import torch
from conftest import random_graph
from dense_reference import reference_forward
from hypothesis import given, settings
from hypothesis import strategies as st
from torch_geometric.typing import WITH_TORCH_SPARSE, SparseTensor
from torch_geometric.utils import (
    erdos_renyi_graph,
    to_torch_csc_tensor,
    to_torch_csr_tensor,
)

from pyg_metric_attn import MetricAttentionConv
from pyg_metric_attn.nn.triton import HAVE_TRITON

METRICS = ['metric', 'l2', 'dot']
BACKENDS = ['fused', 'scatter']


def rel_error(a, b):
    return float((a - b).detach().norm() / b.detach().norm().clamp_min(1e-300))


@pytest.mark.parametrize('metric', METRICS)
@pytest.mark.parametrize('add_self_loops', [True, False])
@pytest.mark.parametrize('heads,concat', [(1, True), (3, True), (3, False)])
@pytest.mark.parametrize('backend', BACKENDS)
def test_matches_dense_reference(metric, add_self_loops, heads, concat, backend,
                                 scatter_backend, device):
    g = torch.Generator().manual_seed(  # stable across processes
        100 * METRICS.index(metric) + 10 * add_self_loops + heads)
    torch.manual_seed(0)
    n = 23
    edge_index = random_graph(n, n, 0.2, g)
    x = torch.randn(n, 7, dtype=torch.double, generator=g)
    conv = MetricAttentionConv(7, 5, heads=heads, concat=concat, metric=metric,
                               add_self_loops=add_self_loops, residual=True,
                               time_scale=0.7, backend=backend).double()
    with torch.no_grad():
        conv.bias.normal_()
    out, (ei, alpha) = conv.to(device)(x.to(device), edge_index.to(device),
                                       return_attention_weights=True)
    conv, out, ei, alpha = conv.cpu(), out.cpu(), ei.cpu(), alpha.cpu()
    ref_out, ref_attention = reference_forward(conv, x, x, edge_index)
    assert out.shape == (n, 5 * heads if concat else 5)
    assert rel_error(out, ref_out) < 1e-6
    assert alpha.shape == (ei.size(1), heads)
    assert rel_error(alpha, ref_attention[:, ei[1], ei[0]].T) < 1e-6
    # Every edge of the reference carries a weight in alpha and vice versa:
    assert int((ref_attention > 0).sum()) == alpha.numel()


@pytest.mark.parametrize('metric', METRICS)
@pytest.mark.parametrize('backend', BACKENDS)
def test_value_free_edge_features_bipartite_match_reference(metric, backend,
                                                            device):
    g = torch.Generator().manual_seed(1)
    n_src, n_dst = 17, 11
    edge_index = random_graph(n_src, n_dst, 0.3, g)
    edge_attr = torch.randn(edge_index.size(1), 4, dtype=torch.double, generator=g)
    x_src = torch.randn(n_src, 6, dtype=torch.double, generator=g)
    x_dst = torch.randn(n_dst, 6, dtype=torch.double, generator=g)
    conv = MetricAttentionConv(6, 6, heads=2, metric=metric, value=False,
                               edge_dim=4, metric_channels=3, mlp_channels=9,
                               backend=backend).double()
    out = conv.to(device)((x_src.to(device), x_dst.to(device)),
                          edge_index.to(device), edge_attr.to(device)).cpu()
    conv.cpu()
    ref_out, _ = reference_forward(conv, x_src, x_dst, edge_index, edge_attr)
    assert rel_error(out, ref_out) < 1e-6


def test_unequal_bipartite_widths_use_one_map_per_side():
    g = torch.Generator().manual_seed(2)
    edge_index = random_graph(9, 6, 0.4, g)
    x_src = torch.randn(9, 5, dtype=torch.double, generator=g)
    x_dst = torch.randn(6, 3, dtype=torch.double, generator=g)
    conv = MetricAttentionConv((5, 3), 4, heads=2, add_self_loops=False).double()
    assert conv.embed_dst is not None
    out = conv((x_src, x_dst), edge_index)
    ref_out, _ = reference_forward(conv, x_src, x_dst, edge_index)
    assert rel_error(out, ref_out) < 1e-6


@pytest.mark.parametrize('metric', METRICS)
@pytest.mark.parametrize('backend', BACKENDS)
def test_gradcheck(metric, backend, device):
    g = torch.Generator().manual_seed(3)
    edge_index = random_graph(8, 8, 0.4, g).to(device)
    edge_attr = torch.randn(edge_index.size(1), 2, dtype=torch.double,
                            generator=g).to(device)
    conv = MetricAttentionConv(4, 3, heads=2, metric=metric, edge_dim=2,
                               learn_time_scale=True, time_scale=0.5,
                               backend=backend).double().to(device)
    x = torch.randn(8, 4, dtype=torch.double, generator=g).to(device) \
        .requires_grad_()
    params = [p for p in conv.parameters()]

    def f(x, *params):
        return conv(x, edge_index, edge_attr)

    # CUDA's scatter-add is atomic: a second backward may differ in the last
    # bits ("not reentrant"), a tolerance PyG's own gradchecks give too.
    assert torch.autograd.gradcheck(f, (x, *params), nondet_tol=1e-10)


@pytest.mark.parametrize('metric', ['metric', 'l2'])
def test_self_loop_has_largest_weight_and_rows_sum_to_one(metric):
    g = torch.Generator().manual_seed(4)
    edge_index = random_graph(30, 30, 0.15, g)
    conv = MetricAttentionConv(8, 8, heads=3, metric=metric)
    x = torch.randn(30, 8, generator=g) * 3
    _, (ei, alpha) = conv(x, edge_index, return_attention_weights=True)
    src, dst = ei
    for i in range(30):
        incoming = dst == i
        loop = incoming & (src == i)
        assert loop.sum() == 1
        row = alpha[incoming]
        assert torch.allclose(row.sum(0), torch.ones(3), atol=1e-6)
        assert torch.all(alpha[loop][0] >= row.max(0).values - 1e-7)


def test_dot_self_loop_need_not_win():
    """The dot product is no metric: a node can prefer a neighbour to itself."""
    conv = MetricAttentionConv(2, 2, metric='dot', metric_channels=2)
    with torch.no_grad():
        conv.embed_src.weight.copy_(torch.eye(2))
        conv.embed_dst.weight.copy_(torch.eye(2))
    x = torch.tensor([[1.0, 0.0], [5.0, 0.0]])
    _, (ei, alpha) = conv(x, torch.tensor([[1], [0]]), return_attention_weights=True)
    loop = (ei[0] == 0) & (ei[1] == 0)
    assert alpha[loop].item() < 0.5


@settings(max_examples=25, deadline=None)
@given(num_nodes=st.integers(1, 12), seed=st.integers(0, 2**16),
       metric=st.sampled_from(METRICS))
def test_node_permutation_equivariance(num_nodes, seed, metric):
    g = torch.Generator().manual_seed(seed)
    edge_index = random_graph(num_nodes, num_nodes, 0.3, g)
    x = torch.randn(num_nodes, 5, dtype=torch.double, generator=g)
    torch.manual_seed(seed)
    conv = MetricAttentionConv(5, 4, heads=2, metric=metric).double()
    perm = torch.randperm(num_nodes, generator=g)
    inverse = torch.empty_like(perm)
    inverse[perm] = torch.arange(num_nodes)
    out = conv(x, edge_index)
    out_perm = conv(x[perm], inverse[edge_index])
    assert torch.allclose(out_perm, out[perm], atol=1e-10)


@settings(max_examples=25, deadline=None)
@given(num_nodes=st.integers(1, 12), seed=st.integers(0, 2**16),
       metric=st.sampled_from(METRICS))
def test_edge_order_invariance(num_nodes, seed, metric):
    g = torch.Generator().manual_seed(seed)
    edge_index = random_graph(num_nodes, num_nodes, 0.3, g)
    edge_attr = torch.randn(edge_index.size(1), 3, dtype=torch.double, generator=g)
    x = torch.randn(num_nodes, 5, dtype=torch.double, generator=g)
    conv = MetricAttentionConv(5, 4, heads=2, metric=metric, edge_dim=3,
                               add_self_loops=False).double()
    order = torch.randperm(edge_index.size(1), generator=g)
    out, (_, alpha) = conv(x, edge_index, edge_attr, return_attention_weights=True)
    out2, (_, alpha2) = conv(x, edge_index[:, order], edge_attr[order],
                             return_attention_weights=True)
    assert torch.allclose(out, out2, atol=1e-10)
    assert torch.allclose(alpha[order], alpha2, atol=1e-12)


def test_bipartite_sparse_weights_keep_the_adjacency_size():
    """The weights come back in an adjacency of the input's size, also where
    the last sources and destinations have no edge."""
    g = torch.Generator().manual_seed(16)
    edge_index = random_graph(6, 4, 0.5, g)  # sources 0-5 -> destinations 0-3
    x_src, x_dst = torch.randn(9, 8, generator=g), torch.randn(7, 8, generator=g)
    conv = MetricAttentionConv(8, 4, heads=2, add_self_loops=False)
    adj = to_torch_csr_tensor(edge_index.flip(0), size=(7, 9))
    _, (sparse_alpha, _) = conv((x_src, x_dst), adj, size=(9, 7),
                                return_attention_weights=True)
    assert sparse_alpha.shape[:2] == (7, 9)


def test_sparse_adjacency_formats_agree():
    g = torch.Generator().manual_seed(5)
    edge_index = random_graph(20, 20, 0.2, g)
    x = torch.randn(20, 8, generator=g)
    conv = MetricAttentionConv(8, 4, heads=2)
    expected, (ei, alpha) = conv(x, edge_index, return_attention_weights=True)
    adj_t = torch.stack([edge_index[1], edge_index[0]])
    for adj in (to_torch_csr_tensor(adj_t, size=(20, 20)),
                to_torch_csc_tensor(adj_t, size=(20, 20)),
                torch.sparse_coo_tensor(adj_t, torch.ones(adj_t.size(1)),
                                        (20, 20))):
        # As GATConv: (out, (adj, alpha)), alpha in adj's own value order.
        out, (sparse_alpha, values) = conv(x, adj, return_attention_weights=True)
        assert torch.allclose(out, expected, atol=1e-6)
        assert sparse_alpha.layout == adj.layout
        assert torch.equal(values, sparse_alpha.values())
        dense = sparse_alpha.to_dense()  # [N_dst, N_src, H]
        assert torch.allclose(dense[ei[1], ei[0]], alpha, atol=1e-6)


@pytest.mark.skipif(not WITH_TORCH_SPARSE, reason="torch-sparse is not installed "
                    "(SparseTensor inputs need it)")
def test_sparse_tensor_input():
    g = torch.Generator().manual_seed(6)
    edge_index = random_graph(15, 15, 0.3, g)
    x = torch.randn(15, 8, generator=g)
    conv = MetricAttentionConv(8, 4, heads=2)
    expected, (ei, alpha) = conv(x, edge_index, return_attention_weights=True)
    adj = SparseTensor(row=edge_index[1], col=edge_index[0], sparse_sizes=(15, 15))
    out, adj_alpha = conv(x, adj, return_attention_weights=True)
    assert torch.allclose(out, expected, atol=1e-6)
    assert isinstance(adj_alpha, SparseTensor)
    assert torch.allclose(adj_alpha.to_dense()[ei[1], ei[0]], alpha, atol=1e-6)


def test_bipartite_with_none_destination_and_size():
    g = torch.Generator().manual_seed(7)
    x = torch.randn(10, 6, generator=g)
    edge_index = random_graph(10, 4, 0.5, g)
    conv = MetricAttentionConv(6, 3, heads=2)
    out = conv((x, None), edge_index, size=(10, 4))
    assert out.shape == (4, 6)
    # The destination nodes are the first size[1] source nodes:
    assert torch.allclose(out, conv((x, x[:4]), edge_index), atol=1e-6)


def test_empty_graph_and_isolated_nodes():
    conv = MetricAttentionConv(4, 3, heads=2, add_self_loops=False)
    x = torch.randn(5, 4, requires_grad=True)
    out, (ei, alpha) = conv(x, torch.empty(2, 0, dtype=torch.long),
                            return_attention_weights=True)
    assert out.shape == (5, 6) and ei.shape == (2, 0) and alpha.shape == (0, 2)
    assert torch.allclose(out, conv.bias.expand(5, 6))
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    no_nodes = conv(torch.empty(0, 4), torch.empty(2, 0, dtype=torch.long))
    assert no_nodes.shape == (0, 6)
    # Node 2 has no incoming edge: its output is the bias alone.
    out = conv(x, torch.tensor([[0, 1], [1, 0]]))
    assert torch.allclose(out[2], conv.bias)


def test_far_from_origin_and_huge_inputs_stay_finite():
    g = torch.Generator().manual_seed(8)
    edge_index = random_graph(25, 25, 0.2, g)
    x = torch.randn(25, 8, generator=g)
    for metric in METRICS:
        conv = MetricAttentionConv(8, 8, heads=2, metric=metric, value=False)
        huge = (x * 1e4).requires_grad_()
        out = conv(huge, edge_index)
        out.square().mean().backward()
        assert torch.isfinite(out).all() and torch.isfinite(huge.grad).all()
    # Translation invariance far from the origin ('metric' with value=False
    # and P = I: phi(u + c) - phi(v + c) depends on c only through tanh).
    conv = MetricAttentionConv(8, 8, metric='l2', value=False, bias=False)
    shift = 1e3 * torch.ones(8)
    out, (_, alpha) = conv(x, edge_index, return_attention_weights=True)
    out_far, (_, alpha_far) = conv(x + shift, edge_index,
                                   return_attention_weights=True)
    assert torch.allclose(alpha_far, alpha, atol=1e-3)


def _triton_runs_on(device: torch.device) -> bool:
    """Triton runs CUDA tensors, and CPU ones in its interpreter only."""
    return HAVE_TRITON and (device.type == 'cuda'
                            or os.environ.get('TRITON_INTERPRET') == '1')


@pytest.mark.parametrize('dtype,metric,backend', [
    *((dtype, metric, 'auto') for dtype in (torch.float16, torch.bfloat16)
      for metric in METRICS),
    (torch.bfloat16, 'metric', 'triton')])  # seconds in the interpreter
def test_autocast_low_precision_is_finite(dtype, metric, backend, device):
    if backend == 'triton' and not _triton_runs_on(device):
        pytest.skip('Triton on CPU tensors needs TRITON_INTERPRET=1')
    g = torch.Generator().manual_seed(9)
    edge_index = random_graph(40, 40, 0.2, g).to(device)
    x = (torch.randn(40, 16, generator=g) * 30).to(device).requires_grad_()
    torch.manual_seed(0)
    conv = MetricAttentionConv(16, 8, heads=4, metric=metric,
                               backend=backend).to(device)
    with torch.autocast(device.type, dtype=dtype):
        out, (_, alpha) = conv(x, edge_index, return_attention_weights=True)
    # As GATConv's: the weights in float32 (logits and softmax run in
    # float32) on every backend and device ('auto' is Triton on CUDA).
    assert alpha.dtype == torch.float32
    out.float().sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    # At unit scale the low-precision result is float32's within 6 units
    # of the dtype's roundoff of the largest output: inputs, weights,
    # embeddings and values each rounded once (measured at most 1.85 here,
    # 3.06 over 20 seeds; Triton in its interpreter 2.52 over 5).
    x = x.detach() / 30
    with torch.no_grad():
        with torch.autocast(device.type, dtype=dtype):
            out = conv(x, edge_index)
        expected = conv(x, edge_index)
    unit = torch.finfo(dtype).eps / 2
    torch.testing.assert_close(out.float(), expected, rtol=0,
                               atol=6 * unit * float(expected.abs().max()))


def test_learned_time_scale_is_positive_and_trains():
    conv = MetricAttentionConv(4, 4, learn_time_scale=True, time_scale=2.0)
    assert torch.isclose(conv.time_scale, torch.tensor(2.0))
    x = torch.randn(6, 4)
    edge_index = torch.tensor([[0, 1, 2, 3, 4, 5], [1, 2, 3, 4, 5, 0]])
    conv(x, edge_index).square().sum().backward()
    assert conv.time.log_value.grad is not None
    with torch.no_grad():
        conv.time.log_value.fill_(-50.0)
    assert conv.time_scale > 0
    conv.reset_parameters()
    assert torch.isclose(conv.time_scale, torch.tensor(2.0))


def test_time_scale_sharpens_attention():
    g = torch.Generator().manual_seed(10)
    edge_index = random_graph(20, 20, 0.3, g)
    x = torch.randn(20, 4, generator=g)
    entropies = []
    for t in (10.0, 1.0, 0.1):
        torch.manual_seed(0)
        conv = MetricAttentionConv(4, 4, time_scale=t)
        _, (_, alpha) = conv(x, edge_index, return_attention_weights=True)
        entropies.append(float(-(alpha * alpha.clamp_min(1e-30).log()).sum()))
    assert entropies[0] > entropies[1] > entropies[2]


def test_paper_time_scale_saturates_at_width_and_2d_does_not():
    """The trends nn/time_scale.py documents: with t = 1 the self-loop takes
    nearly all attention from D = 8 on, 'matched' softens it, t = 2D keeps
    it soft at every width (uniform weights: 1/11)."""
    torch.manual_seed(0)
    edge_index = erdos_renyi_graph(500, 10 / 500)

    def self_loop_weight(dim, time_scale):
        torch.manual_seed(0)
        conv = MetricAttentionConv(dim, dim, time_scale=time_scale)
        _, (edges, alpha) = conv(torch.randn(500, dim), edge_index,
                                 return_attention_weights=True)
        return float(alpha[edges[0] == edges[1]].mean())

    assert self_loop_weight(4, 1.0) > 0.6
    assert self_loop_weight(8, 1.0) > 0.95
    assert self_loop_weight(16, 1.0) > 0.99
    assert self_loop_weight(8, 'matched') < 0.7
    for dim in (4, 16, 64):
        assert self_loop_weight(dim, 2.0 * dim) < 0.35


def test_repr_and_reset_parameters():
    """Reset draws the glorot maps anew (uniform within their bound, which
    so many draws nearly reach; the edge map's 2 x 40 too) and zeroes the
    bias; the value, edge and residual maps have no bias."""
    conv = MetricAttentionConv(16, 32, heads=2, metric='l2', edge_dim=40,
                               residual=True)
    assert repr(conv) == "MetricAttentionConv(16, 32, heads=2, metric='l2')"
    assert all(module.bias is None
               for module in (conv.lin_value, conv.lin_edge, conv.res))
    with torch.no_grad():
        conv.bias.fill_(1.0)
    before = {key: p.detach().clone() for key, p in conv.named_parameters()}
    conv.reset_parameters()
    assert torch.equal(conv.bias, torch.zeros(64))
    for key in ('embed_src.weight', 'lin_value.weight', 'lin_edge.weight',
                'res.weight'):
        weight = conv.get_parameter(key).detach()
        bound = (6 / sum(weight.shape)) ** 0.5  # glorot: sqrt(6 / (in + out))
        assert not torch.equal(weight, before[key]), key
        assert 0.8 * bound < float(weight.abs().max()) <= bound, key


def test_documented_defaults_and_maps():
    """The defaults the docstring gives (the paper's t = 1, not learned, 3
    Sinkhorn steps), one tied map for a tuple of equal widths, none for the
    values with ``value=False``."""
    conv = MetricAttentionConv(6, 4)
    assert (conv.time_scale, conv.time.learn, conv.sinkhorn_iterations,
            conv.normalization, conv.backend) == (1.0, False, 3, 'row', 'auto')
    assert MetricAttentionConv((6, 6), 4).embed_dst is None
    assert MetricAttentionConv((6, 5), 4).embed_dst is not None
    assert MetricAttentionConv(6, 6, value=False).lin_value is None
    assert MetricAttentionConv(6, 6, residual=False).res is None


def test_same_seed_same_result():
    def run():
        torch.manual_seed(123)
        conv = MetricAttentionConv(8, 4, heads=2, dropout=0.3)
        x = torch.randn(12, 8)
        edge_index = torch.randint(0, 12, (2, 40))
        return conv(x, edge_index)
    assert torch.equal(run(), run())


def test_dropout_only_in_training():
    torch.manual_seed(0)
    conv = MetricAttentionConv(8, 4, dropout=0.5)
    x, edge_index = torch.randn(12, 8), torch.randint(0, 12, (2, 40))
    conv.eval()
    assert torch.equal(conv(x, edge_index), conv(x, edge_index))
    conv.train()
    assert not torch.equal(conv(x, edge_index), conv(x, edge_index))


@pytest.mark.parametrize('make_call,error,match', [
    (lambda c: c(torch.randn(5, 3), torch.tensor([[0], [1]])), ValueError,
     'built for 8'),
    (lambda c: c(torch.randn(5), torch.tensor([[0], [1]])), ValueError,
     r'shape \[num_nodes, 8\]'),
    (lambda c: c(torch.randint(0, 3, (5, 8)), torch.tensor([[0], [1]])), TypeError,
     'floating-point'),
    (lambda c: c(torch.randn(5, 8), torch.tensor([[0, 1, 2]])), ValueError,
     r'shape \[2, num_edges\]'),
    (lambda c: c(torch.randn(5, 8), torch.tensor([[0.0], [1.0]])), TypeError,
     'integer'),
    (lambda c: c(torch.randn(5, 8), torch.tensor([[0], [7]])), IndexError,
     'destination index 7 is out of range for 5'),
    (lambda c: c(torch.randn(5, 8), torch.tensor([[-1], [0]])), IndexError,
     'negative'),
    (lambda c: c(torch.randn(5, 8), torch.tensor([[0], [1]]), torch.randn(1, 2)),
     ValueError, 'without .edge_dim.'),
    (lambda c: c((torch.randn(5, 8), torch.randn(3, 8)), torch.tensor([[0], [1]]),
                 size=(5, 4)), ValueError, "'x_dst' has 3 rows"),
    (lambda c: c(torch.randn(5, 8), 'edges'), TypeError, 'SparseTensor'),
])
def test_clear_errors(make_call, error, match):
    conv = MetricAttentionConv(8, 4)
    with pytest.raises(error, match=match):
        make_call(conv)


def test_constructor_errors():
    with pytest.raises(ValueError, match="'out_channels' .* must equal"):
        MetricAttentionConv(8, 4, value=False)
    with pytest.raises(ValueError, match=r"'out_channels' \(2\) must equal "
                                         r"the source 'in_channels' \(1\)"):
        MetricAttentionConv(1, 2, value=False)
    for name in ('heads', 'out_channels'):
        kwargs = {'heads': 1, 'out_channels': 4, name: 0}
        with pytest.raises(ValueError, match=f"^'{name}' must be a positive "
                                             f"integer, got 0$"):
            MetricAttentionConv(8, **kwargs)
    with pytest.raises(ValueError, match='Unknown metric'):
        MetricAttentionConv(8, 4, metric='cosine')
    with pytest.raises(ValueError, match='time_scale'):
        MetricAttentionConv(8, 4, time_scale=0.0)


def test_edge_attr_shape_error():
    conv = MetricAttentionConv(8, 4, edge_dim=3)
    with pytest.raises(ValueError, match=r'edge_attr.*\[1, 3\]'):
        conv(torch.randn(5, 8), torch.tensor([[0], [1]]), torch.randn(2, 3))


def same_set_pairs(batch):
    """Every ordered pair of points of one set, ``[2, E]`` (self-pairs too)."""
    dst, src = (batch[:, None] == batch[None, :]).nonzero(as_tuple=True)
    return torch.stack([src, dst])


@pytest.mark.parametrize('normalization', ['row', 'sinkhorn', 'global'])
@pytest.mark.parametrize('metric', METRICS)
def test_point_sets_equal_the_dense_reference(metric, normalization):
    """``forward_point_sets`` is the layer on every set's all-pairs graph:
    the dense reference's output with a time scale, a residual map, two
    heads and the normalisation (float64)."""
    g = torch.Generator().manual_seed(12)
    x = torch.randn(9, 5, dtype=torch.double, generator=g)
    batch = torch.tensor([0] * 4 + [1] * 5)
    torch.manual_seed(0)
    conv = MetricAttentionConv(5, 3, heads=2, metric=metric, residual=True,
                               time_scale=0.7, normalization=normalization
                               ).double()
    with torch.no_grad():
        conv.bias.normal_(generator=g)
    expected, _ = reference_forward(
        conv, x, x, same_set_pairs(batch),
        batch=batch if normalization == 'global' else None)
    torch.testing.assert_close(conv.forward_point_sets(x, batch), expected,
                               rtol=1e-10, atol=1e-12)


def test_point_set_dropout_only_in_training():
    """Evaluation: the dense reference; training: weights dropped (another
    output each draw), unbiased on average (200 draws within 5 standard
    errors of the evaluation output)."""
    g = torch.Generator().manual_seed(13)
    x = torch.randn(6, 4, dtype=torch.double, generator=g)
    torch.manual_seed(0)
    conv = MetricAttentionConv(4, 4, dropout=0.5, time_scale=5.0).double()
    batch = torch.zeros(6, dtype=torch.long)
    expected, _ = reference_forward(conv, x, x, same_set_pairs(batch))
    torch.testing.assert_close(conv.eval().forward_point_sets(x), expected)
    conv.train()
    with torch.no_grad():
        draws = torch.stack([conv.forward_point_sets(x) for _ in range(200)])
    assert (draws[0] - expected).abs().max() > 1e-3
    error = (draws.mean(0) - expected).abs()
    assert bool((error <= 5 * draws.std(0) / 200 ** 0.5).all()), error.max()


@pytest.mark.parametrize('backend', BACKENDS)
def test_dropout_zeroes_weights_with_probability_p_and_scales_the_rest(backend):
    """Training with ``dropout=0.3``: about 30% of the returned weights are
    0 (here 3000 of them, within 4 standard deviations), the others are the
    evaluation weights divided by 0.7."""
    g = torch.Generator().manual_seed(14)
    edge_index = random_graph(50, 50, 0.2, g)
    x = torch.randn(50, 6, generator=g)
    torch.manual_seed(0)
    conv = MetricAttentionConv(6, 4, heads=6, dropout=0.3, backend=backend)
    _, (_, plain) = conv.eval()(x, edge_index, return_attention_weights=True)
    _, (_, dropped) = conv.train()(x, edge_index, return_attention_weights=True)
    kept = dropped != 0
    fraction = 1 - float(kept.float().mean())
    assert abs(fraction - 0.3) < 4 * (0.3 * 0.7 / kept.numel()) ** 0.5
    torch.testing.assert_close(dropped[kept], plain[kept] / 0.7)


def test_one_dimensional_edge_attr_is_one_feature_per_edge():
    """``edge_attr`` of shape ``[E]`` with ``edge_dim=1`` is ``[E, 1]``."""
    g = torch.Generator().manual_seed(15)
    edge_index = random_graph(12, 12, 0.3, g, self_loops=False)
    x = torch.randn(12, 4, generator=g)
    edge_attr = torch.randn(edge_index.size(1), generator=g)
    conv = MetricAttentionConv(4, 4, heads=2, edge_dim=1)
    out = conv(x, edge_index, edge_attr)
    torch.testing.assert_close(out, conv(x, edge_index, edge_attr[:, None]))
    assert (out - conv(x, edge_index, 2 * edge_attr)).abs().max() > 1e-4


@pytest.mark.parametrize('make_call,match', [
    (lambda c: c((torch.randn(5, 3), torch.randn(4, 8)),
                 torch.tensor([[0], [1]])),
     r"^'x_src' has 3 channels but the layer was built for 8 \(shape \[5, 3\]\)$"),
    (lambda c: c((torch.randn(5, 8), torch.randn(4, 3)),
                 torch.tensor([[0], [1]])),
     r"^'x_dst' has 3 channels but the layer was built for 8 \(shape \[4, 3\]\)$"),
    (lambda c: c(torch.randn(5, 3), torch.tensor([[0], [1]])),
     r"^'x' has 3 channels but the layer was built for 8 \(shape \[5, 3\]\)$"),
    (lambda c: c(torch.randn(5, 8), torch.tensor([[0], [1]]), torch.randn(1, 2)),
     r"^'edge_attr' was given but the layer was built without 'edge_dim'$"),
    (lambda c: c.forward_point_sets(torch.randn(5, 3)),
     r"^'x' has 3 channels but the layer was built for 8 \(shape \[5, 3\]\)$"),
    (lambda c: c.forward_point_sets(torch.randn(3, 8), torch.tensor([1, 0, 1])),
     r"^'batch' must be sorted \(points of a set contiguous\)$"),
])
def test_errors_name_the_input_in_full(make_call, match):
    with pytest.raises(ValueError, match=match):
        make_call(MetricAttentionConv(8, 4))


def test_point_set_mode_needs_int_in_channels_in_full():
    with pytest.raises(ValueError, match=r"^Point-set attention runs within one "
                       r"set of points: build the layer with an int "
                       r"'in_channels'$"):
        MetricAttentionConv((6, 6), 4).forward_point_sets(torch.randn(3, 6))
