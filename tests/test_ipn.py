"""The paper's IPN on graphs and point sets, and the all-pairs helper."""
from __future__ import annotations

from functools import partial

import pytest
import torch
from conftest import random_graph
from dense_reference import ipn_on_graph
from torch_geometric.nn import GATConv, GATv2Conv, TransformerConv

from pyg_metric_attn import IPN, MetricAttentionConv
from pyg_metric_attn.utils.point_sets import fully_connected_edge_index, shuffled_sets

#: Propagation layers of two heads that keep the width: the paper's
#: metric-attention (H' = S H) with each metric, and PyG's attention layers.
LAYERS = {**{metric: partial(MetricAttentionConv, metric=metric, heads=2,
                             concat=False, value=False)
             for metric in ('metric', 'l2', 'dot')},
          **{cls.__name__: partial(cls, heads=2, concat=False)
             for cls in (GATConv, GATv2Conv, TransformerConv)}}


def test_fully_connected_edge_index_matches_brute_force():
    batch = torch.tensor([0, 0, 0, 1, 2, 2])
    edge_index = fully_connected_edge_index(6, batch)
    expected = {(j, i) for i in range(6) for j in range(6) if batch[i] == batch[j]}
    assert set(map(tuple, edge_index.T.tolist())) == expected
    assert edge_index.size(1) == len(expected)
    one_set = fully_connected_edge_index(4)
    assert set(map(tuple, one_set.T.tolist())) == {(j, i) for i in range(4)
                                                   for j in range(4)}
    with pytest.raises(ValueError, match='sorted'):
        fully_connected_edge_index(3, torch.tensor([1, 0, 1]))


def test_shuffled_sets_partition_the_points():
    sets = shuffled_sets(10, 4, torch.Generator().manual_seed(0))
    assert [len(s) for s in sets] == [4, 4, 2]
    assert sorted(torch.cat(sets).tolist()) == list(range(10))


@pytest.mark.parametrize('metric', ['metric', 'l2', 'dot'])
@pytest.mark.parametrize('value', [True, False])
def test_point_set_mode_equals_fully_connected_graph(metric, value):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(26, 6, dtype=torch.double, generator=g)
    batch = torch.tensor([0] * 9 + [1] * 4 + [2] * 13)
    conv = MetricAttentionConv(6, 6, heads=3, metric=metric, value=value,
                               residual=True).double()
    sparse = conv(x, fully_connected_edge_index(26, batch))
    dense = conv.forward_point_sets(x, batch)
    assert torch.allclose(dense, sparse, atol=1e-12)


def test_point_set_mode_needs_int_in_channels():
    conv = MetricAttentionConv((6, 6), 4)
    with pytest.raises(ValueError, match="int 'in_channels'"):
        conv.forward_point_sets(torch.randn(3, 6))


@pytest.mark.parametrize('layer', LAYERS)
def test_ipn_on_graphs_and_point_sets(layer):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(20, 5, generator=g)
    edge_index = random_graph(20, 20, 0.2, g)
    batch = torch.tensor([0] * 8 + [1] * 12)
    torch.manual_seed(0)
    model = IPN(5, 12, 3, num_layers=2, conv=LAYERS[layer])
    on_graph = model(x, edge_index)
    on_sets = model(x, batch=batch)
    assert on_graph.shape == on_sets.shape == (20, 3)
    # On the graph: Linear, the layers along its edges, Linear (float32
    # layers against one float64 reference step each: rtol 1e-4).
    torch.testing.assert_close(on_graph, ipn_on_graph(model, x, edge_index),
                               rtol=1e-4, atol=1e-5)
    on_sets.sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    # Point sets equal the same model on each set alone, on all its pairs
    # (built here with cartesian_prod, not with fully_connected_edge_index):
    each_set = [model(part, torch.cartesian_prod(*[torch.arange(len(part))] * 2).T)
                for part in x.split([8, 12])]
    assert torch.allclose(on_sets, torch.cat(each_set), atol=1e-5)
    assert f'conv={type(model.convs[0]).__name__}(' in repr(model)


def test_ipn_is_linear_propagate_linear():
    model = IPN(4, 8, 2, num_layers=3,
                conv=partial(MetricAttentionConv, value=False, mlp_channels=5))
    assert [type(m).__name__ for m in model.children()] == \
        ['Linear', 'ModuleList', 'Linear']
    assert all(isinstance(c, MetricAttentionConv) and c.lin_value is None
               and c.mlp_channels == 5 for c in model.convs)
    # By default the paper's propagation H' = S H.
    paper = IPN(4, 8, 2, num_layers=2)
    assert all(isinstance(c, MetricAttentionConv) and c.lin_value is None
               and c.metric == 'metric' and c.mlp_channels == 8
               for c in paper.convs)


def test_ipn_takes_a_layer_module():
    conv = GATConv(8, 8, heads=2, concat=False)
    model = IPN(4, 8, 2, num_layers=3, conv=conv)
    assert model.convs[0] is conv
    assert all(isinstance(c, GATConv) and c.heads == 2 for c in model.convs)
    # The copies are layers of their own, freshly initialised.
    weights = [c.lin.weight for c in model.convs]
    assert len({w.data_ptr() for w in weights}) == 3
    assert not torch.equal(weights[0], weights[1])
    assert model(torch.randn(6, 4), torch.tensor([[0, 1], [1, 2]])).shape == (6, 2)


def test_ipn_errors():
    with pytest.raises(ValueError, match='num_layers'):
        IPN(4, 8, 2, num_layers=0)
    with pytest.raises(TypeError, match="'conv' must be a module or a callable"):
        IPN(4, 8, 2, conv='gat')
    with pytest.raises(ValueError, match="has no 'reset_parameters'"):
        IPN(4, 8, 2, num_layers=2, conv=torch.nn.Identity())


@pytest.mark.parametrize('on_graph', [True, False])
def test_ipn_dropout_drops_the_inputs_of_both_linear_maps(on_graph):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(12, 5, generator=g)
    edge_index = random_graph(12, 12, 0.3, g) if on_graph else None
    batch = None if on_graph else torch.tensor([0] * 5 + [1] * 7)
    model = IPN(5, 8, 3, num_layers=2, dropout=0.4)
    plain = IPN(5, 8, 3, num_layers=2)
    plain.load_state_dict(model.state_dict())
    # Evaluation: no dropout, the model without it.
    model.eval()
    plain.eval()
    assert torch.equal(model(x, edge_index, batch), plain(x, edge_index, batch))
    # Training: dropout of X before W_in and of H^(L) before W_out, in that
    # order, with the same random draws.
    model.train()
    torch.manual_seed(3)
    out = model(x, edge_index, batch)
    torch.manual_seed(3)
    h = model.lin_in(torch.nn.functional.dropout(x, 0.4))
    if on_graph:
        for conv in model.convs:
            h = conv(h, edge_index)
    else:
        h = model._propagate_point_sets(h, batch)
    expected = model.lin_out(torch.nn.functional.dropout(h, 0.4))
    assert torch.allclose(out, expected, atol=1e-6)
    assert not torch.allclose(out, plain(x, edge_index, batch), atol=1e-3)
    assert 'dropout=0.4' in repr(model) and 'dropout' not in repr(plain)
    with pytest.raises(ValueError, match="'dropout' must be in"):
        IPN(5, 8, 3, dropout=1.0)
