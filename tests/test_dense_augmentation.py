"""The fused augmentation of dense metric attention (issue 27, section 4)
against today's torch construction: ``q'``, ``k'`` and their gradients,
with and without a mask, non-finite keys, the routing through
``dense_metric_attention`` and ``torch.compile``. Without CUDA the kernels
run in Triton's interpreter on tiny CPU tensors, routed there by
monkeypatching ``FUSED_DEVICES``."""
from __future__ import annotations

import os
import textwrap

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F
from torch._dynamo.backends.common import aot_autograd

if not torch.cuda.is_available():  # see conftest.py: also set there, earlier
    os.environ['TRITON_INTERPRET'] = '1'

pytest.importorskip('triton', reason='triton is not installed (pip install '
                    'pyg-metric-attn[gpu])')

from conftest import compile_for_gpu  # noqa: E402

from benchmarks.op_count import OpCounter, autograd_nodes  # noqa: E402
from pyg_metric_attn import MetricMultiheadAttention  # noqa: E402
from pyg_metric_attn.nn import augmentation  # noqa: E402
from pyg_metric_attn.nn.augmentation import (  # noqa: E402
    augmented_queries_and_keys,
    checked_augmentation,
    function,
)
from pyg_metric_attn.nn.functional import (  # noqa: E402
    _key_norms,
    dense_metric_attention,
)
from pyg_metric_attn.nn.logits import (  # noqa: E402
    LOGIT_ROUNDING_TOLERANCE,
    centred,
    needs_exact,
    rounding_error,
    slice_time_scale,
)

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
WIDTH = 8  # D = 5 plus the norm column, padded by 2


@pytest.fixture(autouse=True)
def small_tiles(monkeypatch):
    """Tiles of 8 keys and at most 3 splits: 33 keys take 3 splits of 2
    tiles, the last one short (every merge path of the statistics)."""
    monkeypatch.setattr(function, 'BLOCK_L', 8)
    monkeypatch.setattr(function, 'MAX_SPLITS', 3)


@pytest.fixture
def fused(monkeypatch):
    """Route ``dense_metric_attention`` on the test device through the op."""
    monkeypatch.setattr(augmentation, 'FUSED_DEVICES', (DEVICE,))


def torch_construction(query, key, attended, width):
    """Today's torch ops (``centred``, the zeroed unattended keys,
    ``_key_norms``, concatenation, padding)."""
    query, key = centred(query, key, mask=attended)
    if attended is not None:
        key = torch.where(attended, key, 0)
    query = torch.cat([query, query.new_full((*query.shape[:-1], 1), -0.5)], -1)
    key = torch.cat([key, _key_norms(key).to(key.dtype)], -1)
    return [F.pad(t, (0, width - t.size(-1))) for t in (query, key)]


def points(dtype, seed=0):
    """Queries ``[2, 3, 11, 5]`` and keys ``[2, 3, 33, 5]`` around 40 and a
    mask of the attended keys ``[2, 1, 33, 1]``. The keys are symmetric
    pairs around an integer centre on a grid of 1/4, and the centre (the
    last key, never attended with a mask): their counted mean is that
    centre, so 16-bit centres, rounded to a grid of 1/4 or finer, agree with
    today's exactly; pairs are masked together."""
    g = torch.Generator().manual_seed(seed)
    centre = torch.randint(36, 44, (2, 3, 1, 5), generator=g).double()
    half = torch.randint(-24, 25, (2, 3, 16, 5), generator=g).double() / 4
    key = torch.cat([centre + half, centre - half, centre], -2)
    query = centre + torch.randn(2, 3, 11, 5, generator=g).mul(4).round() / 4
    pairs = torch.rand(2, 1, 16, 1, generator=g) < 0.6
    pairs[:, :, 0] = True  # every causal row may attend to a key
    attended = torch.cat([pairs, pairs, torch.zeros(2, 1, 1, 1, dtype=torch.bool)],
                         -2)
    return (query.to(DEVICE, dtype).requires_grad_(),
            key.to(DEVICE, dtype).requires_grad_(), attended.to(DEVICE))


