"""Dense metric-attention through SDPA against a float64 cdist reference."""
from __future__ import annotations

import math
import re

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from pyg_metric_attn.nn.functional import (
    attention_logits,
    dense_metric_attention,
    merge_masks,
)
from pyg_metric_attn.nn.logits import (
    LOGIT_ROUNDING_TOLERANCE,
    centred,
    check_precision,
    needs_exact,
    rounding_error,
    slice_time_scale,
)


def reference(q, k, v, metric, t=1.0, mask=None, causal=False):
    q, k, v = q.double(), k.double(), v.double()
    if metric == 'dot':
        logits = q @ k.transpose(-1, -2) / (math.sqrt(q.size(-1)) * t)
    else:
        logits = -torch.cdist(q, k).square() / t
    if causal:
        lq, lk = logits.shape[-2:]
        logits = logits.masked_fill(~torch.ones(lq, lk, dtype=torch.bool,
                                                device=logits.device).tril(),
                                    float('-inf'))
    if mask is not None:
        logits = logits.masked_fill(~mask, float('-inf'))
    weights = torch.softmax(logits, -1)
    return weights @ v, weights


def rel(a, b):
    return float((a.double() - b).norm() / b.norm())


@pytest.mark.parametrize('metric', ['metric', 'l2', 'dot'])
@pytest.mark.parametrize('offset', [0.0, 1e3])
@pytest.mark.parametrize('grad', [False, True])
def test_matches_cdist_reference_with_masks(metric, offset, grad, device):
    """Both SDPA forms (key bias for inference, augmented for training or
    causal calls) against float64, gradients included. Dot logits of points
    at 1e3 (~1e6) are beyond float32 and must take the exact float64 path."""
    g = torch.Generator().manual_seed(0)
    B, H, L, D = 3, 2, 33, 8
    q = (torch.randn(B, H, L, D, generator=g) + offset).to(device) \
        .requires_grad_(grad)
    k = (torch.randn(B, H, L, D, generator=g) + offset).to(device) \
        .requires_grad_(grad)
    v = torch.randn(B, H, L, 5, generator=g).to(device).requires_grad_(grad)
    padding = torch.ones(B, L, dtype=torch.bool)
    padding[1, 20:] = False
    mask = padding.view(B, 1, 1, L).to(device)
    for causal in (False, True):
        out, _ = dense_metric_attention(q, k, v, metric, 0.8, attn_mask=mask,
                                        is_causal=causal)
        expected, _ = reference(q, k, v, metric, 0.8, mask, causal)
        assert rel(out, expected) < 1e-5
        if not grad:
            continue
        weight = torch.randn(out.shape, generator=g).to(device)
        inputs = (q, k, v)
        grads = torch.autograd.grad((out * weight).sum(), inputs)
        expected_grads = torch.autograd.grad((expected * weight).sum(), inputs)
        for got, expected_grad in zip(grads, expected_grads, strict=True):
            assert rel(got, expected_grad) < (1e-4 if offset else 1e-5)


@pytest.mark.parametrize('grad,causal', [(False, False), (True, False),
                                         (True, True)])
def test_peak_memory_grows_linearly_in_length(grad, causal):
    """The largest buffer of forward (+ backward) grows ~linearly from L to 4L
    (the explicit ``need_weights`` path grows 16x: the check can fail)."""
    g = torch.Generator().manual_seed(4)

    def largest_allocation(length, need_weights):
        q, k, v = (torch.randn(1, 1, length, 8, generator=g, requires_grad=grad)
                   for _ in range(3))
        with profile(activities=[ProfilerActivity.CPU],
                     profile_memory=True) as prof:
            out, _ = dense_metric_attention(q, k, v, 'metric', 0.5,
                                            is_causal=causal,
                                            need_weights=need_weights)
            if grad:
                out.sum().backward()
        return max(event.self_cpu_memory_usage for event in prof.events())

    growth = largest_allocation(2048, False) / largest_allocation(512, False)
    assert growth <= 4.5
    assert largest_allocation(2048, True) / largest_allocation(512, True) >= 15


