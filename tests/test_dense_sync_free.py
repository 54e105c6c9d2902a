"""Dense metric attention without a host synchronisation (issue 27): both
precision policies read nothing back on a repeated step and compile as one
graph; ``'checked'`` decides per softmax on the device and corrects the
flagged ones with ``pyg_metric_attn::exact_attention_where`` (whose CPU
implementation looks at its CPU flags, no device synchronisation; its
Triton implementation reads nothing back either: tests/test_exact_attention.py)."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo

from benchmarks.op_count import OpCounter, autograd_nodes
from pyg_metric_attn import MetricMultiheadAttention
from pyg_metric_attn.nn.functional import dense_metric_attention

METRICS = ['metric', 'l2', 'dot']


def training_step(mha, x, padding):
    out, _ = mha(x, x, x, key_padding_mask=padding, need_weights=False,
                 is_causal=True)
    out.square().mean().backward()
    return out


@pytest.mark.parametrize('metric', METRICS)
@pytest.mark.parametrize('precision', ['fast', 'checked'])
def test_host_reads_on_a_repeated_step(metric, precision):
    """Forward and backward of a step, the second time round: no read with
    either policy but the exact CPU correction's look at its CPU flags;
    with a learned time scale and padding."""
    torch.manual_seed(0)
    mha = MetricMultiheadAttention(16, 2, metric=metric, learn_time_scale=True,
                                   precision=precision)
    x = torch.randn(2, 9, 16)
    padding = torch.zeros(2, 9, dtype=torch.bool)
    padding[1, 6:] = True
    training_step(mha, x, padding)
    with OpCounter() as counter:
        training_step(mha, x, padding)
        out = training_step(mha, x, padding)
    # 'checked' runs the exact correction (eagerly, not dispatched as the
    # custom operator: pyg_metric_attn.nn.eager_operator), whose CPU
    # implementation looks at its CPU flags, forward and backward (no device
    # to wait for; on a GPU: test_no_synchronisation_on_cuda). Nothing else
    # reads.
    checked = precision == 'checked'
    reads = counter.ops['_local_scalar_dense'] + counter.ops['item']
    assert reads == (4 if checked else 0)
    assert ('ExactAttentionWhereBackward' in autograd_nodes(out)) == checked
    assert not counter.ops['exact_attention_where']


@pytest.mark.parametrize('metric', METRICS)
def test_no_synchronisation_on_cuda(metric, device):
    """On a GPU (``pytest --device cuda``): a repeated training step with
    the default precision, a huge batch element included (its softmaxes
    take the exact kernels), runs under ``set_sync_debug_mode('error')``."""
    if device.type != 'cuda':
        pytest.skip('needs --device cuda')
    torch.manual_seed(0)
    mha = MetricMultiheadAttention(16, 2, metric=metric, dropout=0.1,
                                   learn_time_scale=True).to(device)
    x = torch.randn(2, 9, 16, device=device)
    x[1] *= 1e19
    padding = torch.zeros(2, 9, dtype=torch.bool, device=device)
    padding[1, 6:] = True
    training_step(mha, x, padding)  # compiles the kernels
    torch.cuda.set_sync_debug_mode('error')
    try:
        out = training_step(mha, x, padding)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert out[~padding].isfinite().all()


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
@pytest.mark.parametrize('precision', ['fast', 'checked'])
def test_module_compiles_as_one_graph(metric, precision):
    """``torch.compile(fullgraph=True)`` of the layer (training: the
    augmented form) and of the function (inference: the key bias), equal to
    eager."""
    torch.manual_seed(2)
    mha = MetricMultiheadAttention(16, 2, metric=metric, learn_time_scale=True,
                                   precision=precision)
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
                          .logical_not(), precision=precision)
        expected, _ = dense_metric_attention(
            q, k, v, metric, 1.5, attn_mask=padding.view(2, 1, 1, 8)
            .logical_not())
    assert torch.allclose(out, expected, atol=1e-6)


@pytest.mark.parametrize('metric', METRICS)
def test_checked_precision_compiles_and_corrects_only_the_bad_softmax(metric):
    """The default policy under ``torch.compile(fullgraph=True)`` with one
    batch element of huge points (1e19: the fused logits overflow): that
    element is exact and finite, gradients included, and the other element
    is the fused result, bit for bit the ``'fast'`` one."""
    torch.manual_seed(3)
    mha = MetricMultiheadAttention(16, 2, metric=metric)
    fast = MetricMultiheadAttention(16, 2, metric=metric, precision='fast')
    fast.load_state_dict(mha.state_dict())
    x = torch.randn(2, 7, 16) * torch.tensor([1.0, 1e19]).view(2, 1, 1)
    x.requires_grad_()
    torch._dynamo.reset()
    compiled = torch.compile(mha, fullgraph=True, backend='aot_eager')
    out = compiled(x, x, x, need_weights=False)[0]
    assert out.isfinite().all()
    assert torch.equal(out[0], fast(x, x, x, need_weights=False)[0][0])
    with torch.no_grad():
        exact = mha(x, x, x, need_weights=True)[0]  # explicit float64 logits
    assert torch.allclose(out, exact, rtol=1e-4, atol=1e-4 * exact.abs().max())
    grad, = torch.autograd.grad(out.square().mean(), x)
    assert grad.isfinite().all()


def test_unknown_precision_is_a_clear_error():
    with pytest.raises(ValueError, match="Unknown precision 'exact'"):
        MetricMultiheadAttention(16, 2, precision='exact')
    q = torch.randn(1, 3, 4)
    with pytest.raises(ValueError, match="Unknown precision 'exact'"):
        dense_metric_attention(q, q, q, precision='exact')