def assert_augmented_close(out, expected, key):
    """Centred columns to the rounding of the centre (exact in 16 bits, where
    the centres agree); the norm column to its own rounding and that of the
    sums of squares (in float32, or float64)."""
    out, expected = out.detach(), expected.detach()
    eps = torch.finfo(key.dtype).eps
    sums = torch.finfo(torch.promote_types(key.dtype, torch.float32)).eps
    exact = torch.finfo(key.dtype).bits <= 16
    scale = float(key.detach().abs().max())
    torch.testing.assert_close(out[..., :5], expected[..., :5], rtol=0,
                               atol=0 if exact else 8 * eps * scale)
    norms = expected[..., 5].double()
    squares = float(expected[..., :5].double().square().sum(-1).max())
    torch.testing.assert_close(out[..., 5].double(), norms, rtol=0,
                               atol=2 * eps * float(norms.abs().max())
                               + 16 * sums * squares)
    assert torch.equal(out[..., 6:], expected[..., 6:])


def gradients(outputs, inputs, seed=1):
    g = torch.Generator().manual_seed(seed)
    grads = [torch.randn(t.shape, generator=g).to(t) for t in outputs]
    return torch.autograd.grad(outputs, inputs, grads)


@pytest.mark.parametrize('dtype', [torch.float32, torch.float64, torch.bfloat16,
                                   torch.float16])
@pytest.mark.parametrize('masked', [False, True])
def test_matches_the_torch_construction(dtype, masked):
    query, key, attended = points(dtype)
    attended = attended if masked else None
    expected = torch_construction(query, key, attended, WIDTH)
    out = augmented_queries_and_keys(query, key, attended, WIDTH)
    for o, e in zip(out, expected, strict=True):
        assert o.shape == e.shape and o.dtype == e.dtype and o.is_contiguous()
        assert_augmented_close(o, e, key)
    (dq, dk), (dq_expected, dk_expected) = (gradients(t, (query, key))
                                            for t in (out, expected))
    assert torch.equal(dq, dq_expected)  # dq = dq'[..., :D]
    eps = torch.finfo(dtype).eps  # and 2 g (k - c): the centres round apart
    torch.testing.assert_close(dk, dk_expected, rtol=0, atol=eps * (
        4 * float(dk_expected.abs().max()) + 64 * float(key.detach().abs().max())))
    if masked:  # the unattended keys get no gradient
        assert not dk.masked_select(~attended).any()


def test_random_points_agree_up_to_a_shift_of_the_centre():
    """Points not built to agree: float32 to rounding; bfloat16 q' and k'
    differ from today's by one translation per softmax (the fused centre is
    the exactly rounded mean, today's sums rounded terms), by at most one
    grid step."""
    g = torch.Generator().manual_seed(3)
    base = torch.randn(2, 3, 13, 5, generator=g) * 3 + 40
    for dtype in (torch.float32, torch.bfloat16):
        query, key = (base.to(DEVICE, dtype) for _ in range(2))
        key = key.flip(-2) + 0.5
        out = augmented_queries_and_keys(query, key, None, WIDTH)
        expected = torch_construction(query, key, None, WIDTH)
        shift = [(o - e)[..., :5].double() for o, e in zip(out, expected,
                                                           strict=True)]
        if dtype == torch.float32:
            assert max(float(s.abs().max()) for s in shift) < 1e-5
            continue
        translation = shift[0][..., :1, :]
        grid = 2.0**5 * torch.finfo(dtype).eps  # keys in [32, 64)
        assert float(translation.abs().max()) <= grid
        assert all(torch.equal(s, translation.expand_as(s)) for s in shift)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16])
