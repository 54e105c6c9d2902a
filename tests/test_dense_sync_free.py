"""Dense metric attention without a host synchronisation (issue 27): the
``'fast'`` precision policy reads nothing back on a repeated step and
compiles as one graph; the ``'checked'`` policy reads its rounding estimate
once per call."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo

from benchmarks.op_count import OpCounter
from pyg_metric_attn import MetricMultiheadAttention
from pyg_metric_attn.nn.functional import dense_metric_attention

METRICS = ['metric', 'l2', 'dot']


def training_step(mha, x, padding):
    out, _ = mha(x, x, x, key_padding_mask=padding, need_weights=False,
                 is_causal=True)
    out.square().mean().backward()
    return out


@pytest.mark.parametrize('metric', METRICS)
@pytest.mark.parametrize('precision,reads', [('fast', 0), ('checked', 2)])
def test_host_reads_on_a_repeated_step(metric, precision, reads):
    """Forward and backward of a step, the second time round: no read with
    ``'fast'``, one per attention call and step (and none else) with
    ``'checked'``; with a learned time scale and padding."""
    torch.manual_seed(0)
    mha = MetricMultiheadAttention(16, 2, metric=metric, learn_time_scale=True,
                                   precision=precision)
    x = torch.randn(2, 9, 16)
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[1, 6:] = True
    training_step(mha, x, padding)
    with OpCounter() as counter:
        training_step(mha, x, padding)
        training_step(mha, x, padding)
    assert counter.ops['_local_scalar_dense'] + counter.ops['item'] == reads


@pytest.mark.parametrize('metric', METRICS)
def test_fast_precision_equals_checked_at_ordinary_scale(metric):
    torch.manual_seed(1)
    checked = MetricMultiheadAttention(16, 2, metric=metric, time_scale=2.0)
    fast = MetricMultiheadAttention(16, 2, metric=metric, time_scale=2.0,
                                    precision='fast')
    fast.load_state_dict(checked.state_dict())
    x = torch.randn(3, 7, 16, requires_grad=True)
    outputs = [layer(x, x, x, need_weights=False)[0] for layer in (checked, fast)]
    grads = [torch.autograd.grad(out.sum(), x)[0] for out in outputs]
    assert torch.equal(*outputs) and torch.equal(*grads)


@pytest.mark.parametrize('metric', METRICS)
def test_module_compiles_as_one_graph(metric):
    """``torch.compile(fullgraph=True)`` of the layer (training: the
    augmented form) and of the function (inference: the key bias), equal to
    eager."""
    torch.manual_seed(2)
    mha = MetricMultiheadAttention(16, 2, metric=metric, learn_time_scale=True,
                                   precision='fast')
    x = torch.randn(2, 8, 16, requires_grad=True)
    padding = torch.zeros(2, 8, dtype=torch.bool)
    padding[0, 5:] = True
    torch._dynamo.reset()
    compiled = torch.compile(mha, fullgraph=True, backend='aot_eager')
    out = compiled(x, x, x, key_padding_mask=padding, need_weights=False)[0]
    expected = mha(x, x, x, key_padding_mask=padding, need_weights=False)[0]
    assert torch.allclose(out, expected, atol=1e-6)
    grad, = torch.autograd.grad(out.sum(), x)
    expected_grad, = torch.autograd.grad(expected.sum(), x)
    assert torch.allclose(grad, expected_grad, atol=1e-5)

    q, k, v = torch.randn(3, 2, 2, 8, 7).unbind(0)
    function = torch.compile(dense_metric_attention, fullgraph=True,
                             backend='aot_eager')
    with torch.no_grad():
        out, _ = function(q, k, v, metric, 1.5, attn_mask=padding.view(2, 1, 1, 8)
                          .logical_not(), precision='fast')
        expected, _ = dense_metric_attention(
            q, k, v, metric, 1.5, attn_mask=padding.view(2, 1, 1, 8)
            .logical_not())
    assert torch.allclose(out, expected, atol=1e-6)


def test_checked_precision_still_breaks_the_graph():
    """The ``'checked'`` read is data dependent: ``fullgraph`` rejects it."""
    mha = MetricMultiheadAttention(16, 2)
    x = torch.randn(1, 5, 16)
    torch._dynamo.reset()
    compiled = torch.compile(mha, fullgraph=True, backend='aot_eager')
    with pytest.raises(torch._dynamo.exc.Unsupported):
        compiled(x, x, x, need_weights=False)


def test_unknown_precision_is_a_clear_error():
    with pytest.raises(ValueError, match="Unknown precision 'exact'"):
        MetricMultiheadAttention(16, 2, precision='exact')
    q = torch.randn(1, 3, 4)
    with pytest.raises(ValueError, match="Unknown precision 'exact'"):
        dense_metric_attention(q, q, q, precision='exact')
