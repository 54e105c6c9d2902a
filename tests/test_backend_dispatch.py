"""Which backend a call of MetricAttentionConv runs (``choose_backend`` and
``check_backend``): the one named, ``'scatter'`` while hooks or explain mode
need the messages, and for ``'auto'`` the fused kernels on CPU in float32 and
float64 only. Each test spies on the three paths the layer calls."""
from __future__ import annotations

import pytest
import torch
from conftest import random_graph
from dense_reference import edge_weights, float64_reference
from torch_geometric.explain.algorithm.utils import clear_masks, set_masks

from pyg_metric_attn import MetricAttentionConv
from pyg_metric_attn.nn.conv import metric_attention_conv

HOOKS = ['propagate_forward_pre', 'propagate_forward', 'message_forward_pre',
         'message_forward', 'aggregate_forward_pre', 'aggregate_forward',
         'edge_update_forward_pre', 'edge_update_forward']


@pytest.fixture
def ran(monkeypatch):
    """The backends the layer ran, one entry per call, in order."""
    paths = []

    def spy(name, function):
        def recorded(*args, **kwargs):
            paths.append(name)
            return function(*args, **kwargs)
        return recorded

    for name, attribute in (('scatter', 'gathered_logits'),
                            ('fused', 'fused_attention'),
                            ('triton', 'triton_attention')):
        monkeypatch.setattr(metric_attention_conv, attribute, spy(
            name, getattr(metric_attention_conv, attribute)))
    return paths


def small_graph(num_nodes=6):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(num_nodes, 8, generator=g),
            random_graph(num_nodes, num_nodes, 0.4, g, self_loops=False))


def assert_float32_result(conv, x, edge_index, out, edge_attr=None,
                          alpha=None):
    """``out`` (and the weights ``alpha`` ``[E', H]`` on the layer's
    edges, the caller's without self-loops then one per node) is the
    layer's function: the dense float64 reference within float32 rounding
    (about 1e-7 relative here; 1e-5 leaves room for the kernels' summation
    orders)."""
    expected, attention = float64_reference(conv, x, edge_index, edge_attr)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)
    if alpha is not None:
        nodes = torch.arange(x.size(0))
        looped = torch.cat([edge_index, torch.stack([nodes, nodes])], dim=1)
        torch.testing.assert_close(alpha.double(), edge_weights(attention, looped),
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('metric', ['metric', 'l2', 'dot'])
@pytest.mark.parametrize('backend', ['scatter', 'fused', 'triton'])
def test_a_named_backend_runs(backend, metric, ran):
    """On CPU (Triton in its interpreter), with the dense reference's output
    and weights: every metric, a time scale, edge features in shuffled
    order."""
    x, edge_index = small_graph()
    edge_attr = torch.randn(edge_index.size(1), 2,
                            generator=torch.Generator().manual_seed(1))
    torch.manual_seed(0)
    conv = MetricAttentionConv(8, 4, heads=2, metric=metric, time_scale=0.7,
                               edge_dim=2, backend=backend)
    out, (_, alpha) = conv(x, edge_index, edge_attr,
                           return_attention_weights=True)
    assert ran == [backend]
    assert alpha is not None and alpha.dtype == torch.float32
    assert_float32_result(conv, x, edge_index, out, edge_attr, alpha)


@pytest.mark.parametrize('backend', ['scatter', 'fused', 'triton'])
def test_a_named_backend_drops_weights_in_training_only(backend):
    """``dropout=0.5``: the reference in evaluation, other outputs in
    training (a new draw each call)."""
    x, edge_index = small_graph(12)
    torch.manual_seed(0)
    conv = MetricAttentionConv(8, 4, heads=2, dropout=0.5, time_scale=10.0,
                               backend=backend)
    assert_float32_result(conv, x, edge_index, conv.eval()(x, edge_index))
    conv.train()
    first, second = conv(x, edge_index), conv(x, edge_index)
    expected, _ = float64_reference(conv, x, edge_index)
    assert (first.double() - expected).abs().max() > 1e-2
    assert (first - second).abs().max() > 1e-2


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64])
@pytest.mark.parametrize('normalization', ['row', 'sinkhorn'])
def test_auto_runs_fused_on_cpu_in_full_precision(dtype, normalization, ran):
    x, edge_index = small_graph()
    conv = MetricAttentionConv(8, 4, normalization=normalization).to(dtype)
    conv(x.to(dtype), edge_index)
    assert ran == ['fused']


