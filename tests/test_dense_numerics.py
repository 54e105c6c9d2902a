"""Numerics of the dense and point-set paths (issues 14 and 15): far-apart
sets, padding, NaN/inf confinement, huge scales, clear errors and denormals
flushed on every intra-op thread."""
from __future__ import annotations

import copy
import json
import math
import os
import platform
import subprocess
import sys
import textwrap

import pytest
import torch
import torch._dynamo

from pyg_metric_attn import MetricAttentionConv, MetricMultiheadAttention
from pyg_metric_attn.nn.functional import dense_metric_attention
from pyg_metric_attn.utils import denormals
from pyg_metric_attn.utils.denormals import denormals_flushed, flush_in_backward

METRICS = ['metric', 'l2', 'dot']
SIZES = (5, 9, 13)


def point_batch(scale, offset, seed=0, channels=8):
    """Three sets: around ``+offset``, ``-offset`` and 0, features ``scale``."""
    g = torch.Generator().manual_seed(seed)
    centres = (offset, -offset, 0.0)
    x = torch.cat([torch.randn(n, channels, generator=g) * scale + c
                   for n, c in zip(SIZES, centres, strict=True)])
    batch = torch.cat([torch.full((n,), i) for i, n in enumerate(SIZES)])
    return x, batch


def direct_attention(q, k, v, metric, t):
    """Float64 direct-difference attention ``[..., L, D] -> [..., L, C]`` and
    the weights."""
    q, k, v = q.double(), k.double(), v.double()
    if metric == 'dot':
        logits = q @ k.transpose(-1, -2) / (math.sqrt(q.size(-1)) * t)
    else:
        logits = -(q.unsqueeze(-2) - k.unsqueeze(-3)).square().sum(-1) / t
    weights = torch.softmax(logits, -1)
    return weights @ v, weights


def conv_reference(conv, x, batch):
    """Per set, float64 attention on the layer's own float32 embeddings."""
    with torch.no_grad():
        z_src, z_dst = conv._embed(x, x)
        values = conv._values(x)
    out = torch.empty(x.size(0), conv.heads, conv.out_channels,
                      dtype=torch.double)
    for s in batch.unique():
        rows = batch == s
        q, k, v = (t[rows].transpose(0, 1) for t in (z_dst, z_src, values))
        out[rows] = direct_attention(q, k, v, conv.metric,
                                     conv.time_scale)[0].transpose(0, 1)
    return out.flatten(1) + conv.bias.double()


def spread(values, batch):
    """Largest distance of a value from its set's mean value."""
    return max(float((values[batch == s] - values[batch == s].mean(0)).abs().max())
               for s in batch.unique())


def assert_attention_close(out, expected, values, batch, tolerance=1e-4):
    r"""``out - expected = sum_j (alpha_j - alpha*_j)(v_j - mean v)``: within
    ``tolerance`` in the weights (l1), plus float32 rounding of ``values``."""
    error = float((out.double() - expected).abs().max())
    bound = (tolerance * spread(values, batch)
             + 16 * 2.0**-24 * float(values.abs().max()))
    assert error <= bound, (error, bound)


@pytest.mark.parametrize('metric', METRICS)
@pytest.mark.parametrize('scale,offset', [(1.0, 1e4), (1e2, 1e4), (1e4, 1e4),
                                          (1e4, 0.0), (1.0, 1e2)])
def test_point_sets_far_apart_match_float64_direct_differences(metric, scale,
                                                               offset, device):
    """Graphs at +c, -c and 0 in one mini-batch: each set is centred on its
    own points, not on the padded batch mean."""
    torch.manual_seed(0)
    conv = MetricAttentionConv(8, 4, heads=2, metric=metric,
                               time_scale=2.0).eval()
    x, batch = point_batch(scale, offset)
    out = conv.to(device).forward_point_sets(x.to(device),
                                             batch.to(device)).cpu()
    conv.cpu()
    with torch.no_grad():
        values = conv._values(x).flatten(1).double()
    assert_attention_close(out, conv_reference(conv, x, batch), values, batch)


