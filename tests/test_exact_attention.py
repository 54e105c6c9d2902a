"""The exact correction of dense attention (issue 27, section 4): both
implementations of ``pyg_metric_attn::exact_attention_where`` (the CPU one,
and the Triton kernels, in Triton's interpreter without a GPU) against
autograd through float64 direct-difference attention, flagged and
unflagged softmaxes mixed in one call; dropout by gradcheck; no host read
in the kernels' launcher."""
from __future__ import annotations

import math

import pytest
import torch

from benchmarks.op_count import HOST_READS, OpCounter
from pyg_metric_attn.nn.exact_attention import exact_where, exact_where_backward

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
FLAGS = [[True, False], [False, True]]


def implementation(name):
    """``(forward, backward)`` with the signatures of the operators: on CPU
    tensors the operators run their CPU implementation, the launcher the
    Triton kernels (interpreted)."""
    if name == 'cpu':
        if DEVICE != 'cpu':
            pytest.skip('the CPU implementation runs on CPU tensors')
        return exact_where, exact_where_backward
    pytest.importorskip('triton', reason='triton is not installed')
    from pyg_metric_attn.nn.triton.exact import exact_backward, exact_forward
    return exact_forward, exact_backward


def reference(q, k, v, t, mask, causal, metric):
    """float64 autograd: softmax of the direct-difference logits, masked."""
    t = t[..., None, None]
    if metric == 'dot':
        logits = q @ k.transpose(-1, -2) / (math.sqrt(q.size(-1)) * t)
    else:
        logits = -(q.unsqueeze(-2) - k.unsqueeze(-3)).square().sum(-1) / t
    if causal:
        lq, lk = logits.shape[-2:]
        allowed = torch.ones(lq, lk, dtype=torch.bool, device=q.device).tril()
        logits = logits.masked_fill(~allowed, float('-inf'))
    if mask is not None and mask.dtype == torch.bool:
        logits = logits.masked_fill(~mask, float('-inf'))
    elif mask is not None:
        logits = logits + mask
    return torch.softmax(logits, -1) @ v