def test_auto_runs_scatter_in_half_precision_and_a_named_backend_runs_still(ran):
    x, edge_index = small_graph()
    conv = MetricAttentionConv(8, 4)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        conv(x, edge_index)
        conv.backend = 'fused'
        conv(x, edge_index)
    conv.backend = 'auto'
    conv.bfloat16()(x.bfloat16(), edge_index)
    assert ran == ['scatter', 'fused', 'scatter']


@pytest.mark.parametrize('hook', HOOKS)
@pytest.mark.parametrize('backend', ['auto', 'fused', 'triton'])
def test_any_hook_runs_scatter_until_removed(hook, backend, ran):
    """Every hook of MessagePassing sees the per-edge messages."""
    x, edge_index = small_graph()
    conv = MetricAttentionConv(8, 4, backend=backend)
    handle = getattr(conv, f'register_{hook}_hook')(lambda *args: None)
    conv(x, edge_index)
    handle.remove()
    conv(x, edge_index)
    assert ran == ['scatter', 'fused' if backend == 'auto' else backend]


@pytest.mark.parametrize('backend', ['auto', 'fused', 'triton'])
def test_explain_mode_runs_scatter(backend, ran):
    x, edge_index = small_graph()
    conv = MetricAttentionConv(8, 4, backend=backend)
    set_masks(conv, torch.ones(edge_index.size(1)), edge_index,
              apply_sigmoid=False)
    conv(x, edge_index)
    clear_masks(conv)
    assert ran == ['scatter']


@pytest.mark.parametrize('aggr', ['max', 'min'])
def test_auto_runs_scatter_for_an_aggr_the_kernels_do_not_compute(aggr, ran):
    x, edge_index = small_graph()
    MetricAttentionConv(8, 4, aggr=aggr)(x, edge_index)
    assert ran == ['scatter']


@pytest.mark.parametrize('backend', ['auto', 'scatter'])
def test_a_trace_records_scatter(backend, ran):
    x, edge_index = small_graph()
    conv = MetricAttentionConv(8, 4, backend=backend)
    torch.jit.trace(conv, (x, edge_index), check_trace=False)
    assert ran == ['scatter']


def test_auto_runs_scatter_under_torch_compile(ran):
    """The fused kernels are opaque to torch.compile (Triton would be
    chosen before, on CUDA only)."""
    x, edge_index = small_graph()
    conv = MetricAttentionConv(8, 4)
    expected = conv(x, edge_index)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(conv, backend='eager')(
        x, edge_index), expected)
    assert ran == ['fused', 'scatter']


@pytest.mark.parametrize('backend', ['auto', 'scatter', 'fused'])
@pytest.mark.parametrize('normalization', ['column', 'sinkhorn', 'global'])
def test_normalizations_other_than_row_are_refused_by_triton_only(
        backend, normalization):
    MetricAttentionConv(8, 4, normalization=normalization, backend=backend)
    with pytest.raises(ValueError, match="backend='triton' computes "
                                         "normalization='row' only, got "
                                         f"normalization='{normalization}'"):
        MetricAttentionConv(8, 4, normalization=normalization,
                            backend='triton')


@pytest.mark.parametrize('aggr', ['add', 'sum', 'mean'])
@pytest.mark.parametrize('backend', ['auto', 'scatter', 'fused', 'triton'])
def test_every_backend_computes_the_aggregations_of_the_kernels(aggr, backend,
                                                                ran):
    """Each backend runs itself (``'auto'``: fused) with the aggregation:
    the sum of the weighted messages, or for ``'mean'`` that sum divided by
    the in-degree."""
    x, edge_index = small_graph()
    torch.manual_seed(0)
    conv = MetricAttentionConv(8, 4, heads=2, aggr=aggr, backend=backend)
    out = conv(x, edge_index)
    assert ran == ['fused' if backend == 'auto' else backend]
    assert_float32_result(conv, x, edge_index, out)
