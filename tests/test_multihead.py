"""MetricMultiheadAttention against torch.nn.MultiheadAttention and a naive
float64 cdist reference, with torch's mask conventions."""
from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch
from torch_geometric.data import Batch, Data
from torch_geometric.nn.dense import Linear as PyGLinear

from pyg_metric_attn import MetricMultiheadAttention

METRICS = ['metric', 'l2', 'dot']


def naive(mha: MetricMultiheadAttention, query, key, value, blocked=None,
          factor=None):
    """Float64 per-head loop from the raw weights; ``blocked`` [B, L, S] or
    per head [B, H, L, S] bool, ``factor`` [B, H, L, S] on the weights (a
    dropout mask)."""
    mha = copy.deepcopy(mha).double()
    query, key, value = query.double(), key.double(), value.double()
    H, D, C = mha.num_heads, mha.metric_channels, mha.head_dim

    def linear(module, u):
        out = u @ module.weight.T
        return out + module.bias if module.bias is not None else out

    def phi(module, u):
        if isinstance(module, (torch.nn.Linear, PyGLinear)):  # 'dot', 'l2'
            return linear(module, u)
        hidden = torch.tanh(u @ module.hidden.weight.T + module.hidden.bias)
        skip = u if module.skip is None else u @ module.skip.weight.T
        return skip + hidden @ module.out.weight.T + module.out.bias

    q = phi(mha.query_map, query)
    k = phi(mha.key_map if mha.key_map is not None else mha.query_map, key)
    v = linear(mha.v_proj, value)
    heads = []
    for h in range(H):
        qh, kh = (t[..., h * D:(h + 1) * D] for t in (q, k))
        vh = v[..., h * C:(h + 1) * C]
        if mha.metric == 'dot':
            logits = qh @ kh.transpose(1, 2) / math.sqrt(D)
        else:
            logits = -torch.cdist(qh, kh).square()
        logits = logits / mha.time_scale
        if blocked is not None:
            logits = logits.masked_fill(
                blocked if blocked.dim() == 3 else blocked[:, h], float('-inf'))
        weights = torch.softmax(logits, -1)
        if factor is not None:
            weights = weights * factor[:, h].double()
        heads.append(weights @ vh)
    return linear(mha.out_proj, torch.cat(heads, -1))


def rel(a, b):
    return float((a.double() - b).norm() / b.norm())


@pytest.mark.parametrize('metric', METRICS)
@pytest.mark.parametrize('offset', [0.0, 100.0])
def test_self_attention_with_padding_matches_naive(metric, offset, device):
    torch.manual_seed(0)
    mha = MetricMultiheadAttention(32, 4, metric=metric, time_scale=3.0).eval()
    x = torch.randn(3, 17, 32) + offset
    padding = torch.zeros(3, 17, dtype=torch.bool)
    padding[0, 12:] = True
    mha, x, padding = mha.to(device), x.to(device), padding.to(device)
    out, weights = mha(x, x, x, key_padding_mask=padding, need_weights=False)
    assert weights is None
    expected = naive(mha, x, x, x, padding.view(3, 1, 17).expand(3, 17, 17))
    tolerance = 1e-4 if (metric == 'dot' and offset) else 1e-5
    assert rel(out, expected) < tolerance


@pytest.mark.parametrize('metric', METRICS)
def test_cross_attention_with_attn_mask_and_causal(metric):
    torch.manual_seed(1)
    mha = MetricMultiheadAttention(16, 2, metric=metric, kdim=12, vdim=8).eval()
    query, key, value = torch.randn(2, 9, 16), torch.randn(2, 9, 12), \
        torch.randn(2, 9, 8)
    causal = torch.ones(9, 9, dtype=torch.bool).triu(1)  # True = blocked
    expected = naive(mha, query, key, value, causal.expand(2, 9, 9))
    by_flag, _ = mha(query, key, value, is_causal=True, need_weights=False)
    by_mask, _ = mha(query, key, value, attn_mask=causal, need_weights=False)
    additive = torch.zeros(9, 9).masked_fill(causal, float('-inf'))
    by_float, weights = mha(query, key, value, attn_mask=additive)
    for out in (by_flag, by_mask, by_float):
        assert rel(out, expected) < 1e-5
    assert weights.shape == (2, 9, 9)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 9), atol=1e-6)
    assert torch.all(weights.masked_select(causal) == 0)