def test_inference_at_a_narrower_metric_width_stays_linear_in_memory():
    """Metric width 7 beside values of width 8 (MetricMultiheadAttention's
    default layout), no gradient: the augmented form (8 wide) runs, not the
    key bias, whose unequal widths would take SDPA's quadratic kernel."""
    g = torch.Generator().manual_seed(6)

    def largest_allocation(length):
        q, k = (torch.randn(1, 1, length, 7, generator=g) for _ in range(2))
        v = torch.randn(1, 1, length, 8, generator=g)
        with profile(activities=[ProfilerActivity.CPU],
                     profile_memory=True) as prof:
            out, _ = dense_metric_attention(q, k, v, 'metric', 0.5)
        assert rel(out, reference(q, k, v, 'metric', 0.5)[0]) < 1e-5
        return max(event.self_cpu_memory_usage for event in prof.events())

    assert largest_allocation(2048) / largest_allocation(512) <= 4.5


def test_float_mask_and_need_weights_agree_with_reference():
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 10, 4, generator=g), torch.randn(2, 12, 4, generator=g)
    v = torch.randn(2, 12, 3, generator=g)
    additive = torch.randn(10, 12, generator=g)
    out, weights = dense_metric_attention(q, k, v, 'metric', attn_mask=additive,
                                          need_weights=True)
    fused, none = dense_metric_attention(q, k, v, 'metric', attn_mask=additive)
    logits = -torch.cdist(q.double(), k.double()).square() + additive.double()
    expected = torch.softmax(logits, -1)
    assert none is None
    assert rel(weights, expected) < 1e-6
    assert rel(out, expected @ v.double()) < 1e-5
    assert rel(fused, expected @ v.double()) < 1e-5


def test_learned_time_scale_tensor_and_gradients():
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 7, 3, dtype=torch.double, generator=g, requires_grad=True)
    k = torch.randn(1, 2, 7, 3, dtype=torch.double, generator=g, requires_grad=True)
    v = torch.randn(1, 2, 7, 3, dtype=torch.double, generator=g, requires_grad=True)
    t = torch.tensor(0.6, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v, t: dense_metric_attention(q, k, v, 'metric', t)[0],
        (q, k, v, t))
    out, _ = dense_metric_attention(q, k, v, 'l2', t)
    assert rel(out, reference(q, k, v, 'l2', 0.6)[0]) < 1e-10


def test_bf16_is_close(device):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 64, 16, generator=g).to(device)
               for _ in range(3))
    out, _ = dense_metric_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(),
                                    'metric')
    assert rel(out.float(), reference(q, k, v, 'metric')[0]) < 3e-2


def test_logits_are_negative_squared_distances():
    q, k = torch.randn(5, 3), torch.randn(6, 3)
    assert torch.allclose(attention_logits(q, k, 'l2', 2.0),
                          -torch.cdist(q, k).square() / 2.0, atol=1e-5)


@pytest.mark.parametrize('width', [63, 64])
@pytest.mark.parametrize('offset', [0.0, 30.0])
def test_bf16_within_1e_2_of_float64(width, offset):
    """bfloat16 points at metric widths 63 (the augmented width a native
    head size) and 64, near and far from the origin: output (at the
    saturating :math:`t = 1` and at the matched :math:`t = 2 \\sqrt{D}`) and
    key gradient (at the matched :math:`t`; at :math:`t = 1` the saturated
    softmax's gradient is off by about 2e-2) within 1e-2 relative of float64
    on the same rounded inputs, by the key-bias and the augmented form."""
    g = torch.Generator().manual_seed(5)
    q, k = (torch.randn(2, 2, 96, width, generator=g).add(offset).bfloat16()
            for _ in range(2))
    v = torch.randn(2, 2, 96, 64, generator=g).bfloat16()
    mask = torch.ones(2, 1, 1, 96, dtype=torch.bool)
    mask[1, ..., 70:] = False
    for t in (1.0, 2 * math.sqrt(width)):
        expected, _ = reference(q, k, v, 'metric', t, mask)
        with torch.no_grad():
            out, _ = dense_metric_attention(q, k, v, 'metric', t, attn_mask=mask)
        assert rel(out, expected) < 1e-2
        key = k.clone().requires_grad_()
        out, _ = dense_metric_attention(q, key, v, 'metric', t, attn_mask=mask)
        assert rel(out.detach(), expected) < 1e-2
    weight = torch.randn(out.shape, generator=g)
    grad, = torch.autograd.grad((out * weight.bfloat16()).sum(), key)
    points = k.double().requires_grad_()
    expected_grad, = torch.autograd.grad(
        (reference(q, points, v, 'metric', t, mask)[0] * weight.double()).sum(),
        points)
    assert rel(grad, expected_grad) < 1e-2