def call_inputs(metric, mask_kind, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    B, H, Lq, Lk, D, C = 2, 2, 19, 21, 5, 6

    def rand(*shape):
        return torch.randn(*shape, generator=g).to(DEVICE)
    q = rand(B, H, Lq, D) * 3
    k = rand(B, 1, Lk, D) * 3  # broadcast over heads
    if scale != 1.0:  # the flagged softmaxes hold huge points
        flagged = torch.tensor(FLAGS, device=DEVICE).view(B, H, 1, 1)
        q = torch.where(flagged, q * scale, q)
        k = k * scale
    v = rand(B, H, Lk, C)
    t = torch.tensor([0.7, 1.3], dtype=torch.float64, device=DEVICE)  # per head
    mask = None
    if mask_kind == 'bool':
        mask = rand(B, 1, 1, Lk) > -0.5
        mask[..., 0] = True
    elif mask_kind == 'float':
        mask = rand(1, H, Lq, Lk)
    return q, k, v, t, mask, rand(B, H, Lq, C)


@pytest.mark.parametrize('impl', ['cpu', 'triton'])
@pytest.mark.parametrize('metric', ['metric', 'dot'])
@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize('mask_kind', [None, 'bool', 'float'])
def test_matches_float64_autograd_where_flagged(impl, metric, causal, mask_kind):
    """Flagged softmaxes: output and the gradients of query, key (broadcast
    over heads), value, a per-head time scale and a float mask equal float64
    autograd; unflagged ones: the fused output, bit for bit, and no
    gradient."""
    forward, backward = implementation(impl)
    q, k, v, t, mask, fused = call_inputs(metric, mask_kind)
    flags = torch.tensor(FLAGS, device=DEVICE)
    out, stats = forward(flags, q, k, v, t, mask, None, fused, metric, causal, 0.0)
    inputs = [x.double().requires_grad_() for x in (q, k, v, t)]
    if mask_kind == 'float':
        inputs.append(mask.double().requires_grad_())
    expected = reference(*inputs[:4], inputs[4] if mask_kind == 'float' else mask,
                         causal, metric)
    assert torch.equal(out[~flags], fused[~flags])
    assert torch.allclose(out[flags].double(), expected[flags], atol=1e-6)

    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    grad_out = grad_out.to(DEVICE)
    need = [True, True, True, True, mask_kind == 'float']
    grads = backward(grad_out, flags, q, k, v, t, mask, None, stats, metric,
                     causal, 0.0, need)
    flagged = flags.view(2, 2, 1, 1)
    expected_grads = torch.autograd.grad(
        (expected * grad_out * flagged).sum(), inputs)
    for grad, expected_grad, x in zip(grads, expected_grads, inputs, strict=False):
        assert grad.shape == x.shape
        error = (grad.double() - expected_grad).abs().max()
        assert error <= 1e-5 * expected_grad.abs().max(), (grad, expected_grad)


@pytest.mark.parametrize('impl', ['cpu', 'triton'])
@pytest.mark.parametrize('metric', ['metric', 'dot'])
@pytest.mark.parametrize('scale', [1e4, 1e19])
def test_huge_points_are_exact_and_finite(impl, metric, scale):
    """Points of 1e19 (squared distances beyond float32) and dot products of
    points at 1e4 in the flagged softmaxes: finite, equal to float64."""
    forward, backward = implementation(impl)
    q, k, v, t, mask, fused = call_inputs(metric, 'bool', scale, seed=2)
    flags = torch.tensor(FLAGS, device=DEVICE)
    out, stats = forward(flags, q, k, v, t, mask, None, fused, metric, False, 0.0)
    expected = reference(q.double(), k.double(), v.double(), t, mask, False,
                         metric)
    assert out.isfinite().all()
    assert torch.allclose(out[flags].double(), expected[flags], atol=1e-5)
    grads = backward(torch.ones_like(out), flags, q, k, v, t, mask, None, stats,
                     metric, False, 0.0, [True] * 4 + [False])
    assert all(grad.isfinite().all() for grad in grads[:4])


class _Attention(torch.autograd.Function):
    """One implementation's forward and backward as a differentiable
    function of query, key, value and time scale (for gradcheck)."""
    @staticmethod
    def forward(ctx, q, k, v, t, impl, flags, seed, fused, metric, dropout_p):
        forward, _ = impl
        out, stats = forward(flags, q, k, v, t, None, seed, fused, metric, False,
                             dropout_p)
        ctx.save_for_backward(q, k, v, t, stats)
        ctx.args = impl, flags, seed, metric, dropout_p
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, t, stats = ctx.saved_tensors
        (_, backward), flags, seed, metric, dropout_p = ctx.args
        grads = backward(grad_out.contiguous(), flags, q, k, v, t, None, seed,
                         stats, metric, False, dropout_p, [True] * 4 + [False])
        return *grads[:4], None, None, None, None, None, None


@pytest.mark.parametrize('impl', ['cpu', 'triton'])
@pytest.mark.parametrize('metric', ['metric', 'dot'])
def test_dropout_draws_one_mask_for_forward_and_backward(impl, metric):
    """With dropout the flagged weights are ``0`` or ``w / (1 - p)`` (values
    = the identity reads them off), the same draw for the same seed, and
    gradcheck passes: backward redraws the forward's mask."""
    fns = implementation(impl)
    g = torch.Generator().manual_seed(3)
    flags = torch.tensor([[True, False]], device=DEVICE)
    q, k = (torch.randn(1, 2, 6, 2, generator=g, dtype=torch.float64).to(DEVICE)
            for _ in range(2))
    v = torch.eye(6, dtype=torch.float64, device=DEVICE).expand(1, 2, 6, 6)
    t = torch.tensor(1.5, dtype=torch.float64, device=DEVICE)
    seed = torch.tensor(12345, device=DEVICE)
    fused = torch.zeros(1, 2, 6, 6, dtype=torch.float64, device=DEVICE)
    args = fns, flags, seed, fused, metric, 0.5
    dropped = _Attention.apply(q, k, v, t, *args)[0, 0]
    weights = reference(q, k, v, t, None, False, metric)[0, 0]
    ratio = dropped / weights
    kept = ratio > 1
    assert torch.allclose(ratio[kept], torch.tensor(2.0, dtype=torch.float64))
    assert (ratio[~kept] == 0).all() and 0 < kept.sum() < kept.numel()
    assert torch.equal(_Attention.apply(q, k, v, t, *args)[0, 0], dropped)
    inputs = [x.clone().requires_grad_() for x in (q, k, v.contiguous(), t)]
    assert torch.autograd.gradcheck(lambda *x: _Attention.apply(*x, *args),
                                    inputs, fast_mode=True)


def test_the_kernels_read_nothing_back():
    """The launcher's forward and backward (three kernels) read nothing
    back to the host: their flags stay on the device."""
    forward, backward = implementation('triton')
    q, k, v, t, mask, fused = call_inputs('metric', 'float')
    flags = torch.tensor(FLAGS, device=DEVICE)
    seed = torch.tensor(7, device=DEVICE)
    with OpCounter() as counter:
        out, stats = forward(flags, q, k, v, t, mask, seed, fused, 'metric', True,
                             0.1)
        backward(torch.ones_like(out), flags, q, k, v, t, mask, seed, stats,
                 'metric', True, 0.1, [True] * 5)
    assert sum(counter.ops[op] for op in HOST_READS) == 0
    assert sum(counter.launches.values()) == 3


@pytest.mark.parametrize('batch', [(), (2, 3, 2)])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16, torch.float64])
def test_any_number_of_leading_dimensions_and_dtype(batch, dtype):
    """No leading dimension, or three (flattened to two), and 16- and 64-bit
    inputs: the kernels equal the CPU implementation, output and gradients
    (up to one unit in the last place of bfloat16)."""
    if DEVICE != 'cpu':
        pytest.skip('compares with the CPU implementation')
    kernels = implementation('triton')
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(*batch, 7, 3, generator=g).to(dtype) for _ in range(3))
    flags = (torch.rand(batch, generator=g) > 0.5) if batch else torch.tensor(True)
    t = torch.tensor(0.9, dtype=torch.float64)
    fused = torch.zeros(*batch, 7, 3, dtype=dtype)
    results = []
    for forward, backward in ((exact_where, exact_where_backward), kernels):
        out, stats = forward(flags, q, k, v, t, None, None, fused, 'metric', True,
                             0.0)
        results.append((out, *backward(torch.ones_like(out), flags, q, k, v, t,
                                       None, None, stats, 'metric', True, 0.0,
                                       [True] * 4 + [False])[:4]))
    ulp = torch.finfo(dtype).eps if dtype == torch.bfloat16 else 1e-6
    for got, expected in zip(*results, strict=True):
        assert got.dtype == expected.dtype
        assert torch.allclose(got.double(), expected.double(),
                              atol=ulp * float(expected.abs().max()))