@pytest.mark.parametrize('metric', METRICS)
def test_without_bias(metric):
    """``bias=False``: no bias in the value and output projections (nor in
    ``'dot'``'s query and key maps), and the output of the naive loop."""
    torch.manual_seed(8)
    mha = MetricMultiheadAttention(16, 2, metric=metric, bias=False).eval()
    assert mha.v_proj.bias is None and mha.out_proj.bias is None
    if metric == 'dot':
        assert mha.query_map.bias is None and mha.key_map.bias is None
    x = torch.randn(2, 7, 16)
    out, _ = mha(x, x, x, need_weights=False)
    assert rel(out, naive(mha, x, x, x)) < 1e-5


@pytest.mark.parametrize('metric', METRICS)
def test_three_dimensional_attn_mask_per_batch_element_and_head(metric):
    """A ``[B * H, L, S]`` mask (torch's order: element ``b``'s heads at
    ``b * H`` to ``b * H + H - 1``), boolean or float, blocks per element
    and head, on the fused path and the explicit one (``need_weights``);
    with ``key_padding_mask`` both apply."""
    torch.manual_seed(9)
    B, H, L, S = 2, 2, 5, 6
    mha = MetricMultiheadAttention(16, H, metric=metric, kdim=12).eval()
    query, key = torch.randn(B, L, 16), torch.randn(B, S, 12)
    value = torch.randn(B, S, 16)
    blocked = torch.rand(B, H, L, S, generator=torch.Generator().manual_seed(0)) < 0.4
    blocked[..., 0] = False  # every query keeps a key
    padding = torch.zeros(B, S, dtype=torch.bool)
    padding[1, 4:] = True
    expected = naive(mha, query, key, value,
                     blocked | padding.view(B, 1, 1, S))
    additive = torch.zeros(B, H, L, S).masked_fill(blocked, float('-inf'))
    for mask, need_weights in itertools.product((blocked, additive),
                                                (False, True)):
        out, weights = mha(query, key, value, key_padding_mask=padding,
                           attn_mask=mask.view(B * H, L, S),
                           need_weights=need_weights,
                           average_attn_weights=False)
        assert rel(out, expected) < 1e-5
        if need_weights:
            assert torch.all(weights.masked_select(blocked) == 0)


@pytest.mark.parametrize('metric', METRICS)
def test_dropout_drops_attention_weights_in_training_only(metric):
    """``dropout=0.3``: none in evaluation (the naive output); in training
    the explicit path (``need_weights``) drops the weights with
    :func:`torch.nn.functional.dropout`'s draw (kept ones scaled by
    1/0.7), and the fused path keeps the output unbiased: over 400 draws
    its mean is the evaluation output within 5 standard errors."""
    torch.manual_seed(10)
    mha = MetricMultiheadAttention(16, 2, metric=metric, dropout=0.3).eval()
    x = torch.randn(2, 5, 16)
    plain, _ = mha(x, x, x, need_weights=False)
    assert rel(plain, naive(mha, x, x, x)) < 1e-5
    mha.train()
    torch.manual_seed(11)
    out, weights = mha(x, x, x, average_attn_weights=False)
    torch.manual_seed(11)
    kept = torch.nn.functional.dropout(torch.ones_like(weights), 0.3)
    assert bool((kept == 0).any())
    assert rel(out, naive(mha, x, x, x, factor=kept)) < 1e-5
    with torch.no_grad():
        draws = torch.stack([mha(x, x, x, need_weights=False)[0]
                             for _ in range(400)])
    assert not torch.allclose(draws[0], plain, atol=1e-3)
    error = (draws.mean(0) - plain).abs()
    assert bool((error <= 5 * draws.std(0) / 400 ** 0.5).all()), error.max()