def test_logits_default_time_scale_batches_and_far_points():
    """Default ``t = 1``, batched 3-d inputs, and distances of points at 1e3
    to float32 accuracy (direct differences, not ``|q|^2 - 2 q.k + |k|^2``)."""
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(2, 5, 3, generator=g), torch.randn(2, 6, 3, generator=g)
    expected = -(q[:, :, None] - k[:, None]).square().sum(-1)
    torch.testing.assert_close(attention_logits(q, k, 'l2'), expected)
    torch.testing.assert_close(attention_logits(q, k, 'dot', 2.0),
                               q @ k.transpose(1, 2) / (math.sqrt(3) * 2.0))
    # More than 25 points, where cdist would otherwise take the mm form:
    far_q, far_k = (torch.randn(2, 30, 3, generator=g) + 1e3 for _ in range(2))
    exact = -torch.cdist(far_q.double(), far_k.double()).square()
    assert (attention_logits(far_q, far_k, 'metric').double()
            - exact).abs().max() < 1e-3


def sinkhorn_reference(logits, iterations):
    for _ in range(iterations):
        logits = logits.log_softmax(-2).log_softmax(-1)
    return logits.exp()


@pytest.mark.parametrize('normalization,iterations', [
    ('column', 3), ('global', 3), ('sinkhorn', 1), ('sinkhorn', 4)])
def test_other_normalizations_against_float64(normalization, iterations):
    """Column, global and Sinkhorn weights (with the number of Sinkhorn
    steps asked for) and their outputs, masked and batched, against float64;
    queries and keys of different counts."""
    g = torch.Generator().manual_seed(6)
    q, k = torch.randn(2, 7, 4, generator=g), torch.randn(2, 9, 4, generator=g)
    v = torch.randn(2, 9, 3, generator=g)
    mask = torch.rand(7, 9, generator=g) < 0.7
    mask[torch.arange(7), torch.arange(7)] = True  # no empty row or column
    mask[:, 7:] = True
    logits = (-torch.cdist(q.double(), k.double()).square() / 0.5).masked_fill(
        ~mask, float('-inf'))
    expected = {'column': lambda: logits.softmax(-2),
                'global': lambda: logits.flatten(-2).softmax(-1).view_as(logits),
                'sinkhorn': lambda: sinkhorn_reference(logits, iterations)
                }[normalization]()
    out, weights = dense_metric_attention(
        q, k, v, 'metric', 0.5, attn_mask=mask, need_weights=True,
        normalization=normalization, sinkhorn_iterations=iterations)
    assert rel(weights, expected) < 1e-5
    assert rel(out, expected @ v.double()) < 1e-5
    assert dense_metric_attention(
        q, k, v, 'metric', 0.5, attn_mask=mask,
        normalization=normalization)[1] is None  # weights only when asked


@pytest.mark.parametrize('need_weights', [False, True])
@pytest.mark.parametrize('masked', [False, True])
def test_causal_with_more_keys_than_queries(need_weights, masked):
    """``is_causal`` with 3-d inputs and ``L_q != L_k`` (query i attends to
    keys j <= i), alone and beside a mask, fused and explicit."""
    g = torch.Generator().manual_seed(7)
    q, k = torch.randn(2, 7, 4, generator=g), torch.randn(2, 9, 4, generator=g)
    v = torch.randn(2, 9, 3, generator=g)
    mask = torch.tensor([True, False] * 4 + [True]) if masked else None
    out, _ = dense_metric_attention(q, k, v, 'metric', attn_mask=mask,
                                    is_causal=True, need_weights=need_weights)
    assert rel(out, reference(q, k, v, 'metric', mask=mask, causal=True)[0]) \
        < 1e-5


@pytest.mark.parametrize('blocked_key', [float('nan'), 1e30])
@pytest.mark.parametrize('boolean', [False, True])
def test_a_blocked_key_changes_nothing(blocked_key, boolean):
    """A NaN or a far (1e30) key that a mask blocks changes nothing: the
    output equals attention over the other keys."""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(1, 2, 5, 3, generator=g) for _ in range(3))
    k[0, 0, 3] = blocked_key
    blocked = torch.zeros(5).index_fill(0, torch.tensor([3]), float('-inf'))
    mask = blocked == 0 if boolean else blocked
    out, _ = dense_metric_attention(q, k, v, 'metric', attn_mask=mask)
    kept = torch.tensor([0, 1, 2, 4])
    expected, _ = reference(q, k[..., kept, :], v[..., kept, :], 'metric')
    assert rel(out, expected) < 1e-5