def test_16_bit_centres_lie_on_the_grid(dtype):
    """In 16 bits the centre is the mean rounded to a multiple of the grid
    ``2^floor(log2 max|k|) eps``, as today's (read off a query at the
    origin, where ``q' = -c``)."""
    g = torch.Generator().manual_seed(4)
    query, key = (torch.randn(2, 3, n, 5, generator=g).mul(20).add(0.3)
                  .to(DEVICE, dtype) for n in (11, 13))
    query[..., 0, :] = 0
    out = augmented_queries_and_keys(query, key, None, WIDTH)
    centre = -out[0][..., :1, :5].double()
    largest = key.double().abs().amax((-2, -1), keepdim=True)
    grid = torch.exp2(largest.log2().floor()) * torch.finfo(dtype).eps
    assert torch.equal(centre, (centre / grid).round() * grid)
    mean = key.double().mean(-2, keepdim=True)
    assert ((centre - mean).abs() <= grid / 2).all()
    expected = -torch_construction(query, key, None, WIDTH)[0][..., :1, :5]
    assert ((centre - expected.double()).abs() <= grid).all()


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('bad', [float('nan'), float('inf')])
def test_a_non_finite_key_does_not_move_the_centre(dtype, bad):
    """The centre of a softmax with a non-finite key is that of its other
    keys: q' equals q' without the key, the other keys' rows are unchanged
    and equal today's construction; only the bad key's row is not finite."""
    query, key, _ = points(dtype)
    broken = key.detach().clone()
    broken[0, 1, 32, 2] = bad  # the key at the centre
    without = key.detach()[..., :32, :]
    out = augmented_queries_and_keys(query, broken, None, WIDTH)
    clean = augmented_queries_and_keys(query, without, None, WIDTH)
    expected = torch_construction(query, broken, None, WIDTH)
    assert_augmented_close(out[0], clean[0], key)
    torch.testing.assert_close(out[1][..., :32, :5], clean[1][..., :5], rtol=0,
                               atol=0 if dtype == torch.bfloat16 else 1e-5)
    assert not out[1][0, 1, 32].isfinite().all()
    out[1][0, 1, 32] = expected[1][0, 1, 32] = 0
    assert out[1].isfinite().all()
    assert_augmented_close(out[1], expected[1], key)


def test_empty_sets_and_broadcast_masks():
    """No keys: an uncentred q'; no queries: an empty q'; a mask broadcast
    over batch and heads; ``[L, D]`` points."""
    query, key, attended = points(torch.float32)
    q_aug, k_aug = augmented_queries_and_keys(query, key[..., :0, :], None, WIDTH)
    assert k_aug.shape == (2, 3, 0, WIDTH)
    assert torch.equal(q_aug[..., :5], query.detach())
    q_aug, k_aug = augmented_queries_and_keys(query[..., :0, :], key, None, WIDTH)
    assert q_aug.shape == (2, 3, 0, WIDTH)
    shared = attended[:1, :, :, 0]  # [1, 1, L_k]: every batch element and head
    out = augmented_queries_and_keys(query, key, shared.unsqueeze(-1), WIDTH)
    expected = torch_construction(query, key, shared.unsqueeze(-1), WIDTH)
    for o, e in zip(out, expected, strict=True):
        assert_augmented_close(o, e, key)
    out = augmented_queries_and_keys(query[0, 0], key[1, 2], None, WIDTH)
    expected = torch_construction(query[0, 0], key[1, 2], None, WIDTH)
    assert out[0].shape == (11, WIDTH)
    for o, e in zip(out, expected, strict=True):
        assert_augmented_close(o, e, key)


def test_clear_errors(monkeypatch):
    query, key, attended = points(torch.float32)
    with pytest.raises(ValueError, match='at least D \\+ 1 = 6'):
        augmented_queries_and_keys(query, key, None, 5)
    with pytest.raises(TypeError, match='one dtype'):
        augmented_queries_and_keys(query, key.double(), None, WIDTH)
    with pytest.raises(ValueError, match='same leading dimensions'):
        augmented_queries_and_keys(query, key[:1], None, WIDTH)
    with pytest.raises(ValueError, match='broadcastable to \\(2, 3, 33, 1\\)'):
        augmented_queries_and_keys(query, key, attended[..., :5, :], WIDTH)
    if DEVICE == 'cpu':
        monkeypatch.setenv('TRITON_INTERPRET', '0')
        with pytest.raises(RuntimeError, match='runs on CUDA tensors'):
            augmented_queries_and_keys(query, key, None, WIDTH)


