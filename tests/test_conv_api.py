"""MetricAttentionConv where GATConv users rely on it (issue 14, part 2):
sparse adjacencies with edge features, ``aggr``, what ``forward`` returns,
and clear constructor errors."""
from __future__ import annotations

import copy

import pytest
import torch
from conftest import random_graph
from dense_reference import float64_reference, reference_forward
from torch_geometric.typing import WITH_TORCH_SPARSE, SparseTensor
from torch_geometric.utils import to_torch_coo_tensor, to_torch_csr_tensor

from pyg_metric_attn import MetricAttentionConv

BACKENDS = ['fused', 'scatter']


def graph_with_edge_features(seed: int = 0, num_nodes: int = 15,
                             edge_dim: int = 3):
    g = torch.Generator().manual_seed(seed)
    edge_index = random_graph(num_nodes, num_nodes, 0.3, g, self_loops=False)
    x = torch.randn(num_nodes, 8, generator=g)
    edge_attr = torch.randn(edge_index.size(1), edge_dim, generator=g)
    return x, edge_index, edge_attr


def sparse_adjacencies(edge_index, edge_attr, num_nodes):
    """The graph as torch.sparse COO and CSR (and SparseTensor) adjacencies
    whose values are the edge features."""
    dst_src = edge_index.flip(0)
    size = (num_nodes, num_nodes)
    adjacencies = {'coo': to_torch_coo_tensor(dst_src, edge_attr, size=size),
                   'csr': to_torch_csr_tensor(dst_src, edge_attr, size=size)}
    if WITH_TORCH_SPARSE:
        adjacencies['sparse_tensor'] = SparseTensor(
            row=edge_index[1], col=edge_index[0], value=edge_attr,
            sparse_sizes=size)
    return adjacencies


@pytest.mark.parametrize('backend', BACKENDS)
def test_sparse_adjacency_values_are_the_edge_features(backend, device):
    x, edge_index, edge_attr = (t.to(device) for t in graph_with_edge_features())
    conv = MetricAttentionConv(8, 4, heads=2, edge_dim=3,
                               backend=backend).to(device)
    expected = conv(x, edge_index, edge_attr)
    without = conv(x, edge_index)
    assert not torch.allclose(expected, without, atol=1e-3)
    for name, adj in sparse_adjacencies(edge_index, edge_attr, 15).items():
        torch.testing.assert_close(conv(x, adj), expected, msg=name)


def test_edge_features_given_twice_raise():
    x, edge_index, edge_attr = graph_with_edge_features()
    conv = MetricAttentionConv(8, 4, edge_dim=3)
    adj = sparse_adjacencies(edge_index, edge_attr, 15)['coo']
    with pytest.raises(ValueError, match='given twice'):
        conv(x, adj, edge_attr)


def test_sparse_values_are_ignored_without_edge_dim():
    """As in GATConv: a layer without edge features reads only the pattern."""
    x, edge_index, edge_attr = graph_with_edge_features()
    conv = MetricAttentionConv(8, 4, heads=2)
    adj = sparse_adjacencies(edge_index, edge_attr[:, 0], 15)['csr']
    torch.testing.assert_close(conv(x, adj), conv(x, edge_index))


@pytest.mark.parametrize('aggr', ['mean', 'sum', 'add'])
def test_aggr_is_honoured_on_every_backend(aggr, device):
    x, edge_index, _ = (t.to(device) for t in graph_with_edge_features())
    torch.manual_seed(0)
    fused = MetricAttentionConv(8, 4, heads=2, aggr=aggr,
                                backend='fused').to(device)
    scatter = MetricAttentionConv(8, 4, heads=2, aggr=aggr,
                                  backend='scatter').to(device)
    scatter.load_state_dict(fused.state_dict())
    torch.testing.assert_close(fused(x, edge_index), scatter(x, edge_index))


@pytest.mark.parametrize('backend', ['fused', 'triton'])
@pytest.mark.parametrize('aggr', ['max', 'min', 'mul'])
def test_a_named_backend_refuses_an_aggr_it_does_not_compute(backend, aggr):
    with pytest.raises(ValueError, match=f"backend='{backend}' computes aggr "
                                         f"'add', 'sum' or 'mean'.*'{aggr}'"):
        MetricAttentionConv(8, 4, aggr=aggr, backend=backend)