def test_defaults_are_metric_and_three_sinkhorn_steps():
    g = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(4, 3, generator=g) for _ in range(3))
    out, _ = dense_metric_attention(q, k, v)
    assert rel(out, reference(q, k, v, 'metric')[0]) < 1e-5
    _, weights = dense_metric_attention(q, k, v, normalization='sinkhorn',
                                        need_weights=True)
    expected = sinkhorn_reference(-torch.cdist(q.double(), k.double()).square(), 3)
    assert rel(weights, expected) < 1e-5


@pytest.mark.parametrize('need_weights', [False, True])
def test_dropout_drops_and_is_unbiased(need_weights):
    """Dropout on the weights, fused and explicit: one draw differs from the
    output without dropout, the mean of many draws matches it."""
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 6, 4, generator=g) for _ in range(3))
    plain, _ = dense_metric_attention(q, k, v, 'metric',
                                      need_weights=need_weights)
    torch.manual_seed(0)
    draws = torch.stack([dense_metric_attention(
        q, k, v, 'metric', dropout_p=0.25, need_weights=need_weights)[0]
        for _ in range(2000)])
    assert not torch.allclose(draws[0], plain)
    assert (draws.mean(0) - plain).abs().max() < 0.05
    # One key of value 1: each draw keeps it, scaled by 1/(1 - p), or not.
    one = torch.ones(1, 1, 1)
    kept = {round(float(dense_metric_attention(
        q[:, :1], q[:, :1], one, 'metric', dropout_p=0.25,
        need_weights=need_weights)[0]), 5) for _ in range(200)}
    assert kept == {0.0, round(1 / 0.75, 5)}


@pytest.mark.parametrize('value_width', [2, 9])
def test_value_width_differs_from_the_key_width(value_width):
    """Values narrower and wider than the augmented keys (width D + 1), in
    the training (augmented) form, gradients included."""
    g = torch.Generator().manual_seed(9)
    q = torch.randn(1, 2, 6, 3, generator=g)
    k = torch.randn(1, 2, 6, 3, generator=g, requires_grad=True)
    v = torch.randn(1, 2, 6, value_width, generator=g, requires_grad=True)
    out, _ = dense_metric_attention(q, k, v, 'l2', 0.7)
    expected, _ = reference(q, k, v, 'l2', 0.7)
    assert out.shape == (1, 2, 6, value_width)
    assert rel(out, expected) < 1e-5
    for got, want in zip(torch.autograd.grad(out.sum(), (k, v)),
                         torch.autograd.grad(expected.sum(), (k, v)),
                         strict=True):
        assert rel(got, want) < 1e-5


def test_exact_path_returns_the_input_dtypes():
    """Far-apart points take the float64 path; output and weights come back
    in the inputs' float32."""
    g = torch.Generator().manual_seed(10)
    q, k, v = (torch.randn(1, 5, 3, generator=g) for _ in range(3))
    out, weights = dense_metric_attention(q, k * 1e4, v, 'metric',
                                          need_weights=True)
    assert out.dtype == weights.dtype == torch.float32
    expected_out, expected = reference(q, k * 1e4, v, 'metric')
    assert rel(weights, expected) < 1e-6 and rel(out, expected_out) < 1e-5


def test_merge_masks_combines_boolean_and_additive_masks():
    allowed = torch.tensor([[True, False, True]])
    causal = torch.tensor([[True], [True], [False]])  # broadcast to [3, 3]
    both = merge_masks([allowed, None, causal], torch.float64)
    assert both.dtype == torch.bool
    assert torch.equal(both, allowed & causal)
    assert torch.equal(merge_masks([allowed, causal, allowed], torch.float64),
                       allowed & causal)
    additive = torch.tensor([[0.5, 1.0, -2.0]])
    mixed = merge_masks([allowed, additive, causal], torch.bfloat16)
    assert mixed.dtype == torch.bfloat16
    expected = additive.expand(3, 3).masked_fill(~(allowed & causal),
                                                 float('-inf'))
    assert torch.equal(mixed.float(), expected)
    assert merge_masks([None, None], torch.float32) is None


