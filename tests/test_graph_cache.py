"""Graph structures cached on the caller's ``edge_index`` (issue 15, §4): built
once per tensor, never stale (in-place writes, freed tensors, new tensors),
and the layer's results are unchanged."""
from __future__ import annotations

import gc

import pytest
import torch

from pyg_metric_attn import MetricAttentionConv
from pyg_metric_attn.nn import edge_attention
from pyg_metric_attn.nn.triton import HAVE_TRITON
from pyg_metric_attn.utils import graph_cache


@pytest.fixture(autouse=True)
def empty_cache():
    graph_cache.clear()
    yield
    graph_cache.clear()


@pytest.fixture
def builds(monkeypatch):
    """Counts the CSR views the layer builds."""
    count = {'csr': 0}
    original = edge_attention.HeadBlockCSR

    def counting(*args, **kwargs):
        count['csr'] += 1
        return original(*args, **kwargs)
    monkeypatch.setattr(edge_attention, 'HeadBlockCSR', counting)
    return count


def graph(seed, num_nodes=12, num_edges=40):
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, num_nodes, (2, num_edges), generator=g),
            torch.randn(num_nodes, 8, generator=g))


def fresh_result(conv, x, edge_index):
    graph_cache.clear()
    return conv(x, edge_index.clone())


def test_built_once_per_graph_across_layers_and_steps(builds):
    edge_index, x = graph(0)
    layers = [MetricAttentionConv(8, 4, heads=2, backend='fused'),
              MetricAttentionConv(8, 4, heads=2, backend='fused')]
    for _ in range(3):  # three training steps of a two-layer model
        out = layers[1](layers[0](x, edge_index)[:, :8].contiguous(), edge_index)
        out.sum().backward()
    assert builds['csr'] == 1
    other_heads = MetricAttentionConv(8, 4, heads=3, backend='fused')
    other_heads(x, edge_index)
    assert builds['csr'] == 2  # the block structure depends on the heads


def test_in_place_changes_are_seen(builds):
    edge_index, x = graph(1)
    conv = MetricAttentionConv(8, 4, heads=2, backend='fused')
    conv(x, edge_index)
    edge_index[0, :10] = edge_index[0, :10].flip(0)
    edge_index[1, 3] = 11
    out = conv(x, edge_index)
    assert builds['csr'] == 2
    torch.testing.assert_close(out, fresh_result(conv, x, edge_index))
    edge_index[1, 0] = 12  # now out of range: still reported
    with pytest.raises(IndexError, match='destination index 12'):
        conv(x, edge_index)


def test_new_and_freed_tensors_never_share_an_entry(builds):
    conv = MetricAttentionConv(8, 4, heads=2, backend='fused')
    for seed in range(5):  # each new graph may reuse the freed one's memory
        edge_index, x = graph(seed)
        out = conv(x, edge_index)
        torch.testing.assert_close(out, fresh_result(conv, x, edge_index))
        del edge_index
        gc.collect()
    assert len(graph_cache._entries) == 0  # entries die with their tensors


def test_inference_mode_and_returned_graph_copies(builds):
    edge_index, x = graph(2)
    conv = MetricAttentionConv(8, 4, heads=2, backend='fused')
    with torch.inference_mode():
        frozen = edge_index.clone()
        conv(x, frozen)
        conv(x, frozen)
    assert builds['csr'] == 2 and len(graph_cache._entries) == 0
    expected = conv(x, edge_index)
    _, (returned, _) = conv(x, edge_index, return_attention_weights=True)
    returned.zero_()  # the caller owns what it gets back
    torch.testing.assert_close(conv(x, edge_index), expected)


def test_capacity_bounds_the_cache():
    conv = MetricAttentionConv(8, 4, heads=2, backend='fused')
    graphs = [graph(seed)[0] for seed in range(graph_cache.CAPACITY + 5)]
    x = graph(0)[1]
    for edge_index in graphs:
        conv(x, edge_index)
    assert len(graph_cache._entries) == graph_cache.CAPACITY


def test_fullgraph_compile_traces_past_the_cache():
    """Under torch.compile the cache is only read (Dynamo can read neither
    ``is_inference()`` nor a version counter), so ``fullgraph=True``
    compiles the whole layer: with the cached self-loops as inputs for the
    graph an eager call prepared, building them in the graph for another
    (issue 26, §3; issue 60)."""
    edge_index, x = graph(3)
    conv = MetricAttentionConv(8, 4, heads=2)
    expected = conv(x, edge_index)  # the graph is cached eagerly
    torch._dynamo.reset()
    compiled = torch.compile(conv, fullgraph=True, backend='aot_eager')
    torch.testing.assert_close(compiled(x, edge_index), expected)
    other, _ = graph(4)
    torch.testing.assert_close(compiled(x, other), conv(x, other))


@pytest.mark.parametrize('backend', ['scatter', 'triton'])
def test_compile_without_fullgraph_is_one_graph_when_loops_are_given(
        backend, device):
    """``torch.compile(conv)`` without ``fullgraph``, as most users write it:
    with ``add_self_loops=False`` nothing in the layer has a data-dependent
    size, so Dynamo traces it as one graph (with self-loops to drop it
    splits the layer there, as it splits GATConv; README)."""
    if backend == 'triton' and not HAVE_TRITON:
        pytest.skip('triton is not installed')
    edge_index, x = graph(6)
    loops = torch.arange(12).repeat(2, 1)
    edge_index = torch.cat([edge_index[:, edge_index[0] != edge_index[1]],
                            loops], dim=1).to(device)
    x = x.to(device)
    conv = MetricAttentionConv(8, 4, heads=2, backend=backend,
                               add_self_loops=False).to(device)
    expected = conv(x, edge_index)
    graphs = []

    def counting_backend(graph_module, example_inputs):
        graphs.append(graph_module)
        return graph_module.forward
    torch._dynamo.reset()
    compiled = torch.compile(conv, backend=counting_backend)
    torch.testing.assert_close(compiled(x, edge_index), expected)
    assert len(graphs) == 1


def test_an_edge_index_is_cached_through_its_data(builds):
    """A PyG ``EdgeIndex`` enters as its data tensor, the same at every call,
    so its graph is built once too."""
    from torch_geometric import EdgeIndex
    edge_index, x = graph(5)
    index = EdgeIndex(edge_index, sparse_size=(12, 12))
    conv = MetricAttentionConv(8, 4, heads=2, backend='fused')
    for _ in range(3):
        out = conv(x, index)
    assert builds['csr'] == 1
    torch.testing.assert_close(out, fresh_result(conv, x, edge_index))


def test_uncached_self_loops_are_built_once_per_call(monkeypatch):
    """In inference mode nothing is cached; the call still builds its
    self-looped graph once, for the layer and its CSR alike."""
    calls = []
    original = edge_attention.add_self_loops

    def counting(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)
    monkeypatch.setattr(edge_attention, 'add_self_loops', counting)
    edge_index, x = graph(6)
    conv = MetricAttentionConv(8, 4, heads=2, backend='fused')
    with torch.inference_mode():
        conv(x, edge_index.clone())
    assert len(calls) == 1
