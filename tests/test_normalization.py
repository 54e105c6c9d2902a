"""The similarity normalisations (issue 18, part 1): ``normalization=`` of
MetricAttentionConv and MetricMultiheadAttention, and the functions of
:mod:`pyg_metric_attn.nn.normalization` they share."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import random_graph
from dense_reference import edge_weights, reference_forward
from torch_geometric.utils import scatter

from pyg_metric_attn import MetricAttentionConv
from pyg_metric_attn.nn.dense import MetricMultiheadAttention
from pyg_metric_attn.nn.functional import dense_metric_attention
from pyg_metric_attn.nn.normalization import (
    NORMALIZATIONS,
    normalize_dense_logits,
    normalize_edge_logits,
)
from pyg_metric_attn.utils.point_sets import fully_connected_edge_index

BACKENDS = ['fused', 'scatter']
OTHERS = ['column', 'sinkhorn', 'global']  # the normalisations beyond 'row'


def random_batch(num_graphs: int = 2, num_nodes: int = 8, degree: int = 3,
                 channels: int = 4, seed: int = 0,
                 dtype: torch.dtype = torch.float64):
    """``x [G n, F]``, ``edge_index`` within graphs and ``batch [G n]``."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_graphs * num_nodes, channels, generator=generator,
                    dtype=dtype)
    edges = [torch.randint(0, num_nodes, (2, num_nodes * degree),
                           generator=generator) + graph * num_nodes
             for graph in range(num_graphs)]
    batch = torch.arange(num_graphs).repeat_interleave(num_nodes)
    return x, torch.cat(edges, dim=1), batch


def layer(normalization: str, backend: str, seed: int = 0,
          in_channels: int = 4, out_channels: int = 3, **kwargs):
    torch.manual_seed(seed)
    return MetricAttentionConv(in_channels, out_channels, heads=2,
                               normalization=normalization, backend=backend,
                               sinkhorn_iterations=4, **kwargs).double()


