"""The repeated training step of a layer (issue 26, §2): after the first
call the graph's structures come from the cache, so the step reads no value
back to the host (no ``nonzero``, ``unique``, ``item``; see
``ALLOWED_READS`` for the one ``_local_scalar_dense`` of two paths), and
the number of ops it dispatches does not grow with the graph."""
from __future__ import annotations

import pytest
import torch

from benchmarks.op_count import HOST_READS, repeated_step_ops
from pyg_metric_attn import MetricAttentionConv
from pyg_metric_attn.nn.triton import HAVE_TRITON
from pyg_metric_attn.utils import graph_cache

# Reads of a value the step may make: the fused path's precision guard
# (sparse_attention.block_logits decides float32 or float64 logits). The
# Triton path draws its dropout seed on the device: no read. 'auto' runs the
# fused path on a CPU and the Triton path on a GPU.
ALLOWED_READS = {'fused': 1, 'scatter': 0, 'triton': 0}


def allowed_reads(backend, device):
    if backend == 'auto':
        backend = 'triton' if device.type == 'cuda' and HAVE_TRITON else 'fused'
    return ALLOWED_READS[backend]


@pytest.fixture(autouse=True)
def empty_cache():
    graph_cache.clear()
    yield
    graph_cache.clear()


def graph(num_nodes, num_edges, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    edge_index = torch.randint(0, num_nodes, (2, num_edges), generator=g)
    x = torch.randn(num_nodes, 8, generator=g)
    edge_attr = torch.randn(num_edges, 2, generator=g)
    return (x.to(device).requires_grad_(), edge_index.to(device),
            edge_attr.to(device))


@pytest.mark.parametrize('backend', ['fused', 'auto', 'scatter']
                         + (['triton'] if HAVE_TRITON else []))
@pytest.mark.parametrize('dropout', [0.0, 0.1])
def test_the_repeated_step_reads_no_value_back(backend, dropout, device):
    conv = MetricAttentionConv(8, 4, heads=2, edge_dim=2, dropout=dropout,
                               backend=backend).to(device)
    ops = repeated_step_ops(conv, *graph(12, 40, device))
    reads = {name: ops[name] for name in HOST_READS if ops[name]}
    assert sum(reads.values()) == allowed_reads(backend, device), reads
    assert set(reads) <= {'_local_scalar_dense'}, reads


@pytest.mark.parametrize('backend', ['fused', 'scatter']
                         + (['triton'] if HAVE_TRITON else []))
def test_the_repeated_step_does_not_grow_with_the_graph(backend, device):
    conv = MetricAttentionConv(8, 4, heads=2, edge_dim=2,
                               backend=backend).to(device)
    small = repeated_step_ops(conv, *graph(12, 40, device))
    large = repeated_step_ops(conv, *graph(300, 2000, device, seed=1))
    assert small == large