@pytest.mark.parametrize('need_weights', [False, True])
def test_no_queries(need_weights):
    k, v = torch.randn(2, 4, 3), torch.randn(2, 4, 2)
    out, _ = dense_metric_attention(k[:, :0], k, v, need_weights=need_weights)
    assert out.shape == (2, 0, 2)


def test_rounding_error_is_the_documented_estimate():
    r"""``u sqrt(D) (max|q| + max|k|)^2 / t`` for distances, ``u max|q|
    max|k| / t`` for dot products (u: half float32's epsilon, float64's for
    float64 points); a NaN point is ignored, an infinite one makes it
    infinite; per slice, one value per leading index."""
    u32, u64 = 2.0 ** -24, 2.0 ** -53
    q = torch.tensor([[3.0, 4.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])  # max 5
    k = torch.tensor([[0.0, 0.0, 0.5, 0.0], [float('nan')] * 4])  # max 0.5
    assert float(rounding_error(q, k, 'metric', 0.5)) == u32 * 2 * 5.5 ** 2 / 0.5
    assert float(rounding_error(q, k, 'dot', 0.5)) == u32 * 2.5 / 0.5
    assert float(rounding_error(q.double(), k.double(), 'l2', 2.0)) == \
        u64 * 2 * 5.5 ** 2 / 2.0
    assert float(rounding_error(k, k, 'metric', 1.0)) == u32 * 2 * 1.0
    none = torch.zeros(2, 0, 4)  # no points: no rounding
    assert rounding_error(none[0], none[0], 'metric', 1.0).dtype == torch.float64
    assert float(rounding_error(none[0], none[0], 'metric', 1.0)) == 0
    assert rounding_error(none, none, 'dot', 1.0, per_slice=True).tolist() == [0, 0]
    k[0, 0] = float('inf')
    assert rounding_error(q, k, 'metric', 1.0) == math.inf
    # Per slice ([2, L, D]: one per leading index) with a time scale each.
    q2 = torch.stack([q, 2 * q])
    k2 = torch.stack([torch.zeros(2, 4), torch.ones(2, 4)])  # max 0 and 2
    t = torch.tensor([1.0, 4.0]).view(2, 1, 1)
    error = rounding_error(q2, k2, 'metric', t, per_slice=True)
    assert error.dtype == torch.float64 and error.shape == (2,)
    torch.testing.assert_close(error, torch.tensor([u32 * 2 * 25 / 1,
                                                    u32 * 2 * 144 / 4],
                                                   dtype=torch.float64))


def test_needs_exact_decides_per_softmax():
    """Only the slice whose estimate passes the tolerance (here the
    distance logits of points of norm 58, 1.6e-3; the dot estimate of the
    same points, 2e-4, stays under it) takes the exact path."""
    q = torch.stack([torch.randn(3, 4, generator=torch.Generator()
                                 .manual_seed(0)),
                     torch.full((3, 4), 29.0)])  # [2, 3, 4]
    flags = needs_exact(q, q, 'metric', 1.0)
    assert flags.tolist() == [False, True]
    assert float(rounding_error(q[1], q[1], 'dot', 1.0)) < LOGIT_ROUNDING_TOLERANCE
    assert needs_exact(q, q, 'dot', 1.0).tolist() == [False, False]


def test_needs_exact_flags_only_estimates_over_the_tolerance():
    """An estimate exactly at the tolerance is accepted (the exact path is
    for those that exceed it), one a hair above is not; with no keys (a
    softmax over nothing, ``[B, H, 0, D]``) nothing is flagged, one flag
    per batch element and head. The estimate here is float32's ``u =
    2^-24`` times the unit norms over ``t``, exact in float64."""
    point = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    at_tolerance = 2.0 ** -24 / LOGIT_ROUNDING_TOLERANCE
    assert float(rounding_error(point, point, 'dot', at_tolerance)) \
        == LOGIT_ROUNDING_TOLERANCE
    assert not needs_exact(point, point, 'dot', at_tolerance)
    assert needs_exact(point, point, 'dot', at_tolerance * (1 - 1e-9))
    query, no_keys = torch.ones(2, 3, 1, 4), torch.ones(2, 3, 0, 4)
    flags = needs_exact(query, no_keys, 'metric', 1.0)
    assert flags.shape == (2, 3) and not flags.any()
    torch.testing.assert_close(  # |q| = 2, no key: u sqrt(4) 2^2
        rounding_error(query, no_keys, 'metric', 1.0, per_slice=True),
        torch.full((2, 3), 2.0 ** -24 * 2 * 4, dtype=torch.float64))


def test_slice_time_scale_shapes():
    scalar = slice_time_scale(2.0, torch.device('cpu'))
    assert scalar.dtype == torch.float64 and scalar.shape == () and scalar == 2
    assert slice_time_scale(torch.tensor([3.0]), torch.device('cpu')).shape == ()
    per_slice = torch.arange(1.0, 7.0).view(2, 3, 1, 1)
    torch.testing.assert_close(slice_time_scale(per_slice, torch.device('cpu')),
                               per_slice.double()[..., 0, 0])
    for shape in ((2, 3), (2, 1, 2), (3, 1)):
        with pytest.raises(ValueError, match=re.escape(
                f"A tensor 'time_scale' must have one element or one per batch "
                f"element and head ([..., 1, 1]), got shape {list(shape)}")):
            slice_time_scale(torch.ones(shape), torch.device('cpu'))


def test_centred_shifts_by_the_mean_of_the_counted_keys():
    """The mean of the finite keys (of those the mask allows) along the
    softmax's dimension, per batch element: subtracted from both; no key
    left, no shift; one tied tensor stays one."""
    key = torch.tensor([[[1.0, 2.0], [3.0, 6.0], [float('nan'), 0.0]],
                        [[5.0, 5.0], [7.0, 1.0], [9.0, 3.0]]])  # [2, 3, 2]
    query = torch.zeros(2, 1, 2)
    shifted_query, shifted_key = centred(query, key)
    centre = torch.tensor([[[2.0, 4.0]], [[7.0, 3.0]]])
    torch.testing.assert_close(shifted_query, -centre)
    torch.testing.assert_close(shifted_key[:, :2], key[:, :2] - centre)
    mask = torch.tensor([True, False, False]).view(1, 3, 1)
    torch.testing.assert_close(centred(query, key, mask=mask)[0],
                               -torch.tensor([[[1.0, 2.0]], [[5.0, 5.0]]]))
    nothing = torch.zeros(1, 3, 1, dtype=torch.bool)
    torch.testing.assert_close(centred(query, key, mask=nothing)[0], query)
    single = torch.tensor([[4.0, -2.0]])
    assert torch.equal(centred(single, single)[1], torch.zeros(1, 2))
    points = key[1]
    tied, tied_key = centred(points, points)
    assert tied is tied_key


def test_centred_bfloat16_centre_is_near_the_mean_and_shifts_exactly():
    """In 16-bit dtypes the centre is the mean rounded to the unit in the
    last place of the largest coordinate: the shift rounds nothing."""
    generator = torch.Generator().manual_seed(1)
    key = (torch.randn(2, 16, 4, generator=generator) * 3 + 100).bfloat16()
    query, shifted = centred(key[:, :1].clone(), key)
    centre = key[:, :1] - query
    assert torch.equal(shifted + centre, key)
    ulp = 2.0 ** math.floor(math.log2(float(key.float().abs().max()))) * 2.0 ** -7
    mean = key.float().mean(1, keepdim=True)
    assert float((centre.float() - mean).abs().max()) <= ulp / 2


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_centred_16_bit_centre_is_rounded_per_softmax(dtype):
    """Each softmax's centre is its own keys' mean to within the unit in
    the last place of its own largest coordinate, not of the whole
    tensor's: a head of keys near the origin beside one far from it keeps a
    fine centre. Against the float64 mean of the 16-bit keys."""
    generator = torch.Generator().manual_seed(2)
    offset = torch.tensor([[100.0, 0.3], [0.3, 100.0]]).view(2, 2, 1, 1)
    key = (torch.randn(2, 2, 16, 4, generator=generator) * 0.1 + offset).to(dtype)
    query, _ = centred(key[:, :, :1].clone(), key)
    centre = (key[:, :, :1] - query).double()
    largest = key.double().abs().amax((-2, -1), keepdim=True)
    ulp = torch.exp2(largest.log2().floor()) * torch.finfo(dtype).eps
    error = (centre - key.double().mean(-2, keepdim=True)).abs()
    assert bool((error <= ulp).all()), (error / ulp).amax((-2, -1))


def test_check_precision_names_the_policies():
    assert check_precision('fast') == 'fast'
    with pytest.raises(ValueError, match=re.escape(
            "Unknown precision 'exact'; expected one of ('checked', 'fast')")):
        check_precision('exact')