def attention_step(query, key, value, **kwargs):
    """Output and the gradients of query, key and value."""
    out, _ = dense_metric_attention(query, key, value, **kwargs)
    return (out, *gradients([out], (query, key, value)))


@pytest.mark.parametrize('kwargs', [
    dict(metric='metric', precision='fast'),
    dict(metric='l2', time_scale=2.0, is_causal=True),
    dict(metric='metric', need_weights=True),  # the explicit path
])
def test_dense_metric_attention_through_the_op_equals_the_torch_path(
        kwargs, monkeypatch):
    """A padding mask and a value width of D + 1 (63 + 1 = 64 in small):
    through the op's kernels (which must run: launches counted) as through
    the torch ops."""
    query, key, attended = points(torch.float32)
    value = torch.randn(2, 3, 33, 6, device=DEVICE, requires_grad=True)
    mask = attended.transpose(-1, -2)  # [2, 1, 1, 33]
    monkeypatch.setattr(augmentation, 'FUSED_DEVICES', ())
    expected = attention_step(query, key, value, attn_mask=mask, **kwargs)
    monkeypatch.setattr(augmentation, 'FUSED_DEVICES', (DEVICE,))
    with OpCounter() as counter:
        out = attention_step(query, key, value, attn_mask=mask, **kwargs)
    assert counter.launches['augment'] == 1
    assert counter.launches['augment_backward'] == 1
    for o, e in zip(out, expected, strict=True):
        torch.testing.assert_close(o, e, rtol=1e-4, atol=1e-4)


