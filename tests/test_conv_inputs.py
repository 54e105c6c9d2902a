"""Every graph format PyG accepts, on every backend (issue 26, §1): a PyG
``EdgeIndex`` in every sort order and cache state, a plain tensor, a
``SparseTensor`` and torch.sparse COO/CSR/CSC, with and without edge
features, give the scatter backend's output, and a bad index raises an
``IndexError`` naming it (on a GPU: a device-side assert, in a fresh
process). The Triton backend runs in Triton's interpreter on tiny graphs on
the CPU; ``pytest --device cuda`` runs the same tests on a GPU (and
``benchmarks/gpu_session.sh`` runs them under compute-sanitizer)."""
from __future__ import annotations

import textwrap

import pytest
import torch
from conftest import expect_device_assert
from torch_geometric import EdgeIndex
from torch_geometric.typing import WITH_TORCH_SPARSE, SparseTensor
from torch_geometric.utils import (
    to_torch_coo_tensor,
    to_torch_csc_tensor,
    to_torch_csr_tensor,
)

from pyg_metric_attn import MetricAttentionConv
from pyg_metric_attn.nn.triton import HAVE_TRITON
from pyg_metric_attn.utils import graph_cache
from pyg_metric_attn.utils.checks import check_edge_index

NUM_NODES = 6
# Unsorted, with a self-loop (no duplicates: sparse adjacencies sum them).
EDGES = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 2, 3],
                      [1, 2, 3, 4, 5, 0, 0, 4, 3]])
BACKENDS = ['fused', 'auto'] + (['triton'] if HAVE_TRITON else [])


def edge_index_variants(device):
    """``EdgeIndex`` in every sort order, with and without ``sparse_size``,
    with and without its cached ``indptr``, and views of one (the edge
    permutation each applies to the plain edges)."""
    edges = EDGES.to(device)
    identity = torch.arange(EDGES.size(1), device=device)
    variants = {'plain': (edges, identity)}
    size = (NUM_NODES, NUM_NODES)
    for order in (None, 'row', 'col'):
        for sparse_size in (None, size):
            for fill_cache in (False, True):
                if order is None:
                    index, perm = EdgeIndex(edges, sparse_size=sparse_size), identity
                else:
                    index, perm = EdgeIndex(
                        edges, sparse_size=sparse_size).sort_by(order, stable=True)
                if fill_cache and order is not None:
                    index.fill_cache_()
                elif fill_cache:
                    continue
                name = f'EdgeIndex-{order}-{sparse_size is not None}-{fill_cache}'
                variants[name] = (index, perm)
    index, perm = EdgeIndex(edges, sparse_size=size).sort_by('col', stable=True)
    variants['EdgeIndex-view'] = (index[:, 2:], perm[2:])
    return variants


def sparse_variants(edge_attr, device):
    """The graph as sparse adjacencies (transposed: rows are destinations)
    whose values are ``edge_attr``, and the order of their non-zeros."""
    edges = EDGES.to(device)
    dst_src = edges.flip(0)
    size = (NUM_NODES, NUM_NODES)
    order = torch.sort(edges[1] * NUM_NODES + edges[0], stable=True)[1]
    by_src = torch.sort(edges[0] * NUM_NODES + edges[1], stable=True)[1]
    variants = {
        'coo': (to_torch_coo_tensor(dst_src, edge_attr, size=size), order),
        'csr': (to_torch_csr_tensor(dst_src, edge_attr, size=size), order),
        'csc': (to_torch_csc_tensor(dst_src, edge_attr, size=size), by_src),
    }
    if WITH_TORCH_SPARSE:
        variants['sparse_tensor'] = (SparseTensor(
            row=edges[1], col=edges[0], value=edge_attr, sparse_sizes=size,
            is_sorted=False), order)
    return variants


def layers(backend, edge_dim=None, device='cpu'):
    torch.manual_seed(0)
    reference = MetricAttentionConv(8, 4, heads=2, edge_dim=edge_dim,
                                    backend='scatter').to(device)
    conv = MetricAttentionConv(8, 4, heads=2, edge_dim=edge_dim,
                               backend=backend).to(device)
    conv.load_state_dict(reference.state_dict())
    return reference, conv


@pytest.fixture(autouse=True)
def empty_cache():
    graph_cache.clear()
    yield
    graph_cache.clear()


@pytest.fixture(scope='module')
def x(device):
    return torch.randn(NUM_NODES, 8, generator=torch.Generator().manual_seed(1)
                       ).to(device)


@pytest.fixture(scope='module')
def edge_attr(device):
    return torch.randn(EDGES.size(1), 3, generator=torch.Generator().manual_seed(2)
                       ).to(device)


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('with_edge_attr', [False, True])
def test_every_edge_index_gives_the_scatter_output(backend, with_edge_attr, x,
                                                   edge_attr, device):
    reference, conv = layers(backend, 3 if with_edge_attr else None, device)
    for name, (index, perm) in edge_index_variants(device).items():
        plain = EDGES.to(device)[:, perm]
        attr = edge_attr[perm] if with_edge_attr else None
        expected, (_, expected_alpha) = reference(
            x, plain, attr, return_attention_weights=True)
        for _ in range(2):  # the second call finds the graph cached
            out, (returned, alpha) = conv(x, index, attr,
                                          return_attention_weights=True)
            torch.testing.assert_close(out, expected, msg=name)
            torch.testing.assert_close(alpha, expected_alpha, msg=name)
        assert type(returned) is torch.Tensor  # no stale EdgeIndex metadata