@pytest.mark.parametrize('metric', METRICS)
def test_point_sets_near_the_origin_match_float64_direct_differences(metric):
    """Near the origin the expanded logits round little: the output is
    float64 attention's on the layer's own embeddings within float32
    rounding (measured under 1e-6, below the bound's 16 ulp of the values,
    about 6e-6)."""
    torch.manual_seed(1)
    conv = MetricAttentionConv(8, 4, heads=2, metric=metric).eval()
    x, batch = point_batch(1.0, 3.0)
    out = conv.forward_point_sets(x, batch)
    with torch.no_grad():
        values = conv._values(x).flatten(1).double()
    assert_attention_close(out, conv_reference(conv, x, batch), values, batch,
                           tolerance=1e-6)


@pytest.mark.parametrize('metric', ['metric', 'l2'])
@pytest.mark.parametrize('form', ['key-bias', 'augmented', 'causal'])
def test_weights_of_padded_far_apart_sets(metric, form):
    """With values = identity the fused output *is* the weight matrix: every
    SDPA form, padded sets at +-1e4 and a scale of 30 (the fused path)."""
    g = torch.Generator().manual_seed(2)
    B, H, L, D = 3, 2, 16, 8
    q = torch.randn(B, H, L, D, generator=g) * 30
    q = q + torch.tensor([1e4, -1e4, 0.0]).view(B, 1, 1, 1)
    lengths = torch.tensor([16, 5, 11])
    allowed = torch.arange(L) < lengths.view(B, 1)  # [B, L]
    q = torch.where(allowed.view(B, 1, L, 1), q, 0.0)  # to_dense_batch padding
    k = q.clone().requires_grad_(form != 'key-bias')
    eye = torch.eye(L).expand(B, H, L, L)
    mask = allowed.view(B, 1, 1, L)
    out, _ = dense_metric_attention(q, k, eye, metric, 900.0, attn_mask=mask,
                                    is_causal=form == 'causal')
    blocked = ~mask
    if form == 'causal':
        blocked = blocked | torch.ones(L, L, dtype=torch.bool).triu(1)
    logits = -(q.double().unsqueeze(-2) - q.double().unsqueeze(-3)).square()
    expected = torch.softmax(logits.sum(-1).div(900.0)
                             .masked_fill(blocked, float('-inf')), -1)
    rows = allowed.view(B, 1, L, 1).expand_as(out)
    assert (out - expected).abs()[rows].max() < 1e-4


@pytest.mark.parametrize('metric', METRICS)
@pytest.mark.parametrize('scale,offset', [(1.0, 1e4), (1e4, 1e4)])
def test_multihead_weights_with_padding_far_apart(metric, scale, offset):
    """``MetricMultiheadAttention`` with ``key_padding_mask``: per-head
    weights (explicit path) and fused outputs against float64 attention on the
    layer's own float32 embeddings."""
    torch.manual_seed(3)
    mha = MetricMultiheadAttention(16, 2, metric=metric, time_scale=2.0).eval()
    x, batch = point_batch(scale, offset, channels=16)
    dense = torch.zeros(len(SIZES), max(SIZES), 16)
    padding = torch.ones(len(SIZES), max(SIZES), dtype=torch.bool)
    for s, n in enumerate(SIZES):
        dense[s, :n], padding[s, :n] = x[batch == s], False
    _, weights = mha(dense, dense, dense, key_padding_mask=padding,
                     average_attn_weights=False)
    fused, _ = mha(dense, dense, dense, key_padding_mask=padding,
                   need_weights=False)
    for s, n in enumerate(SIZES):
        alpha = assert_multihead_close(mha, fused[s, :n], dense[s, :n])
        assert (weights[s, :, :n, :n] - alpha).abs().max() < 1e-4
        assert torch.all(weights[s, :, :, n:] == 0)


