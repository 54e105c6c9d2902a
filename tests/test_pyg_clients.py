"""The layer inside PyG's own machinery: explainers, GPS, heterogeneous
models, neighbour sampling and torch.compile."""
from __future__ import annotations

import pytest
import torch
import torch_geometric.typing
from conftest import random_graph
from torch_geometric.data import Data, HeteroData
from torch_geometric.explain import AttentionExplainer, Explainer
from torch_geometric.nn import GPSConv, to_hetero

from pyg_metric_attn import MetricAttentionConv


class TwoLayer(torch.nn.Module):
    def __init__(self, in_channels, hidden, out_channels, **kwargs):
        super().__init__()
        self.conv1 = MetricAttentionConv(in_channels, hidden, heads=2, **kwargs)
        self.conv2 = MetricAttentionConv(-1 if in_channels == -1 else 2 * hidden,
                                         out_channels, heads=1, **kwargs)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


def test_attention_explainer_reads_the_layer_weights():
    g = torch.Generator().manual_seed(0)
    edge_index = random_graph(20, 20, 0.15, g, self_loops=False)
    x = torch.randn(20, 6, generator=g)
    model = TwoLayer(6, 4, 3).eval()
    explainer = Explainer(
        model=model, algorithm=AttentionExplainer(reduce='max'),
        explanation_type='model', edge_mask_type='object',
        model_config=dict(mode='multiclass_classification', task_level='graph',
                          return_type='raw'))
    explanation = explainer(x, edge_index)
    num_edges = edge_index.size(1)
    # The mask is the max over layers and heads of the layers' own weights.
    _, (_, alpha1) = model.conv1(x, edge_index, return_attention_weights=True)
    h = model.conv1(x, edge_index).relu()
    _, (_, alpha2) = model.conv2(h, edge_index, return_attention_weights=True)
    expected = torch.stack([alpha1[:num_edges].max(-1).values,
                            alpha2[:num_edges, 0]], -1).max(-1).values
    assert torch.allclose(explanation.edge_mask, expected, atol=1e-6)


def test_as_local_conv_of_gps():
    g = torch.Generator().manual_seed(1)
    edge_index = random_graph(30, 30, 0.1, g)
    x = torch.randn(30, 16, generator=g)
    batch = torch.tensor([0] * 12 + [1] * 18)
    local = MetricAttentionConv(16, 4, heads=4)  # concat -> 16 channels
    gps = GPSConv(16, local, heads=2).eval()
    out = gps(x, edge_index, batch=batch)
    assert out.shape == (30, 16) and torch.isfinite(out).all()
    out.sum().backward()
    assert local.embed_src.hidden.weight.grad is not None
    with torch.no_grad():
        local.lin_value.weight.zero_()
    assert not torch.allclose(gps(x, edge_index, batch=batch), out)


def test_to_hetero():
    data = HeteroData()
    data['paper'].x = torch.randn(12, 8)
    data['author'].x = torch.randn(7, 5)
    data['author', 'writes', 'paper'].edge_index = torch.stack(
        [torch.randint(0, 7, (25,)), torch.randint(0, 12, (25,))])
    data['paper', 'cites', 'paper'].edge_index = torch.randint(0, 12, (2, 30))
    data['paper', 'rev_writes', 'author'].edge_index = \
        data['author', 'writes', 'paper'].edge_index.flip(0)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = MetricAttentionConv((-1, -1), 4, heads=2,
                                             add_self_loops=False)
            self.conv2 = MetricAttentionConv((-1, -1), 3, add_self_loops=False)

        def forward(self, x, edge_index):
            return self.conv2(self.conv1(x, edge_index).relu(), edge_index)

    model = to_hetero(Model(), data.metadata(), aggr='sum')
    out = model(data.x_dict, data.edge_index_dict)
    assert out['paper'].shape == (12, 3) and out['author'].shape == (7, 3)
    sum(o.sum() for o in out.values()).backward()


@pytest.mark.skipif(not (torch_geometric.typing.WITH_PYG_LIB
                         or torch_geometric.typing.WITH_TORCH_SPARSE),
                    reason="NeighborLoader needs 'pyg-lib' or 'torch-sparse' "
                           "(pip install torch-sparse)")
def test_neighbor_loader_mini_batches_match_full_graph():
    from torch_geometric.loader import NeighborLoader
    g = torch.Generator().manual_seed(2)
    data = Data(x=torch.randn(60, 6, generator=g),
                edge_index=random_graph(60, 60, 0.06, g, self_loops=False))
    model = TwoLayer(6, 4, 3).eval()
    full = model(data.x, data.edge_index)
    loader = NeighborLoader(data, num_neighbors=[-1, -1], batch_size=16)
    seen = 0
    for batch in loader:
        out = model(batch.x, batch.edge_index)[:batch.batch_size]
        assert torch.allclose(out, full[batch.n_id[:batch.batch_size]], atol=1e-5)
        seen += batch.batch_size
    assert seen == 60


def test_compile_without_graph_breaks():
    g = torch.Generator().manual_seed(3)
    edge_index = random_graph(40, 40, 0.1, g)
    x = torch.randn(40, 8, generator=g)
    edge_attr = torch.randn(edge_index.size(1), 2, generator=g)
    conv = MetricAttentionConv(8, 4, heads=2, add_self_loops=False, edge_dim=2)
    explanation = torch._dynamo.explain(conv)(x, edge_index, edge_attr)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    compiled = torch.compile(conv)
    assert torch.allclose(compiled(x, edge_index, edge_attr),
                          conv(x, edge_index, edge_attr), atol=1e-5)