def test_the_exact_correction_through_the_op(monkeypatch):
    """'checked' with one batch element of huge points (1e19: its fused
    logits overflow, the exact correction takes it over): through the op as
    through the torch ops, gradients finite (the op's augmented points of
    the flagged softmax are zeroed for the fused backward, as the torch
    route zeroes its plain points)."""
    query, key, attended = points(torch.float32)
    with torch.no_grad():
        query[1] *= 1e19
        key[1] *= 1e19
    value = torch.randn(2, 3, 33, 6, device=DEVICE, requires_grad=True)
    mask = attended.transpose(-1, -2)
    monkeypatch.setattr(augmentation, 'FUSED_DEVICES', ())
    expected = attention_step(query, key, value, attn_mask=mask)
    monkeypatch.setattr(augmentation, 'FUSED_DEVICES', (DEVICE,))
    with OpCounter() as counter:
        out = attention_step(query, key, value, attn_mask=mask)
    assert counter.launches['augment'] == 1
    assert 'ExactAttentionWhereBackward' in autograd_nodes(out[0])
    for o, e in zip(out, expected, strict=True):
        assert o.isfinite().all()
        torch.testing.assert_close(o, e, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize('masked', [False, True])
def test_the_checked_decision_is_needs_exacts(masked):
    """``checked_augmentation`` flags the softmaxes that
    :func:`~pyg_metric_attn.nn.logits.needs_exact` flags for the centred
    points (a per-head time scale): softmaxes scaled to rounding estimates
    of 0.5, 0.9, 1.1 and 1.5 times the tolerance, one with an infinite key
    and one with a NaN query (NaN rows do not count); it zeroes the flagged
    softmaxes' q' and k' and leaves the others as the plain augmentation."""
    query, key, attended = points(torch.float32)
    attended = attended if masked else None
    time_scale = torch.tensor([0.5, 1.0, 2.0], device=DEVICE,
                              dtype=torch.float64).view(3, 1, 1)
    slices = slice_time_scale(time_scale, query.device)

    def estimate(query, key):
        centred_query, centred_key = (t[..., :5] for t in
                                      augmented_queries_and_keys(
                                          query, key, attended, WIDTH))
        return rounding_error(centred_query, centred_key, 'metric',
                              time_scale, per_slice=True)
    ratios = torch.tensor([[0.5, 0.9, 1.1], [1.5, 0.5, 0.5]], device=DEVICE,
                          dtype=torch.float64)
    scale = (ratios * LOGIT_ROUNDING_TOLERANCE
             / estimate(query, key)).sqrt().float()[..., None, None]
    query, key = query.detach() * scale, key.detach() * scale
    key[1, 1, 7, 2] = float('inf')
    query[1, 2, 4, 1] = float('nan')
    plain = augmented_queries_and_keys(query, key, attended, WIDTH)
    query_aug, key_aug, flags = checked_augmentation(query, key, attended, WIDTH,
                                                     slices)
    expected = needs_exact(plain[0][..., :5], plain[1][..., :5], 'metric',
                           time_scale)
    assert torch.equal(expected.cpu(), torch.tensor([[False, False, True],
                                                     [True, True, False]]))
    assert flags.dtype == torch.bool and torch.equal(flags, expected)
    for out, clean in ((query_aug, plain[0]), (key_aug, plain[1])):
        assert not out[flags].any()
        torch.testing.assert_close(out[~flags], clean[~flags], rtol=0, atol=0,
                                   equal_nan=True)


def test_a_repeated_checked_step_decides_in_one_small_launch(fused):
    """With ``precision='checked'`` a repeated step decides inside the
    augmentation (one more launch, one program per softmax) and runs none
    of the torch ops the decision took (norms, NaN filters, maxima,
    comparisons, the zeroing ``where``)."""
    query, key, attended = points(torch.float32)
    value = torch.randn(2, 3, 33, WIDTH, device=DEVICE, requires_grad=True)
    attention_step(query, key, value)
    with OpCounter() as counter:
        attention_step(query, key, value)
    assert counter.launches['augment_decide'] == 1
    decision = {'linalg_vector_norm', 'nan_to_num', 'amax', 'bitwise_not', 'le',
                'abs', 'full'}
    assert not decision & set(counter.ops)
    assert counter.ops['where'] == 1  # the correction's own backward alone


def test_jit_trace_records_the_operator(fused):
    """``torch.jit.trace`` records the augmentation as its custom operator
    (eagerly the kernels are entered without it, which a trace cannot
    follow), and the trace computes what the function does on new points."""
    gen = torch.Generator().manual_seed(5)
    query, key, value = (torch.randn(1, 2, 8, width, generator=gen).to(DEVICE)
                         for width in (4, 4, 5))

    def attend(query, key, value):
        return dense_metric_attention(query, key, value, precision='fast')[0]
    traced = torch.jit.trace(attend, (query, key, value), check_trace=False)
    assert 'pyg_metric_attn::augment_queries_and_keys' in str(traced.graph)
    other = 3 * torch.randn(1, 2, 8, 4, generator=gen).to(DEVICE)
    torch.testing.assert_close(traced(other, key, value),
                               attend(other, key, value))


def test_a_repeated_step_runs_no_torch_augmentation(fused):
    """Forward and backward of a second step launch the three kernels, once
    each, and none of the torch ops the augmentation took (reductions,
    isfinite, where, cat, pad) beyond those SDPA itself runs on the
    augmented inputs (on a GPU its memory-efficient kernel pads the mask).
    The value has the augmented width: nothing else is padded."""
    query, key, attended = points(torch.float32)
    value = torch.randn(2, 3, 33, WIDTH, device=DEVICE, requires_grad=True)
    mask = attended.transpose(-1, -2)
    attention_step(query, key, value, attn_mask=mask, precision='fast')
    with OpCounter() as counter:
        attention_step(query, key, value, attn_mask=mask, precision='fast')
    assert dict(counter.launches) == {'augment_statistics': 1, 'augment': 1,
                                      'augment_backward': 1}
    # Eagerly the kernels are entered without the custom operators' dispatch.
    assert not counter.ops['augment_queries_and_keys']
    assert not counter.ops['augment_queries_and_keys_backward']
    augmented = [t.detach().new_zeros(*t.shape[:-1], WIDTH).requires_grad_()
                 for t in (query, key)]
    with OpCounter() as sdpa:
        out = F.scaled_dot_product_attention(*augmented, value, attn_mask=mask)
        gradients([out], (*augmented, value))
    torch_ops = {'cat', 'constant_pad_nd', 'linalg_vector_norm', 'isfinite', 'ne',
                 'clamp', 'div', 'div_', 'sub', 'round'}
    assert not torch_ops & (set(counter.ops) - set(sdpa.ops))


def test_module_compiles_as_one_graph_through_the_op(fused):
    """``torch.compile(fullgraph=True)`` of the layer (training: augmented)
    with the op and its backward in the graphs, equal to eager."""
    torch.manual_seed(2)
    mha = MetricMultiheadAttention(16, 2, learn_time_scale=True,
                                   precision='fast').to(DEVICE)
    x = torch.randn(2, 8, 16, device=DEVICE, requires_grad=True)
    padding = torch.zeros(2, 8, dtype=torch.bool, device=DEVICE)
    padding[0, 5:] = True
    targets = set()

    def capture(graph, _):
        targets.update(str(node.target) for node in graph.graph.nodes)
        return graph

    torch._dynamo.reset()
    compiled = torch.compile(mha, fullgraph=True, backend=aot_autograd(
        fw_compiler=capture, bw_compiler=capture))
    out = compiled(x, x, x, key_padding_mask=padding, need_weights=False)[0]
    expected = mha(x, x, x, key_padding_mask=padding, need_weights=False)[0]
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-6)
    grad, = torch.autograd.grad(out.sum(), x)
    expected_grad, = torch.autograd.grad(expected.sum(), x)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-4, atol=1e-5)
    assert {'pyg_metric_attn.augment_queries_and_keys.default',
            'pyg_metric_attn.augment_queries_and_keys_backward.default'} <= targets