def assert_multihead_close(mha, out, x, tolerance=1e-4):
    """``out`` ``[n, E]`` of ``mha`` on the one sequence ``x`` ``[n, E]`` is
    float64 attention on the layer's own float32 embeddings, through
    ``out_proj``: within ``tolerance`` in the weights times the value
    spread, plus float32 rounding of the values. Returns the float64
    weights ``[H, n, n]``."""
    with torch.no_grad():
        q, k = (t[0] for t in mha._embed(x[None], x[None]))  # [H, n, D]
        v = mha._split_heads(mha.v_proj(x[None]))[0].double()
        out_proj = copy.deepcopy(mha.out_proj).double()
    heads, alpha = direct_attention(q, k, v, mha.metric, mha.time_scale)
    expected = out_proj(heads.transpose(0, 1).reshape(x.size(0), -1))
    spread_v = float((v - v.mean(1, keepdim=True)).abs().amax(1).norm())
    norm = float(out_proj.weight.abs().sum(1).max())
    error = float((out.double() - expected).abs().max())
    assert error <= norm * (tolerance * spread_v
                            + 16 * 2.0**-24 * float(v.abs().max())), error
    return alpha


@pytest.mark.parametrize('metric', METRICS)
@pytest.mark.parametrize('bad', [float('nan'), float('inf')])
def test_a_non_finite_point_stays_in_its_set(metric, bad):
    torch.manual_seed(4)
    conv = MetricAttentionConv(8, 4, heads=2, metric=metric).eval()
    mha = MetricMultiheadAttention(8, 2, metric=metric).eval()
    x, batch = point_batch(1.0, 10.0)
    broken = x.clone()
    broken[SIZES[0] + 2, 3] = bad  # one point of the second set
    others = batch != 1
    for layer in (conv, mha):
        clean = layer.forward_point_sets(x, batch)
        out = layer.forward_point_sets(broken, batch)
        assert out[others].isfinite().all()
        assert torch.allclose(out[others], clean[others], atol=1e-6)
        assert not out[~others].isfinite().all()


@pytest.mark.parametrize('metric', METRICS)
def test_a_nan_batch_element_stays_in_its_element(metric):
    torch.manual_seed(5)
    mha = MetricMultiheadAttention(8, 2, metric=metric).eval()
    x = torch.randn(3, 6, 8) + torch.tensor([50.0, -50.0, 0.0]).view(3, 1, 1)
    padding = torch.zeros(3, 6, dtype=torch.bool)
    padding[2, 4:] = True
    clean, _ = mha(x, x, x, key_padding_mask=padding)
    broken = x.clone()
    broken[0, 1, 0] = float('nan')
    out, weights = mha(broken, broken, broken, key_padding_mask=padding)
    assert out[1:].isfinite().all() and weights[1:].isfinite().all()
    assert torch.allclose(out[1:], clean[1:], atol=1e-6)


@pytest.mark.parametrize('metric', ['metric', 'l2'])
@pytest.mark.parametrize('grad', [False, True])
def test_a_nan_key_behind_the_padding_mask_changes_nothing(metric, grad):
    """A masked key neither moves the centre nor reaches a query (its value
    is finite: a NaN value would reach every query through ``weights @ v``,
    as in any dense attention)."""
    torch.manual_seed(9)
    mha = MetricMultiheadAttention(8, 2, metric=metric).eval()
    x = torch.randn(2, 6, 8) * 3 + 20
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[0, 4:] = True
    key = x.clone()
    key[0, 5] = float('nan')
    with torch.set_grad_enabled(grad):
        clean, _ = mha(x, x, x, key_padding_mask=padding, need_weights=False)
        out, _ = mha(x, key, x, key_padding_mask=padding, need_weights=False)
    assert torch.allclose(out, clean, atol=1e-5)


@pytest.mark.parametrize('metric', METRICS)
@pytest.mark.parametrize('scale', [1e19, 1e30])
def test_huge_scales_are_finite_and_match_float64(metric, scale):
    """``x * 1e19`` (and 1e30): the expanded logits would overflow float32,
    so the exact path runs; finite and equal to the float64 reference."""
    torch.manual_seed(6)
    conv = MetricAttentionConv(8, 4, heads=2, metric=metric).eval()
    x, batch = point_batch(1.0, 0.0)
    x = x * scale
    out = conv.forward_point_sets(x, batch)
    assert out.isfinite().all()
    with torch.no_grad():
        values = conv._values(x).flatten(1).double()
    assert_attention_close(out, conv_reference(conv, x, batch), values, batch)
    mha = MetricMultiheadAttention(8, 2, metric=metric).eval()
    first = x[:SIZES[0]]
    out = mha(first[None], first[None], first[None])[0][0]
    assert out.isfinite().all()
    assert_multihead_close(mha, out, first)