@pytest.mark.parametrize('backend', BACKENDS)
def test_every_sparse_adjacency_gives_the_scatter_output(backend, x, edge_attr,
                                                         device):
    reference, conv = layers(backend, 3, device)
    plain, _ = layers(backend, device=device)
    edges = EDGES.to(device)
    for name, (adj, order) in sparse_variants(edge_attr, device).items():
        expected = reference(x, edges[:, order], edge_attr[order])
        torch.testing.assert_close(conv(x, adj), expected, msg=name)
        # The values mark the pattern only for a layer without edge features.
        torch.testing.assert_close(plain(x, adj), plain(x, edges[:, order]),
                                   msg=name)


@pytest.mark.parametrize('backend', ['scatter'] + BACKENDS)
def test_edge_attr_beside_a_sparse_pattern_is_used(backend, x, edge_attr,
                                                   device):
    """PyG's convention (TransformerConv's tests): ``edge_attr``, ordered like
    the adjacency's non-zeros, with an adjacency whose values only mark the
    pattern."""
    reference, conv = layers(backend, 3, device)
    for name, (adj, order) in sparse_variants(None, device).items():
        attr = edge_attr[order]
        expected = reference(x, EDGES.to(device)[:, order], attr)
        torch.testing.assert_close(conv(x, adj, attr), expected, msg=name)


def test_edge_attr_beside_multi_dimensional_values_raises(x, edge_attr,
                                                         device):
    conv = MetricAttentionConv(8, 4, edge_dim=3).to(device)
    adj = to_torch_coo_tensor(EDGES.to(device).flip(0), edge_attr, size=(6, 6))
    with pytest.raises(ValueError, match='given twice'):
        conv(x, adj, edge_attr)


def bad_graphs():
    negative = EDGES.clone()
    negative[0, 3] = -2
    too_large_src = EDGES.clone()
    too_large_src[0, 4] = NUM_NODES
    too_large_dst = EDGES.clone()
    too_large_dst[1, 5] = NUM_NODES + 3
    return [(negative, 'negative index \\(-2\\)'),
            (too_large_src, f'source index {NUM_NODES} is out of range'),
            (too_large_dst, f'destination index {NUM_NODES + 3} is out of range')]


@pytest.mark.parametrize('backend', ['scatter'] + BACKENDS)
@pytest.mark.parametrize('as_edge_index', [False, True])
def test_bad_indices_raise_an_index_error_naming_them(backend, as_edge_index, x,
                                                       device):
    if device.type == 'cuda':
        pytest.skip('a device-side assert: see the fresh-process test below')
    _, conv = layers(backend)
    for edges, match in bad_graphs():
        graph = EdgeIndex(edges) if as_edge_index else edges
        for _ in range(2):  # checked once per graph, and the result kept
            with pytest.raises(IndexError, match=match):
                conv(x, graph)


@pytest.mark.parametrize('backend', ['scatter'] + BACKENDS)
def test_bad_indices_on_a_gpu_stop_the_process_with_a_device_assert(backend,
                                                                    device):
    """On a GPU a bad index is never a silent out-of-bounds read: the range
    is asserted on the device, which ends the (fresh) process naming it."""
    if device.type != 'cuda':
        pytest.skip('CUDA only (--device cuda); on a CPU: the IndexError test')
    expect_device_assert(textwrap.dedent(f"""
        import torch
        from pyg_metric_attn import MetricAttentionConv
        edges = torch.tensor({EDGES.tolist()}, device='cuda')
        edges[0, 4] = {NUM_NODES}
        conv = MetricAttentionConv(8, 4, heads=2, backend='{backend}').cuda()
        conv(torch.randn({NUM_NODES}, 8, device='cuda'), edges)
    """))


def test_jit_trace_records_the_message_passing_path():
    """``torch.jit.trace`` (PyG's traceable-conv tests): ``'auto'`` traces the
    scatter path, which then runs on other graphs too; a backend named
    explicitly that cannot be traced says so."""
    x = torch.randn(NUM_NODES, 8, generator=torch.Generator().manual_seed(1))
    conv = MetricAttentionConv(8, 4, heads=2)
    conv(x, EDGES)  # the graph is cached: the trace must still record it
    with pytest.warns(torch.jit.TracerWarning):
        traced = torch.jit.trace(conv, (x, EDGES))
    torch.testing.assert_close(traced(x, EDGES), conv(x, EDGES))
    other = EDGES[:, [1, 3, 4, 0, 7]]
    torch.testing.assert_close(traced(x, other), conv(x, other))
    for backend in ('fused', 'triton'):
        with pytest.raises(RuntimeError, match=f"backend='{backend}' cannot "
                                               "be traced"):
            torch.jit.trace(MetricAttentionConv(8, 4, backend=backend), (x, EDGES))


@pytest.mark.parametrize('edges,match', bad_graphs())
def test_bad_indices_are_asserted_on_the_device_without_a_read(edges, match):
    """On a GPU the range is asserted without a host sync (a device-side
    assert); on CPU the same assert raises at once."""
    check_edge_index(EDGES, NUM_NODES, NUM_NODES, read_values=False)
    with pytest.raises(RuntimeError, match='index out of range for 6 source'):
        check_edge_index(edges, NUM_NODES, NUM_NODES, read_values=False)