COMPILE_CHECK = textwrap.dedent("""
    import inspect
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from pyg_metric_attn.nn.augmentation.kernels import KERNELS

    points = {'Q', 'K', 'QA', 'KA', 'GQA', 'GKA', 'DQ', 'DK'}
    count = 0
    for dtype, acc, mask in (('bf16', 'fp32', True), ('fp32', 'fp32', False),
                             ('fp64', 'fp64', True)):
        constexprs = dict(HAS_MASK=mask, CHECK=mask, ROUND=dtype == 'bf16',
                          ACC=tl.float64 if acc == 'fp64' else tl.float32,
                          BLOCK_L=64, BLOCK_D=64, BLOCK_W=128, BLOCK_S=32)
        pointers = {'ATT': '*u8', 'FLAGS': '*u8', 'PART': '*' + acc,
                    'NORMS': '*fp32', 'TS': '*fp64'}
        floats = ('tiny', 'eps', 'error_scale', 'tolerance')
        for kernel in KERNELS.values():
            signature = {}
            for name, spec in inspect.signature(kernel.fn).parameters.items():
                signature[name] = (
                    'constexpr' if 'constexpr' in str(spec.annotation)
                    else '*' + dtype if name in points else pointers.get(name)
                    or ('fp32' if name in floats else 'i32'))
            compiled = triton.compile(ASTSource(
                fn=kernel, signature=signature,
                constexprs={name: value for name, value in constexprs.items()
                            if name in signature}),
                target=GPUTarget('cuda', 90, 32))
            assert 'cubin' in compiled.asm
            count += 1
    print(count)
""")


def test_kernels_compile_for_h100():
    """Every kernel, in bfloat16 with a mask and the check, float32 without
    either and float64 with both, compiles to an sm_90 cubin with the real
    compiler (no GPU needed: ptxas ships with triton), not only in the
    interpreter."""
    pytest.importorskip('triton.backends.compiler')
    from pyg_metric_attn.nn.augmentation.kernels import KERNELS
    assert compile_for_gpu(COMPILE_CHECK).stdout.split()[-1] == str(
        3 * len(KERNELS))