@pytest.mark.parametrize('metric', METRICS)
@pytest.mark.parametrize('scale,split', [(1.0, 1e4), (1e19, 0.0)])
def test_compiled_point_sets_match_float64(metric, scale, split):
    """Under ``torch.compile`` the precision check still runs: sets made of
    two unit-scale clusters ``split`` apart (the centre lies between them,
    so the expanded form would cancel large terms) and huge sets (1e19,
    whose expanded logits overflow float32) take the exact path, finite and
    equal to the float64 reference; gradients are finite too."""
    torch.manual_seed(10)
    conv = MetricAttentionConv(8, 4, heads=2, metric=metric,
                               time_scale=2.0).eval()
    x, batch = point_batch(scale, 0.0)
    x = x + split * (torch.arange(x.size(0)) % 2).unsqueeze(1)
    torch._dynamo.reset()
    compiled = torch.compile(conv.forward_point_sets, backend='aot_eager')
    x = x.requires_grad_()
    out = compiled(x, batch)
    assert out.isfinite().all()
    with torch.no_grad():
        values = conv._values(x).flatten(1).double()
    assert_attention_close(out.detach(), conv_reference(conv, x.detach(), batch),
                           values, batch)
    out.sum().backward()
    assert x.grad.isfinite().all()


def test_point_set_path_compiles_without_a_precision_break_and_confines_nan():
    """Inside the dense attention call nothing breaks the graph (the
    precision check is decided on the device; the breaks left are the
    data-dependent sizes of ``to_dense_batch`` and of selecting the real
    rows), and a NaN stays in its set when compiled."""
    torch.manual_seed(7)
    conv = MetricAttentionConv(8, 4, heads=2).eval()
    x, batch = point_batch(1.0, 1e4)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(conv.forward_point_sets)(x, batch)
    for reason in explained.break_reasons:
        files = {frame.filename for frame in reason.user_stack}
        assert not any(name.endswith(('nn/functional.py', 'nn/logits.py',
                                      'denormals.py'))
                       for name in files), reason
    compiled = torch.compile(conv.forward_point_sets, backend='aot_eager')
    broken = x.clone()
    broken[0, 0] = float('nan')
    out = compiled(broken, batch)
    clean = conv.forward_point_sets(x, batch)
    assert torch.allclose(out[batch != 0], clean[batch != 0], atol=1e-5)
    assert out[batch == 0].isnan().all()


def test_clear_errors():
    with pytest.raises(ValueError, match="'num_heads' must be positive"):
        MetricMultiheadAttention(16, 0)
    x = torch.randn(6, 8)
    unsorted = torch.tensor([0, 0, 1, 1, 0, 1])
    with pytest.raises(ValueError, match="'batch' must be sorted"):
        MetricAttentionConv(8, 4).forward_point_sets(x, unsorted)
    with pytest.raises(ValueError, match="'batch' must be sorted"):
        MetricMultiheadAttention(8, 2).forward_point_sets(x, unsorted)


def tiny_products(x):
    """``x * 1e-19`` of ``x = 1e-20``: denormal (1e-39) unless flushed; a
    large tensor, so both intra-op threads compute half of it."""
    return x * 1e-19


def test_denormals_flush_on_all_worker_threads_and_restore(two_threads):
    x = torch.full((1 << 20,), 1e-20)
    assert torch.all(tiny_products(x) > 0)
    with denormals_flushed():
        assert torch.all(tiny_products(x) == 0)  # every thread's half
    assert torch.all(tiny_products(x) > 0)
    with denormals_flushed(enabled=False):
        assert torch.all(tiny_products(x) > 0)