def test_dot_equals_torch_multihead_attention(device):
    torch.manual_seed(2)
    ours = MetricMultiheadAttention(24, 3, metric='dot').eval()
    torch_mha = torch.nn.MultiheadAttention(24, 3, batch_first=True).eval()
    with torch.no_grad():
        torch_mha.in_proj_weight.copy_(torch.cat([ours.query_map.weight,
                                                  ours.key_map.weight,
                                                  ours.v_proj.weight]))
        torch_mha.in_proj_bias.copy_(torch.cat([ours.query_map.bias,
                                                ours.key_map.bias,
                                                ours.v_proj.bias]))
        torch_mha.out_proj.weight.copy_(ours.out_proj.weight)
        torch_mha.out_proj.bias.copy_(ours.out_proj.bias)
    x = torch.randn(4, 10, 24)
    padding = torch.zeros(4, 10, dtype=torch.bool)
    padding[1, 7:] = True
    causal = torch.ones(10, 10, dtype=torch.bool).triu(1)
    ours, torch_mha = ours.to(device), torch_mha.to(device)
    x, padding, causal = x.to(device), padding.to(device), causal.to(device)
    ours_out, ours_w = ours(x, x, x, key_padding_mask=padding, attn_mask=causal,
                            average_attn_weights=False)
    ref_out, ref_w = torch_mha(x, x, x, key_padding_mask=padding, attn_mask=causal,
                               average_attn_weights=False)
    assert torch.allclose(ours_out, ref_out, atol=1e-5)
    assert torch.allclose(ours_w, ref_w, atol=1e-6)


@pytest.mark.parametrize('metric', METRICS)
def test_causal_output_ignores_future_tokens(metric):
    torch.manual_seed(3)
    mha = MetricMultiheadAttention(16, 4, metric=metric).eval()
    x = torch.randn(2, 12, 16)
    changed = x.clone()
    changed[:, 7:] = torch.randn(2, 5, 16)
    out, _ = mha(x, x, x, is_causal=True, need_weights=False)
    out_changed, _ = mha(changed, changed, changed, is_causal=True,
                         need_weights=False)
    assert torch.allclose(out[:, :7], out_changed[:, :7], atol=1e-6)
    assert not torch.allclose(out[:, 7:], out_changed[:, 7:])


def test_point_sets_equal_per_set_attention():
    torch.manual_seed(4)
    mha = MetricMultiheadAttention(8, 2).eval()
    x = torch.randn(11, 8)
    batch = torch.tensor([0] * 4 + [1] * 7)
    out = mha.forward_point_sets(x, batch)
    for graph in (0, 1):
        points = x[batch == graph].unsqueeze(0)
        expected, _ = mha(points, points, points, need_weights=False)
        assert torch.allclose(out[batch == graph], expected[0], atol=1e-6)


def test_sequence_first_layout_bf16_and_learned_time_scale():
    torch.manual_seed(5)
    mha = MetricMultiheadAttention(16, 2, batch_first=False, learn_time_scale=True,
                                   time_scale=2.0)
    x = torch.randn(6, 3, 16)  # [L, B, E]
    out, _ = mha(x, x, x, need_weights=False)
    batch_first = naive(mha, x.transpose(0, 1), x.transpose(0, 1),
                        x.transpose(0, 1)).transpose(0, 1)
    assert rel(out, batch_first) < 1e-5
    out.sum().backward()
    assert mha.time.log_value.grad is not None
    with torch.autocast('cpu', dtype=torch.bfloat16):
        low, _ = mha(x, x, x, need_weights=False)
    # Inputs, weights and SDPA in bfloat16: within 4 units of its roundoff
    # (measured 1.00 here, at most 1.25 over 20 seeds).
    assert rel(low.float(), batch_first) < 4 * torch.finfo(torch.bfloat16).eps / 2


def test_errors():
    with pytest.raises(ValueError, match='divisible'):
        MetricMultiheadAttention(10, 3)
    mha = MetricMultiheadAttention(8, 2)
    with pytest.raises(ValueError, match=r"'query' must have shape \[batch, le"):
        mha(torch.randn(2, 3, 5), torch.randn(2, 3, 8), torch.randn(2, 3, 8))
    with pytest.raises(ValueError, match='key_padding_mask'):
        x = torch.randn(2, 3, 8)
        mha(x, x, x, key_padding_mask=torch.zeros(3, 2, dtype=torch.bool))
    assert repr(mha) == "MetricMultiheadAttention(8, num_heads=2, metric='metric')"