@pytest.mark.parametrize('impl', ['cpu', 'triton'])
def test_a_row_without_keys_is_nan_and_gets_no_gradient(impl):
    """As SDPA: NaN output in a row that may attend to no key; the other
    rows and every gradient stay finite and equal float64 autograd over
    the other rows."""
    forward, backward = implementation(impl)
    q, k, v, t, _, fused = call_inputs('metric', None)
    mask = torch.ones(2, 2, 19, 21, dtype=torch.bool, device=DEVICE)
    mask[:, :, 0] = False  # query 0 sees no key
    flags = torch.tensor(FLAGS, device=DEVICE)
    out, stats = forward(flags, q, k, v, t, mask, None, fused, 'metric', False,
                         0.0)
    assert out[flags][:, 0].isnan().all() and out[flags][:, 1:].isfinite().all()
    grad_out = torch.ones_like(out)
    grad_out[:, :, 0] = 0  # what reaches the NaN rows does not matter here
    grads = backward(grad_out, flags, q, k, v, t, mask, None, stats, 'metric',
                     False, 0.0, [True] * 4 + [False])
    inputs = [x.double().requires_grad_() for x in (q, k, v)]
    expected = reference(*inputs, t, None, False, 'metric')[:, :, 1:]
    expected_grads = torch.autograd.grad(
        (expected * flags.view(2, 2, 1, 1)).sum(), inputs)
    for grad, expected_grad in zip(grads, expected_grads, strict=False):
        assert torch.allclose(grad.double(), expected_grad,
                              atol=1e-5 * float(expected_grad.abs().max()))