def test_denormals_flush_torchs_threads_beside_other_openmp_runtimes():
    """scikit-learn loads a second libgomp; the flush must reach torch's
    threads, not that runtime's (a fresh process: the runtime is cached).
    On Linux x86-64 with torch on OpenMP the child must find a runtime."""
    pytest.importorskip('sklearn')
    if sys.platform != 'linux' or platform.machine() != 'x86_64' or \
            'parallel backend: OpenMP' not in torch.__config__.parallel_info():
        pytest.skip('torch runs no OpenMP threads on Linux x86-64 here')
    if os.environ.get(denormals.SWITCH) == '0':
        pytest.skip(f'flushing switched off by {denormals.SWITCH}=0')
    code = textwrap.dedent("""
        import json, os
        import sklearn.decomposition  # its own libgomp, loaded first
        import torch
        from pyg_metric_attn.utils import denormals
        with open('/proc/self/maps') as maps:
            libraries = {line.split()[-1] for line in maps if '/' in line}
        torch.set_num_threads(2)
        x = torch.full((1 << 20,), 1e-20)
        found = denormals._runtime() is not None
        with denormals.denormals_flushed():
            flushed = bool(torch.all(x * 1e-19 == 0))
        print(json.dumps(dict(
            runtimes=sorted(path for path in libraries if os.path.basename(
                path).startswith(('libgomp', 'libomp', 'libiomp5'))),
            found=found, flushed=flushed,
            restored=bool(torch.all(x * 1e-19 > 0)))))
    """)
    result = subprocess.run([sys.executable, '-c', code], capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    child = json.loads(result.stdout)
    if len(child['runtimes']) < 2:
        pytest.skip(f"scikit-learn shares torch's OpenMP runtime here: "
                    f"{child['runtimes']}")
    assert child == dict(child, found=True, flushed=True, restored=True)


def test_denormals_flush_in_the_backward_of_a_marked_op(two_threads):
    x = torch.full((1 << 20,), 1e-20, requires_grad=True)
    gradient = torch.full_like(x, 1e-20)
    flush_in_backward(x * 1e-19).backward(gradient)  # 1e-39 unless flushed
    assert torch.all(x.grad == 0)
    assert torch.all(tiny_products(x.detach()) > 0)  # restored afterwards
    x.grad = None
    (x * 1e-19).backward(gradient)
    assert torch.all(x.grad > 0)


@pytest.mark.parametrize('grad,tiny', [(False, None), (True, None),
                                       (False, 'values'),
                                       (True, 'output gradient')])
def test_flushing_changes_sdpa_results_only_below_the_normal_range(
        two_threads, monkeypatch, grad, tiny):
    """Unit-scale d = 64 inputs (whose weights reach the denormal range):
    outputs and gradients with and without flushing agree to 1e-30. Values
    at 1e-38 put the output in the denormal range, an output gradient at
    1e-38 the input gradients: there flushing (in the forward, and in the
    backward) must change them, by less than 1e-30."""
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(2, 2, 300, 64, generator=g) for _ in range(3))
    v = v * (1e-38 if tiny == 'values' else 1.0)
    q, k, v = (t.requires_grad_(grad) for t in (q, k, v))
    output_gradient = torch.randn(2, 2, 300, 64, generator=g) * (
        1e-38 if tiny == 'output gradient' else 1.0)

    def run():
        out, _ = dense_metric_attention(q, k, v, 'metric')
        if not grad:
            return [out]
        return [out, *torch.autograd.grad(out, (q, k, v), output_gradient)]

    flushed = run()
    monkeypatch.setattr(denormals, '_runtime', lambda: None)
    unflushed = run()
    for a, b in zip(flushed, unflushed, strict=True):
        assert (a - b).abs().max() < 1e-30
    changed = [bool((a != b).any())
               for a, b in zip(flushed, unflushed, strict=True)]
    assert changed == {None: [False] * len(changed), 'values': [True],
                       'output gradient': [False, True, True, True]}[tiny]


def test_the_flush_can_be_switched_off(two_threads, monkeypatch):
    x = torch.full((1 << 20,), 1e-20)
    monkeypatch.setenv(denormals.SWITCH, '0')
    denormals._runtime.cache_clear()
    try:
        with denormals_flushed():
            assert torch.all(tiny_products(x) > 0)
    finally:
        monkeypatch.undo()
        denormals._runtime.cache_clear()
    with denormals_flushed():
        assert torch.all(tiny_products(x) == 0)