def sums(alpha: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    return scatter(alpha, index, 0, size, reduce='sum')


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('normalization', NORMALIZATIONS)
def test_weights_sum_to_one_where_the_normalisation_says(normalization,
                                                         backend):
    x, edge_index, batch = random_batch()
    conv = layer(normalization, backend)
    kwargs = {'batch': batch} if normalization == 'global' else {}
    _, (edges, alpha) = conv(x, edge_index, return_attention_weights=True,
                             **kwargs)
    src, dst = edges
    ones = torch.ones(x.size(0), 2, dtype=alpha.dtype)
    if normalization in ('row', 'sinkhorn'):
        torch.testing.assert_close(sums(alpha, dst, x.size(0)), ones)
    if normalization == 'column':
        torch.testing.assert_close(sums(alpha, src, x.size(0)), ones)
    if normalization == 'global':
        torch.testing.assert_close(sums(alpha, batch[dst], 2),
                                   torch.ones(2, 2, dtype=alpha.dtype))
    if normalization != 'column':  # not column-stochastic: some are off
        assert (sums(alpha, src, x.size(0)) - 1).abs().max() > 1e-3


def connected_graph(num_nodes: int = 12, extra: int = 12,
                    seed: int = 0) -> torch.Tensor:
    """An undirected graph with self-loops: a ring and random chords, both
    directions. Its adjacency is symmetric, connected and has a positive
    diagonal, so every edge lies on a perfect matching (total support) and
    Sinkhorn's iterations converge geometrically to a doubly stochastic
    matrix."""
    generator = torch.Generator().manual_seed(seed)
    ring = torch.arange(num_nodes)
    chords = torch.randint(0, num_nodes, (2, extra), generator=generator)
    one_way = torch.cat([torch.stack([ring, (ring + 1) % num_nodes]), chords],
                        dim=1)
    return torch.cat([torch.stack([ring, ring]), one_way, one_way.flip(0)],
                     dim=1)


@pytest.mark.parametrize('backend', BACKENDS)
def test_sinkhorn_is_doubly_stochastic_after_many_iterations(backend):
    edge_index = connected_graph()
    x = torch.randn(12, 4, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    conv = MetricAttentionConv(4, 3, heads=2, normalization='sinkhorn',
                               sinkhorn_iterations=200, time_scale=10.0,
                               backend=backend).double()
    _, (edges, alpha) = conv(x, edge_index, return_attention_weights=True)
    ones = torch.ones(x.size(0), 2, dtype=alpha.dtype)
    torch.testing.assert_close(sums(alpha, edges[1], x.size(0)), ones)
    torch.testing.assert_close(sums(alpha, edges[0], x.size(0)), ones)


def run_both(normalization: str, x, edge_index, train: bool = False,
             **kwargs):
    """Outputs, weights and input gradients of the fused and scatter
    backends (the same parameters and dropout draw)."""
    call = {key: kwargs.pop(key) for key in ('batch', 'edge_attr', 'size')
            if key in kwargs}
    results = []
    for backend in BACKENDS:
        conv = layer(normalization, backend, **kwargs).train(train)
        inputs = tuple(t.clone().requires_grad_() for t in
                       (x if isinstance(x, tuple) else (x, )))
        torch.manual_seed(5)  # the dropout draw
        out, (_, alpha) = conv(inputs if len(inputs) > 1 else inputs[0],
                               edge_index, return_attention_weights=True,
                               **call)
        (out.square().sum() + alpha.sin().sum()).backward()
        grads = [t.grad for t in inputs] + [
            p.grad for p in conv.parameters() if p.grad is not None]
        results.append((out, alpha, grads))
    return results


CASES = {
    'plain': {},
    'edge_bias': {'edge_dim': 2},
    'mean': {'aggr': 'mean'},
    'no_self_loops': {'add_self_loops': False},
    'dropout': {'dropout': 0.3},
    'dot': {'metric': 'dot'},
    'no_value_residual': {'value': False, 'residual': True, 'out_channels': 4},
}


@pytest.mark.parametrize('case', list(CASES))
@pytest.mark.parametrize('normalization', NORMALIZATIONS)
def test_fused_equals_scatter(normalization, case):
    x, edge_index, batch = random_batch()
    kwargs = dict(CASES[case])
    if 'edge_dim' in kwargs:
        kwargs['edge_attr'] = torch.randn(edge_index.size(1), 2,
                                          dtype=torch.float64)
    if normalization == 'global':
        kwargs['batch'] = batch
    (out_f, alpha_f, grads_f), (out_s, alpha_s, grads_s) = run_both(
        normalization, x, edge_index, train='dropout' in kwargs, **kwargs)
    tolerance = dict(rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(out_f, out_s, **tolerance)
    torch.testing.assert_close(alpha_f, alpha_s, **tolerance)
    assert len(grads_f) == len(grads_s)
    for grad_f, grad_s in zip(grads_f, grads_s, strict=True):
        torch.testing.assert_close(grad_f, grad_s, **tolerance)


def sparse_batch(num_graphs: int = 2, num_nodes: int = 8, p: float = 0.3,
                 channels: int = 4, seed: int = 0):
    """Like :func:`random_batch`, float64, without duplicate edges (the dense
    reference holds one per pair) and far from complete."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(num_graphs * num_nodes, channels, generator=generator,
                    dtype=torch.float64)
    edge_index = torch.cat([random_graph(num_nodes, num_nodes, p, generator)
                            + graph * num_nodes for graph in range(num_graphs)],
                           dim=1)
    batch = torch.arange(num_graphs).repeat_interleave(num_nodes)
    return x, edge_index, batch


def assert_equals_the_dense_construction(conv, x, edge_index, **call):
    """Weights and outputs of ``conv`` are the dense reference's, whose
    normalisations are written in linear space on the ``[H, N, N]``
    similarity matrix (Definitions 7-10). Float64 throughout: the two
    differ by rounding only (about 1e-15)."""
    out, (edges, alpha) = conv(x, edge_index, return_attention_weights=True,
                               **call)
    expected, attention = reference_forward(
        conv, x, x, edge_index, call.get('edge_attr'), call.get('batch'))
    tolerance = dict(rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(alpha, edge_weights(attention, edges),
                               **tolerance)
    torch.testing.assert_close(out, expected, **tolerance)


REFERENCE_CASES = {name: case for name, case in CASES.items()
                   if name != 'dropout'}


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('case', list(REFERENCE_CASES))
@pytest.mark.parametrize('normalization', NORMALIZATIONS)
def test_every_normalisation_equals_the_dense_construction(normalization, case,
                                                           backend):
    """Each normalisation against the dense construction, on graphs of a
    batch that are far from complete (the fused and scatter backends share
    :func:`attention_weights`, so their agreement cannot show it right)."""
    x, edge_index, batch = sparse_batch()
    kwargs = dict(REFERENCE_CASES[case])
    conv = layer(normalization, backend, **kwargs)
    call = {'batch': batch} if normalization == 'global' else {}
    if 'edge_dim' in kwargs:
        call['edge_attr'] = torch.randn(edge_index.size(1), 2,
                                        dtype=torch.float64)
    assert edge_index.size(1) < 64  # under half of the 2 x 64 pairs
    assert_equals_the_dense_construction(conv, x, edge_index, **call)


@pytest.mark.parametrize('normalization', NORMALIZATIONS)
def test_fused_equals_scatter_on_bipartite_graphs(normalization):
    generator = torch.Generator().manual_seed(1)
    x_src = torch.randn(7, 4, generator=generator, dtype=torch.float64)
    x_dst = torch.randn(5, 4, generator=generator, dtype=torch.float64)
    edge_index = torch.stack([torch.randint(0, 7, (20, ), generator=generator),
                              torch.randint(0, 5, (20, ), generator=generator)])
    (out_f, alpha_f, grads_f), (out_s, alpha_s, grads_s) = run_both(
        normalization, (x_src, x_dst), edge_index)
    torch.testing.assert_close(out_f, out_s, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(alpha_f, alpha_s, rtol=1e-10, atol=1e-10)
    for grad_f, grad_s in zip(grads_f, grads_s, strict=True):
        torch.testing.assert_close(grad_f, grad_s, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('metric', ['metric', 'dot'])
@pytest.mark.parametrize('normalization', NORMALIZATIONS)
def test_dense_point_sets_equal_the_sparse_fully_connected_graph(normalization,
                                                                metric):
    x, _, _ = random_batch()
    batch = torch.tensor([0] * 5 + [1] * 11)  # unequal sets: padding
    conv = layer(normalization, 'fused', metric=metric).eval()
    call = {'batch': batch} if normalization == 'global' else {}
    sparse = conv(x, fully_connected_edge_index(x.size(0), batch), **call)
    dense = conv.forward_point_sets(x, batch)
    torch.testing.assert_close(dense, sparse, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('normalization', NORMALIZATIONS)
def test_multihead_attention_honours_padding_in_every_normalisation(
        normalization):
    """Sets padded to one length give the outputs of each set alone."""
    torch.manual_seed(0)
    mha = MetricMultiheadAttention(8, 2, normalization=normalization,
                                   time_scale='matched').double().eval()
    x = torch.randn(9, 8, dtype=torch.float64)
    batch = torch.tensor([0] * 3 + [1] * 6)
    together = mha.forward_point_sets(x, batch)
    alone = torch.cat([mha(x[batch == b].unsqueeze(0), x[batch == b].unsqueeze(0),
                           x[batch == b].unsqueeze(0))[0][0] for b in (0, 1)])
    torch.testing.assert_close(together, alone, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('normalization', NORMALIZATIONS)
def test_multihead_weights_follow_the_normalisation(normalization):
    torch.manual_seed(0)
    # metric_channels=4: the points of the old default width, on which 300
    # Sinkhorn steps reach float64's tolerance.
    mha = MetricMultiheadAttention(8, 2, normalization=normalization,
                                   sinkhorn_iterations=300,
                                   metric_channels=4).double()
    query, key = torch.randn(2, 4, 8, dtype=torch.float64), torch.randn(
        2, 6, 8, dtype=torch.float64)
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[1, 4:] = True  # two keys of the second element are padding
    _, weights = mha(query, key, key, key_padding_mask=padding,
                     average_attn_weights=False)  # [B, H, L, S]
    assert weights[1, :, :, 4:].abs().max() == 0
    rows, columns = weights.sum(-1), weights.sum(-2)
    if normalization == 'row':
        torch.testing.assert_close(rows, torch.ones_like(rows))
    if normalization == 'column':
        torch.testing.assert_close(columns[0], torch.ones_like(columns[0]))
        torch.testing.assert_close(columns[1, :, :4],
                                   torch.ones_like(columns[1, :, :4]))
    if normalization == 'sinkhorn':  # 4 x 6: rows 1, columns 4/6 (4/4 valid)
        torch.testing.assert_close(rows, torch.ones_like(rows))
        torch.testing.assert_close(columns[0], torch.full_like(columns[0],
                                                               4 / 6))
        torch.testing.assert_close(columns[1, :, :4],
                                   torch.ones_like(columns[1, :, :4]))
    if normalization == 'global':
        totals = weights.sum((-2, -1))
        torch.testing.assert_close(totals, torch.ones_like(totals))


def test_sinkhorn_marginals_converge_geometrically():
    """On a connected graph with self-loops the largest column-sum error
    falls by a steady factor per iteration: log-error linear in n with a
    negative slope."""
    generator = torch.Generator().manual_seed(0)
    num_nodes = 12
    edge_index = connected_graph(num_nodes)
    logits = torch.randn(edge_index.size(1), 2, generator=generator,
                             dtype=torch.float64)
    src, dst = edge_index
    iterations = torch.arange(2, 11)
    errors = []
    for n in iterations.tolist():
        alpha = normalize_edge_logits(logits, 'sinkhorn', dst, src, num_nodes,
                                      num_nodes, sinkhorn_iterations=n)
        errors.append(float((sums(alpha, src, num_nodes) - 1).abs().max()))
    log_errors = torch.tensor(errors, dtype=torch.float64).log()
    assert min(errors) > 1e-13, errors  # above rounding: the fit means something
    design = torch.stack([iterations.double(), torch.ones(len(errors),
                                                           dtype=torch.float64)], 1)
    (slope, _), *_ = torch.linalg.lstsq(design, log_errors.unsqueeze(1))
    slope = float(slope)
    assert slope < -0.1, errors
    # Steady: every step's rate is within a factor of 2 of the fitted one.
    steps = log_errors.diff()
    assert bool(((steps < 0.5 * slope) & (steps > 2 * slope)).all()), errors


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('normalization', NORMALIZATIONS)
def test_gradcheck(normalization, backend):
    x, edge_index, batch = random_batch(num_graphs=2, num_nodes=3, degree=2,
                                        channels=2)
    torch.manual_seed(0)
    conv = MetricAttentionConv(2, 2, normalization=normalization,
                               backend=backend).double()
    call = {'batch': batch} if normalization == 'global' else {}
    x.requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x: conv(x, edge_index, **call), (x, ))


@pytest.mark.parametrize('normalization', NORMALIZATIONS)
def test_gradcheck_of_masked_dense_logits(normalization):
    logits = torch.randn(2, 3, 4, dtype=torch.float64)
    mask = torch.ones(2, 3, 4, dtype=torch.bool)
    mask[0, :, 3] = False
    mask[1, 2, :] = False  # a fully masked row: weights 0, gradients finite

    def weights(logits):
        return normalize_dense_logits(logits.masked_fill(~mask, -math.inf),
                                      normalization, 3)

    if normalization == 'row':  # torch's softmax: NaN on a fully masked row
        mask[1, 2, :] = True
    logits.requires_grad_()
    assert torch.autograd.gradcheck(weights, (logits, ))
    assert weights(logits)[~mask].abs().max() == 0


@pytest.mark.parametrize('backend', BACKENDS)
def test_global_normalises_each_graph_of_a_batch(backend):
    x, edge_index, batch = random_batch(num_graphs=3)
    conv = layer('global', backend)
    out, (edges, alpha) = conv(x, edge_index, return_attention_weights=True,
                               batch=batch)
    totals = sums(alpha, batch[edges[1]], 3)
    torch.testing.assert_close(totals, torch.ones_like(totals))
    # Each graph alone gives the same outputs.
    for graph in range(3):
        nodes = batch == graph
        keep = nodes[edge_index[1]]
        alone = conv(x[nodes], edge_index[:, keep] - 8 * graph)
        torch.testing.assert_close(out[nodes], alone, rtol=1e-10, atol=1e-10)
    # Without 'batch' all edges form one graph.
    _, (_, one) = conv(x, edge_index, return_attention_weights=True)
    torch.testing.assert_close(one.sum(0), torch.ones(2, dtype=one.dtype))


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('normalization', OTHERS)
def test_a_nan_graph_does_not_affect_the_others(normalization, backend):
    """A NaN feature in the first graph of a batch leaves the other graphs'
    outputs as they were."""
    x, edge_index, batch = random_batch(num_graphs=3, dtype=torch.float32)
    conv = layer(normalization, backend).float()
    call = {'batch': batch} if normalization == 'global' else {}
    clean = conv(x, edge_index, **call)
    x_bad = x.clone()
    x_bad[0, 1] = float('nan')
    out = conv(x_bad, edge_index, **call)
    first = batch == 0
    assert not out[first].isfinite().all()
    torch.testing.assert_close(out[~first], clean[~first])


@pytest.mark.parametrize('backend', ['fused', 'scatter'])
@pytest.mark.parametrize('normalization', NORMALIZATIONS)
def test_a_huge_graph_does_not_affect_the_others(normalization, backend):
    """Features of the first graph times 1e19: all outputs finite, the other
    graphs' outputs as they were."""
    x, edge_index, batch = random_batch(num_graphs=3, dtype=torch.float32)
    conv = layer(normalization, backend).float()
    call = {'batch': batch} if normalization == 'global' else {}
    clean = conv(x, edge_index, **call)
    first = batch == 0
    x_bad = x.clone()
    x_bad[first] *= 1e19
    out = conv(x_bad, edge_index, **call)
    assert out.isfinite().all()
    torch.testing.assert_close(out[~first], clean[~first])


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('normalization', OTHERS)
def test_huge_features_everywhere_give_finite_outputs(normalization, backend):
    x, edge_index, batch = random_batch(num_graphs=2, dtype=torch.float32)
    conv = layer(normalization, backend).float()
    call = {'batch': batch} if normalization == 'global' else {}
    for scale in (1e19, 1e30):
        assert conv(x * scale, edge_index, **call).isfinite().all()


@pytest.mark.parametrize('normalization', OTHERS)
def test_auto_backend_runs_the_other_normalisations(normalization):
    """``'auto'`` (fused on CPU) computes each normalisation: the dense
    construction's weights and outputs."""
    x, edge_index, batch = sparse_batch()
    conv = layer(normalization, 'auto')
    call = {'batch': batch} if normalization == 'global' else {}
    assert_equals_the_dense_construction(conv, x, edge_index, **call)


def test_compiled_layer_runs_the_other_normalisations():
    x, edge_index, _ = random_batch(dtype=torch.float32)
    conv = layer('sinkhorn', 'auto').float()
    eager = conv(x, edge_index)
    compiled = torch.compile(conv, backend='aot_eager')(x, edge_index)
    torch.testing.assert_close(compiled, eager)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="Unknown normalization 'softmax'"):
        MetricAttentionConv(4, 3, normalization='softmax')
    for iterations in (0, 1.5, True):
        with pytest.raises(ValueError, match="'sinkhorn_iterations' must be"):
            MetricAttentionConv(4, 3, normalization='sinkhorn',
                                sinkhorn_iterations=iterations)
    with pytest.raises(ValueError, match="backend='triton' computes "
                                         "normalization='row' only"):
        MetricAttentionConv(4, 3, normalization='column', backend='triton')
    with pytest.raises(ValueError, match="Unknown normalization"):
        MetricMultiheadAttention(8, 2, normalization='columns')
    with pytest.raises(ValueError, match="'sinkhorn_iterations' must be"):
        MetricMultiheadAttention(8, 2, normalization='sinkhorn',
                                 sinkhorn_iterations=-1)
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="Unknown normalization"):
        dense_metric_attention(q, q, q, normalization='two-side')

    x, edge_index, batch = random_batch()
    with pytest.raises(ValueError, match="normalization='global'; this layer "
                                         "normalises by 'sinkhorn'"):
        layer('sinkhorn', 'fused')(x, edge_index, batch=batch)
    conv = layer('global', 'fused')
    with pytest.raises(ValueError, match=r"'batch' must have shape \[16\]"):
        conv(x, edge_index, batch=batch[:-1])
    with pytest.raises(TypeError, match="'batch' must hold integer"):
        conv(x, edge_index, batch=batch.double())
    with pytest.raises(IndexError, match="negative graph index"):
        conv(x, edge_index, batch=batch - 1)


def test_repr_names_a_normalisation_other_than_row():
    assert 'normalization' not in repr(MetricAttentionConv(4, 3))
    assert "normalization='sinkhorn'" in repr(
        MetricAttentionConv(4, 3, normalization='sinkhorn'))
    assert "normalization='global'" in repr(
        MetricMultiheadAttention(8, 2, normalization='global'))


def test_experiment_options_reach_the_layers():
    """``-o normalization=...`` (and the former's ``former_normalization``)
    build the tasks' attention layers with it."""
    pytest.importorskip('sklearn')
    from pyg_metric_attn.experiments.tasks.human_seg import HumanSegTask
    from pyg_metric_attn.experiments.tasks.moon import MoonTask
    from pyg_metric_attn.nn.models import MetricMeshFormer

    moon = MoonTask(normalization='sinkhorn', sinkhorn_iterations=5)
    conv = moon.build_model('metric').convs[0]
    assert (conv.normalization, conv.sinkhorn_iterations) == ('sinkhorn', 5)
    human_seg = HumanSegTask(normalization='column')
    assert human_seg.build_model('metric').convs[0].normalization == 'column'
    with pytest.raises(ValueError, match="normalization='global' must be"):
        HumanSegTask(normalization='global')  # the IPN passes no batch
    former = MetricMeshFormer(3, 4, hidden_channels=8, heads=2, num_layers=1,
                              normalization='sinkhorn', sinkhorn_iterations=2)
    for attention in (former.blocks[0].local, former.blocks[0].global_attention):
        assert (attention.normalization, attention.sinkhorn_iterations) == (
            'sinkhorn', 2)


def test_the_former_normalises_each_mesh_of_a_batch_globally():
    from pyg_metric_attn.nn.models import MetricMeshFormer

    torch.manual_seed(0)
    former = MetricMeshFormer(3, 4, hidden_channels=8, heads=2, num_layers=1,
                              normalization='global').double().eval()
    x, edge_index, batch = random_batch(num_graphs=2, num_nodes=6, channels=3)
    together = former(x, edge_index, batch)
    first = batch == 0
    alone = former(x[first], edge_index[:, first[edge_index[1]]])
    torch.testing.assert_close(together[first], alone, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('normalization', OTHERS)
def test_weights_come_back_in_the_layers_dtype(normalization, backend):
    """Also where the fused logits are computed in float64 (huge points)."""
    x, edge_index, batch = random_batch(dtype=torch.float32)
    conv = layer(normalization, backend).float()
    call = {'batch': batch} if normalization == 'global' else {}
    for scale in (1.0, 1e19):
        out, (_, alpha) = conv(x * scale, edge_index,
                               return_attention_weights=True, **call)
        assert out.dtype == alpha.dtype == torch.float32