@pytest.mark.parametrize('backend', ['auto', 'scatter'])
@pytest.mark.parametrize('aggr', ['max', 'min'])
def test_max_and_min_reduce_the_weighted_messages(backend, aggr):
    """Against a per-node reduction written out by hand from the dense
    reference's weights and the raw value weights: message ``alpha_ij W_v
    x_j`` reduced over the in-edges of ``i`` (float32 against float64:
    rtol 1e-5)."""
    x, edge_index, _ = graph_with_edge_features()
    torch.manual_seed(0)
    conv = MetricAttentionConv(8, 4, heads=2, aggr=aggr, bias=False,
                               backend=backend)
    out = conv(x, edge_index)
    _, attention = float64_reference(conv, x, edge_index)  # [H, N, N]
    weight = conv.lin_value.weight.detach().double()
    values = (x.double() @ weight.T).view(-1, 2, 4)
    reduce = torch.amax if aggr == 'max' else torch.amin
    for node in range(x.size(0)):
        sources = attention[0, node].nonzero().view(-1)  # self-loop included
        messages = attention[:, node, sources].T.unsqueeze(-1) * values[sources]
        torch.testing.assert_close(out[node].double(),
                                   reduce(messages, 0).flatten(),
                                   rtol=1e-5, atol=1e-6)


FILL_VALUES = {'number': 0.5, 'vector': torch.tensor([1.0, -2.0, 0.5]),
               'add': 'add', 'max': 'max', 'min': 'min', 'mul': 'mul'}


@pytest.mark.parametrize('backend', ['fused', 'scatter', 'triton'])
@pytest.mark.parametrize('fill_value', list(FILL_VALUES))
def test_fill_value_sets_the_edge_features_of_the_self_loops(fill_value,
                                                             backend):
    """Each ``fill_value`` of :func:`torch_geometric.utils.add_self_loops`
    (the default, ``'mean'``, is in the dense-reference tests): the dense
    reference's output, float32 against float64 (rtol 1e-5), and another
    output than the default's."""
    x, edge_index, edge_attr = graph_with_edge_features()
    torch.manual_seed(0)
    conv = MetricAttentionConv(8, 4, heads=2, edge_dim=3, backend=backend,
                               fill_value=FILL_VALUES[fill_value])
    out = conv(x, edge_index, edge_attr)
    expected, _ = float64_reference(conv, x, edge_index, edge_attr)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)
    conv.fill_value = 'mean'
    assert (conv(x, edge_index, edge_attr) - out).abs().max() > 1e-3


@pytest.mark.parametrize('backend', ['fused', 'scatter', 'triton'])
def test_bipartite_self_loops_get_their_edge_features(backend):
    """Sources 0-11, destinations 0-7: the first 8 sources get a self-loop
    each, with the features ``fill_value`` gives them (the dense
    reference's output)."""
    g = torch.Generator().manual_seed(3)
    edge_index = random_graph(12, 8, 0.3, g)
    edge_attr = torch.randn(edge_index.size(1), 3, generator=g)
    x_src, x_dst = torch.randn(12, 8, generator=g), torch.randn(8, 8, generator=g)
    torch.manual_seed(0)
    conv = MetricAttentionConv(8, 4, heads=2, edge_dim=3, fill_value='add',
                               backend=backend)
    out = conv((x_src, x_dst), edge_index, edge_attr)
    expected, _ = reference_forward(copy.deepcopy(conv).double(),
                                    x_src.double(), x_dst.double(), edge_index,
                                    edge_attr.double())
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)


def test_aggr_mean_divides_by_the_in_degree():
    x, edge_index, _ = graph_with_edge_features()
    torch.manual_seed(0)
    mean = MetricAttentionConv(8, 4, heads=2, aggr='mean', bias=False,
                               backend='fused')
    add = MetricAttentionConv(8, 4, heads=2, bias=False, backend='fused')
    add.load_state_dict(mean.state_dict())
    # Self-loops replaced: in-degree = incoming non-loop edges + 1.
    degree = torch.bincount(edge_index[1], minlength=15) + 1
    torch.testing.assert_close(mean(x, edge_index),
                               add(x, edge_index) / degree.view(-1, 1))


@pytest.mark.parametrize('flag', [False, None])
def test_return_attention_weights_false_returns_the_output_only(flag):
    x, edge_index, _ = graph_with_edge_features()
    conv = MetricAttentionConv(8, 4, heads=2)
    out = conv(x, edge_index, return_attention_weights=flag)
    assert isinstance(out, torch.Tensor) and out.shape == (15, 8)


@pytest.mark.parametrize('kwargs,match', [
    (dict(time_scale='1'), "'time_scale' must be a positive number"),
    (dict(time_scale=float('nan')), "'time_scale' must be a positive number"),
    (dict(metric_channels=0), "'metric_channels' must be a positive integer"),
    (dict(metric_channels=-2), "'metric_channels' must be a positive integer"),
    (dict(mlp_channels=0), "'mlp_channels' must be a positive integer"),
])
def test_constructor_errors_name_the_argument(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        MetricAttentionConv(8, 4, **kwargs)


def test_value_false_with_lazy_channels_checks_the_width():
    conv = MetricAttentionConv(-1, 4, value=False)
    with pytest.raises(ValueError, match="'value=False'.*6 source channels"):
        conv(torch.randn(5, 6), torch.tensor([[0, 1], [1, 2]]))
    assert conv(torch.randn(5, 4), torch.tensor([[0, 1], [1, 2]])).shape == (5, 4)