@pytest.mark.parametrize('metric', METRICS)
def test_dense_graph_mode_on_a_pyg_batch_with_gradients(metric):
    """All-pairs attention per graph of a PyG mini-batch (to_dense_batch +
    SDPA) equals the naive float64 loop per graph, gradients included."""
    torch.manual_seed(6)
    graphs = [Data(x=torch.randn(n, 16) + 5.0) for n in (7, 1, 12)]
    batch = Batch.from_data_list(graphs)
    mha = MetricMultiheadAttention(16, 4, metric=metric, time_scale=2.0)
    x = batch.x.clone().requires_grad_()
    out = mha.forward_point_sets(x, batch.batch)
    weight = torch.randn(out.shape)
    (out * weight).sum().backward()
    start = 0
    for graph in graphs:
        n = graph.num_nodes
        points = graph.x.double().unsqueeze(0).requires_grad_()
        expected = naive(mha, points, points, points)[0]
        (expected * weight[start:start + n].double()).sum().backward()
        assert rel(out[start:start + n], expected) < 1e-5
        assert rel(x.grad[start:start + n], points.grad[0]) < 1e-5
        start += n


@pytest.mark.parametrize('metric,default', [('metric', 7), ('l2', 7), ('dot', 8)])
@pytest.mark.parametrize('old_width', [False, True])
def test_metric_width_per_head_and_gradients(metric, default, old_width):
    """The metric space is one coordinate narrower than the head by default
    (``metric_channels=head_dim`` keeps the old width); either way, with
    padding and a causal mask, output and input gradients equal float64."""
    torch.manual_seed(7)
    width = 8 if old_width else None
    mha = MetricMultiheadAttention(32, 4, metric=metric, time_scale=2.0,
                                   metric_channels=width)
    assert mha.metric_channels == (8 if old_width else default)
    assert mha.query_map(torch.randn(1, 32)).shape == (1, 4 * mha.metric_channels)
    x = torch.randn(2, 11, 32, requires_grad=True)
    padding = torch.zeros(2, 11, dtype=torch.bool)
    padding[1, 8:] = True
    out, _ = mha(x, x, x, key_padding_mask=padding, is_causal=True,
                 need_weights=False)
    points = x.detach().double().requires_grad_()
    blocked = padding.view(2, 1, 11) | torch.ones(11, 11, dtype=torch.bool).triu(1)
    expected = naive(mha, points, points, points, blocked)
    weight = torch.randn(out.shape)
    grad, = torch.autograd.grad((out * weight).sum(), x)
    expected_grad, = torch.autograd.grad((expected * weight.double()).sum(),
                                         points)
    assert rel(out, expected) < 1e-5
    assert rel(grad, expected_grad) < 1e-5


@pytest.mark.parametrize('width,augmented', [(None, 64), (64, 65)])
def test_augmented_width_is_the_head_width_by_default(monkeypatch, width,
                                                      augmented):
    """Heads of 64: the augmented points ``[phi, |phi|^2]`` reach SDPA 64 wide
    (a native flash head size) by default, 65 with the old metric width
    (padded to 72 off CPU); values keep the head width."""
    widths = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(query, key, value, **kwargs):
        widths.append((query.size(-1), key.size(-1), value.size(-1)))
        return sdpa(query, key, value, **kwargs)

    monkeypatch.setattr(torch.nn.functional, 'scaled_dot_product_attention',
                        recording)
    mha = MetricMultiheadAttention(128, 2, metric_channels=width)
    x = torch.randn(1, 5, 128)
    out, _ = mha(x, x, x, need_weights=False)  # training: the augmented form
    assert widths == [(augmented, augmented, augmented)]
    assert out.shape == (1, 5, 128)


def test_metric_width_errors():
    with pytest.raises(ValueError, match="'metric_channels' must be positive"):
        MetricMultiheadAttention(8, 2, metric_channels=0)
    assert MetricMultiheadAttention(2, 2).metric_channels == 1  # heads of 1
