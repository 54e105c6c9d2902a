"""The Triton sparse metric-attention kernels against a float64 plain-torch
reference (gathered differences, PyG softmax, scatter-add): outputs, lse,
weights and every gradient. Without CUDA the kernels run in Triton's
interpreter (TRITON_INTERPRET=1), so the graphs are tiny."""
from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

if not torch.cuda.is_available():  # see conftest.py: also set there, earlier
    os.environ['TRITON_INTERPRET'] = '1'

triton = pytest.importorskip('triton', reason='triton is not installed (pip '
                             'install pyg-metric-attn[gpu])')


def _version(text):
    return tuple(int(part) for part in text.split('+')[0].split('.')[:2])


if os.environ.get('TRITON_INTERPRET') == '1' and _version(triton.__version__) < (3, 9) \
        and _version(np.__version__) >= (2, 4):
    # Seen with triton 3.6: its interpreter turns a loaded scalar used as a loop
    # bound into int(1-element array), an error since numpy 2.4. Compiled (GPU)
    # kernels are unaffected; the interpreter of triton 3.9 runs them.
    pytest.skip(f'the interpreter of triton {triton.__version__} cannot run '
                f'these kernels under numpy {np.__version__} (use triton >= 3.9, '
                'or a GPU)', allow_module_level=True)

from conftest import compile_for_gpu, expect_device_assert  # noqa: E402
from torch_geometric.utils import scatter, softmax  # noqa: E402

from pyg_metric_attn.nn import triton as ta  # noqa: E402
from pyg_metric_attn.nn.triton import function, schedule  # noqa: E402

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
METRICS = ['metric', 'l2', 'dot']


# ---------------------------------------------------------------- helpers

def messy_csr(num_dst, num_src, generator, p=0.3, isolated=2):
    """A destination-sorted CSR graph with isolated rows (the last
    ``isolated``), duplicate edges, self-loops and unsorted columns."""
    live = num_dst - isolated
    mask = torch.rand(live, num_src, generator=generator) < p
    dst, src = mask.nonzero(as_tuple=True)
    dup = torch.arange(0, dst.numel(), 5)
    loops = torch.arange(0, min(live, num_src), 2)
    dst = torch.cat([dst, dst[dup], loops])
    src = torch.cat([src, src[dup], loops])
    shuffle = torch.randperm(dst.numel(), generator=generator)
    dst, src = dst[shuffle], src[shuffle]
    order = torch.sort(dst, stable=True).indices
    dst, src = dst[order], src[order]
    rowptr = torch.zeros(num_dst + 1, dtype=torch.long)
    rowptr[1:] = torch.bincount(dst, minlength=num_dst).cumsum(0)
    return rowptr.to(DEVICE), src.to(DEVICE)


def inputs(num_dst, num_src, heads, dim, channels, num_edges, generator,
           dtype=torch.float32, offset=0.0):
    def rand(*shape):
        return torch.randn(*shape, generator=generator).to(DEVICE, dtype)
    q = rand(num_dst, heads, dim) + offset
    k = rand(num_src, heads, dim) + offset
    v = rand(num_src, heads, channels)
    b = rand(num_edges, heads)
    return q, k, v, b


def reference(q, k, v, rowptr, col, metric, t, bias=None, keep_scale=None):
    """float64 plain-torch metric-attention: (out, lse, weights)."""
    n = rowptr.numel() - 1
    row = torch.repeat_interleave(torch.arange(n, device=rowptr.device),
                                  rowptr.diff())
    if metric == 'dot':
        s = (q[row] * k[col]).sum(-1) / (math.sqrt(q.size(-1)) * t)
    else:
        s = -(q[row] - k[col]).square().sum(-1) / t
    if bias is not None:
        s = s + bias
    alpha = softmax(s, row, num_nodes=n)
    m = scatter(s.detach(), row, 0, dim_size=n, reduce='max')
    lse = m + scatter((s - m[row]).exp(), row, 0, dim_size=n, reduce='sum').log()
    w = alpha if keep_scale is None else alpha * keep_scale
    out = scatter(w.unsqueeze(-1) * v[col], row, 0, dim_size=n, reduce='sum')
    return out, lse, w


def hub_graph(num_dst=6, num_src=40):
    """Row 2 a hub (every source twice: degree 80), source 0 a hub (every
    row, several times), row 5 isolated: destination-sorted ``(rowptr,
    col)``."""
    rows = [torch.full((80,), 2), torch.tensor([0, 0, 1, 3, 3, 3, 4] * 3),
            torch.tensor([0, 1, 1, 4])]
    cols = [torch.arange(num_src).repeat(2), torch.zeros(21, dtype=torch.long),
            torch.tensor([7, 3, 9, 11])]
    dst, src = torch.cat(rows), torch.cat(cols)
    order = torch.sort(dst, stable=True).indices
    rowptr = torch.zeros(num_dst + 1, dtype=torch.long)
    rowptr[1:] = torch.bincount(dst, minlength=num_dst).cumsum(0)
    return rowptr.to(DEVICE), src[order].to(DEVICE)


def leaves(*tensors, dtype=None):
    return [t.detach().to(dtype or t.dtype).requires_grad_() for t in tensors]


def assert_close(actual, expected, rtol=1e-5, name=''):
    """Relative agreement: elementwise rtol, plus rtol times the largest
    reference magnitude as the absolute floor (for entries near zero)."""
    expected = expected.detach().double()
    actual = actual.detach().double()
    finite = expected.isfinite()
    assert torch.equal(finite, actual.isfinite()), name
    atol = rtol * float(expected[finite].abs().max()) if finite.any() else 0.0
    torch.testing.assert_close(actual[finite], expected[finite], rtol=rtol,
                               atol=atol, msg=lambda m: f'{name}: {m}')
    assert torch.equal(actual[~finite], expected[~finite]), name


def check_against_reference(metric, rowptr, col, q, k, v, bias, t, *,
                            rtol=1e-5, deterministic=True, dropout_p=0.0,
                            seed=None, grad_weights=True, grad_rtol=None):
    """Run kernel and reference with all inputs requiring grad; compare
    outputs, lse, weights and the gradients of a loss through out and weights.
    ``grad_rtol``: the gradients' tolerance where it differs from ``rtol``."""
    gen = torch.Generator().manual_seed(123)
    has_t = isinstance(t, torch.Tensor)
    q1, k1, v1 = leaves(q, k, v)
    b1 = leaves(bias)[0] if bias is not None else None
    t1 = leaves(t)[0] if has_t else t
    out, lse, w = ta.metric_attention_lse(q1, k1, v1, rowptr, col, metric, t1, b1,
                                dropout_p=dropout_p, seed=seed, need_weights=True,
                                deterministic=deterministic)
    assert out.dtype == q.dtype and w.dtype == q.dtype and lse.dtype == torch.float32
    assert out.shape == (q.size(0), q.size(1), v.size(-1))
    assert w.shape == (col.numel(), q.size(1))
    assert not out.isnan().any() and not w.isnan().any()

    q2, k2, v2 = leaves(q, k, v, dtype=torch.float64)
    b2 = leaves(bias, dtype=torch.float64)[0] if bias is not None else None
    t2 = leaves(t, dtype=torch.float64)[0] if has_t else t
    keep_scale = None
    if dropout_p > 0:  # the reference drops exactly the edges the kernel dropped
        keep_scale = (w != 0).double() / (1 - dropout_p)
    out2, lse2, w2 = reference(q2, k2, v2, rowptr, col, metric, t2, b2, keep_scale)
    assert_close(out, out2, rtol, 'out')
    assert_close(lse, lse2, rtol, 'lse')
    assert_close(w, w2, rtol, 'weights')

    g_out = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(DEVICE)
    g_w = torch.randn(w.shape, generator=gen, dtype=torch.float64).to(DEVICE)
    loss1 = (out.double() * g_out).sum()
    loss2 = (out2 * g_out).sum()
    if grad_weights:
        loss1 = loss1 + (w.double() * g_w).sum()
        loss2 = loss2 + (w2 * g_w).sum()
    names = ['query', 'key', 'value'] + (['edge_bias'] if bias is not None else []) \
        + (['time_scale'] if has_t else [])
    mine = [x for x in (q1, k1, v1, b1, t1 if has_t else None) if x is not None]
    theirs = [x for x in (q2, k2, v2, b2, t2 if has_t else None) if x is not None]
    grads1 = torch.autograd.grad(loss1, mine)
    grads2 = torch.autograd.grad(loss2, theirs)
    for name, g1, g2, x in zip(names, grads1, grads2, mine, strict=True):
        assert g1.dtype == x.dtype and g1.shape == x.shape, name
        assert_close(g1, g2, grad_rtol or rtol, f'grad {name}')
    return out, w, grads1


# ---------------------------------------------------------------- tests

@pytest.mark.parametrize('metric', METRICS)
def test_matches_reference(metric):
    """Heads, non-power-of-two D and C, edge bias, learned time scale,
    bipartite, isolated rows, duplicates, self-loops, weight gradients."""
    gen = torch.Generator().manual_seed(0)
    rowptr, col = messy_csr(9, 7, gen)
    q, k, v, b = inputs(9, 7, 3, 5, 6, col.numel(), gen)
    out, _, _ = check_against_reference(metric, rowptr, col, q, k, v, b,
                                        torch.tensor(0.7))
    assert torch.equal(out[-2:], torch.zeros_like(out[-2:]))  # isolated rows


def test_no_bias_float_time_scale_one_head():
    gen = torch.Generator().manual_seed(1)
    rowptr, col = messy_csr(6, 6, gen, p=0.5, isolated=1)
    q, k, v, _ = inputs(6, 6, 1, 3, 1, col.numel(), gen)
    check_against_reference('metric', rowptr, col, q, k, v, None, 2.5,
                            grad_weights=False)
    check_against_reference('dot', rowptr, col, q, k, v, None, 1.0)


def test_public_entry_point():
    gen = torch.Generator().manual_seed(2)
    rowptr, col = messy_csr(5, 4, gen, p=0.6)
    q, k, v, _ = inputs(5, 4, 2, 4, 3, col.numel(), gen)
    args = (q, k, v, rowptr, col)
    out, w = ta.triton_metric_attention(*args)
    assert w is None
    out2, w2 = ta.triton_metric_attention(*args, need_weights=True)
    assert torch.equal(out, out2) and w2.shape == (col.numel(), 2)
    out3, _ = ta.triton_metric_attention(*args[:3], rowptr.int(), col.int())
    assert torch.equal(out, out3)  # int32 CSR
    ref, _, _ = reference(q.double(), k.double(), v.double(), rowptr, col,
                          'metric', 1.0)
    assert_close(out, ref)


def test_empty_graphs():
    gen = torch.Generator().manual_seed(3)
    q, k, v, _ = inputs(4, 3, 2, 3, 5, 0, gen)
    q1, k1, v1 = leaves(q, k, v)
    t = torch.tensor(1.5, device=DEVICE, requires_grad=True)
    bias = torch.zeros(0, 2, device=DEVICE, requires_grad=True)
    rowptr = torch.zeros(5, dtype=torch.long, device=DEVICE)
    col = torch.zeros(0, dtype=torch.long, device=DEVICE)
    out, lse, w = ta.metric_attention_lse(q1, k1, v1, rowptr, col, time_scale=t,
                                edge_bias=bias, need_weights=True)
    assert not out.any() and out.shape == (4, 2, 5) and w.shape == (0, 2)
    assert (lse == float('-inf')).all()
    grads = torch.autograd.grad(out.sum() + w.sum(), (q1, k1, v1, t, bias))
    assert all(not g.any() for g in grads)
    # no destination at all
    out, w = ta.triton_metric_attention(q1[:0], k1, v1, rowptr[:1], col,
                                        need_weights=True)
    assert out.shape == (0, 2, 5) and w.shape == (0, 2)
    out.sum().backward()


def test_rows_masked_by_infinite_bias_give_zero_not_nan():
    gen = torch.Generator().manual_seed(4)
    rowptr, col = messy_csr(6, 5, gen, p=0.6, isolated=0)
    q, k, v, b = inputs(6, 5, 2, 3, 3, col.numel(), gen)
    b[rowptr[1]:rowptr[2], 0] = float('-inf')  # row 1, head 0 fully masked
    q1, k1, v1, b1 = leaves(q, k, v, b)
    out, lse, w = ta.metric_attention_lse(q1, k1, v1, rowptr, col, edge_bias=b1,
                                need_weights=True)
    assert not out[1, 0].any() and lse[1, 0] == float('-inf')
    assert not out.isnan().any() and not w.isnan().any()
    grads = torch.autograd.grad(out.square().sum(), (q1, k1, v1, b1))
    assert not any(g.isnan().any() for g in grads)


def test_dropout_mask_and_gradients():
    gen = torch.Generator().manual_seed(5)
    rowptr, col = messy_csr(10, 8, gen, p=0.6)
    q, k, v, b = inputs(10, 8, 2, 4, 3, col.numel(), gen)
    p = 0.4
    _, w, grads = check_against_reference('metric', rowptr, col, q, k, v, b,
                                          torch.tensor(1.2), dropout_p=p, seed=7)
    _, _, alpha = reference(q.double(), k.double(), v.double(), rowptr, col,
                            'metric', 1.2, b.double())
    scaled = w.double() * (1 - p)
    dropped = scaled == 0
    assert_close(scaled[~dropped], alpha[~dropped])
    assert 0.2 < dropped.double().mean() < 0.6
    # same seed: same mask (and weights); other seed: another mask; atomic path
    # reproduces the forward mask in its backward too
    _, w_again, _ = check_against_reference('metric', rowptr, col, q, k, v, b,
                                            torch.tensor(1.2), dropout_p=p,
                                            seed=7, deterministic=False)
    assert torch.equal(w, w_again)
    _, w_other = ta.triton_metric_attention(q, k, v, rowptr, col, edge_bias=b,
                                            time_scale=1.2, dropout_p=p, seed=8,
                                            need_weights=True)
    assert not torch.equal(w_other == 0, dropped)
    # the dropped mask differs between heads (offset e * H + h)
    assert not torch.equal(dropped[:, 0], dropped[:, 1])


def test_dropout_one_drops_everything():
    gen = torch.Generator().manual_seed(6)
    rowptr, col = messy_csr(5, 5, gen, p=0.6)
    q, k, v, _ = inputs(5, 5, 1, 2, 2, col.numel(), gen)
    out, w = ta.triton_metric_attention(q, k, v, rowptr, col, dropout_p=1.0,
                                        need_weights=True)
    assert not out.any() and not w.any()


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_half_precision(dtype):
    """Half inputs, float32 accumulation: error at the input rounding level.
    A gradient sums a node's edge terms, which cancel (softmax gradients sum
    to zero) after each was rounded to the inputs' precision (the weights
    enter the products in it, as in FlashAttention): its error is that of the
    terms, about 2^-8 times a few per edge in bfloat16, not of the (smaller)
    sum; on an H100 one element of grad query was off by 3% of the largest."""
    gen = torch.Generator().manual_seed(7)
    rowptr, col = messy_csr(8, 6, gen)
    q, k, v, b = inputs(8, 6, 2, 5, 3, col.numel(), gen, dtype=dtype)
    rtol = 2e-2 if dtype == torch.bfloat16 else 4e-3
    check_against_reference('l2', rowptr, col, q, k, v, b, torch.tensor(0.9),
                            rtol=rtol,
                            grad_rtol=5e-2 if dtype == torch.bfloat16 else rtol)


@pytest.mark.parametrize('deterministic', [True, False])
def test_hub_row_and_hub_source_are_split(monkeypatch, deterministic):
    """A destination row and a source column much longer than the chunk:
    several programs per row/column, partials combined in a second kernel."""
    monkeypatch.setattr(function, 'BLOCK_E', 4)
    monkeypatch.setattr(schedule, 'ROW_CHUNK', 8)
    gen = torch.Generator().manual_seed(8)
    num_dst, num_src = 6, 40
    rowptr, col = hub_graph(num_dst, num_src)
    colptr = torch.zeros(num_src + 1, dtype=torch.long, device=DEVICE)
    colptr[1:] = torch.bincount(col, minlength=num_src).cumsum(0)
    rows = schedule.segment_schedule(rowptr, col.numel(), 8)
    assert (rows.items[0] == 2).sum() == 10 and 2 in rows.split[0]
    cols = schedule.segment_schedule(colptr, col.numel(), 8)
    assert (cols.items[0] == 0).sum() == 3 and 0 in cols.split[0]
    q, k, v, b = inputs(num_dst, num_src, 2, 3, 5, col.numel(), gen)
    check_against_reference('metric', rowptr, col, q, k, v, b, torch.tensor(3.0),
                            deterministic=deterministic)


def test_far_offset_precision():
    """Points 1e4 from the origin, close to each other: direct differences
    keep the logits exact; the expanded form 2 q.k - |k|^2 would not."""
    gen = torch.Generator().manual_seed(9)
    rowptr, col = messy_csr(8, 8, gen, p=0.5)
    q, k, v, b = inputs(8, 8, 2, 4, 3, col.numel(), gen, offset=1e4)
    q, k = q * 1.0, k * 1.0
    check_against_reference('metric', rowptr, col, q, k, v, b, torch.tensor(0.5))
    # the same check fails for the expanded form in float32 (so it can fail)
    row = torch.repeat_interleave(torch.arange(8, device=DEVICE), rowptr.diff())
    expanded = (2 * (q[row] * k[col]).sum(-1) - k[col].square().sum(-1)
                - q[row].square().sum(-1)) / 0.5
    exact = -(q[row].double() - k[col].double()).square().sum(-1) / 0.5
    assert (expanded.double() - exact).abs().max() > 1.0


@pytest.mark.parametrize('metric', METRICS)
@pytest.mark.parametrize('scale', [1e20, 1e36])
def test_huge_inputs_match_float64(metric, scale):
    """Logits beyond float32's range (``|q|^2 / t`` up to 1e73 here): the
    kernel computes them in a power-of-two reduced range, so a row without a
    self-loop still weights its nearest (or best-aligned) neighbours instead
    of giving zeros or NaN; outputs, weights, lse and gradients match the
    float64 reference (lse and gradients after rounding to float32)."""
    gen = torch.Generator().manual_seed(11)
    rowptr, col = messy_csr(8, 7, gen, p=0.5, isolated=1)
    row = torch.repeat_interleave(torch.arange(8, device=DEVICE), rowptr.diff())
    keep = row != col  # drop self-loops: no zero-distance edge to lean on
    rowptr = torch.zeros_like(rowptr)
    rowptr[1:] = torch.bincount(row[keep], minlength=8).cumsum(0)
    col = col[keep]
    q, k, v, b = inputs(8, 7, 2, 3, 4, col.numel(), gen)
    q, k = q * scale, k * scale
    b = b * min(scale * scale, 1e37)  # a bias on the logits' own scale
    t = torch.tensor(0.5, device=DEVICE)
    q1, k1, v1, b1 = leaves(q, k, v, b)
    out, lse, w = ta.metric_attention_lse(q1, k1, v1, rowptr, col, metric, t, b1,
                                need_weights=True)
    q2, k2, v2, b2 = leaves(q, k, v, b, dtype=torch.float64)
    out2, lse2, w2 = reference(q2, k2, v2, rowptr, col, metric, t, b2)
    assert out.isfinite().all() and w.isfinite().all()
    assert_close(out, out2, 1e-5, 'out')
    assert_close(w, w2, 1e-5, 'weights')
    assert_close(lse, lse2.float(), 1e-5, 'lse')
    # Gradients: the value gradient is exact; the others are float32 noise
    # around 0 on rows this peaked (the reference's are exactly 0): finite.
    g_out = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(DEVICE)
    grads = torch.autograd.grad((out.double() * g_out).sum(), (q1, k1, v1, b1))
    assert all(g.isfinite().all() for g in grads)
    grad_v, = torch.autograd.grad((out2 * g_out).sum(), (v2,))
    assert_close(grads[2], grad_v, 1e-5, 'grad value')


def test_deterministic_and_atomic_paths_agree():
    gen = torch.Generator().manual_seed(10)
    rowptr, col = messy_csr(9, 9, gen, p=0.5)
    q, k, v, b = inputs(9, 9, 2, 3, 4, col.numel(), gen)
    results = []
    for det in (True, True, False):
        q1, k1, v1, b1 = leaves(q, k, v, b)
        t1 = torch.tensor(0.8, device=DEVICE, requires_grad=True)
        out, w = ta.triton_metric_attention(q1, k1, v1, rowptr, col, 'dot', t1, b1,
                                            dropout_p=0.3, seed=3, need_weights=True,
                                            deterministic=det)
        loss = out.square().sum() + w.sum()
        results.append((out, w) + torch.autograd.grad(loss, (q1, k1, v1, b1, t1)))
    for a, b_ in zip(results[0], results[1], strict=True):  # bitwise reproducible
        assert torch.equal(a, b_)
    for a, b_ in zip(results[0], results[2], strict=True):
        assert_close(b_, a)


def test_input_errors(monkeypatch):
    gen = torch.Generator().manual_seed(11)
    rowptr, col = messy_csr(4, 4, gen, p=0.6)
    q, k, v, b = inputs(4, 4, 2, 3, 3, col.numel(), gen)
    with pytest.raises(ValueError, match='Unknown metric'):
        ta.triton_metric_attention(q, k, v, rowptr, col, metric='cos')
    with pytest.raises(TypeError, match='dtype'):
        ta.triton_metric_attention(q.double(), k.double(), v.double(), rowptr, col)
    with pytest.raises(ValueError, match='edge_bias'):
        ta.triton_metric_attention(q, k, v, rowptr, col, edge_bias=b[:, :1])
    with pytest.raises(ValueError, match='rowptr'):
        ta.triton_metric_attention(q, k, v, rowptr[:-1], col)
    with pytest.raises(ValueError, match='dropout_p'):
        ta.triton_metric_attention(q, k, v, rowptr, col, dropout_p=1.5)
    monkeypatch.setenv('TRITON_INTERPRET', '0')
    if DEVICE == 'cpu':
        with pytest.raises(RuntimeError, match='TRITON_INTERPRET=1'):
            ta.triton_metric_attention(q, k, v, rowptr, col)


def test_import_without_triton_and_clear_error():
    """The package and this module import without triton; calling the kernel
    then names the extra to install."""
    code = textwrap.dedent("""
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == 'triton' or name.startswith('triton.'):
                    raise ImportError('blocked for the test')
        sys.meta_path.insert(0, Block())
        import torch
        import pyg_metric_attn
        from pyg_metric_attn.nn import triton as ta
        assert not ta.HAVE_TRITON
        try:
            ta.triton_metric_attention(torch.zeros(1, 1, 1), torch.zeros(1, 1, 1),
                                       torch.zeros(1, 1, 1), torch.tensor([0, 1]),
                                       torch.tensor([0]))
        except ImportError as error:
            assert 'pip install pyg-metric-attn[gpu]' in str(error), error
            print('ok')
    """)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep
               + os.environ.get('PYTHONPATH', ''))
    result = subprocess.run([sys.executable, '-c', code], capture_output=True,
                            text=True, env=env, timeout=120)
    assert result.stdout.strip() == 'ok', result.stderr[-2000:]


COMPILE_CHECK = textwrap.dedent("""
    import inspect, sys
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from pyg_metric_attn.nn.triton.kernels import KERNELS

    index = {'COL', 'SCHED', 'SPLIT', 'ROW', 'CSC_ROW', 'CSC_EDGE', 'SEED'}
    fp32 = {'STATS', 'MEAN', 'DELTA', 'GW_DELTA', 'TS', 'PART_ML', 'PART_ACC',
            'PART', 'PART_DQ', 'PART_DK', 'PART_DV'}
    scalars = {'H': 'i32', 'D': 'i32', 'C': 'i32', 'W': 'i32', 'E': 'i64', 'n': 'i64',
               'n_items': 'i64', 'n_split': 'i64', 'p_drop': 'fp32',
               'drop_scale': 'fp32'}
    blocks = {'BLOCK_E': 32, 'BLOCK_D': 16, 'BLOCK_C': 64, 'BLOCK_W': 16,
              'BLOCK': 1024}
    target = GPUTarget('cuda', int(sys.argv[1]), 32)
    count = 0
    for name, kernel in KERNELS.items():
        for flag in (True, False):
            signature, constexprs = {}, {}
            for param, spec in inspect.signature(kernel.fn).parameters.items():
                if param in scalars:
                    signature[param] = scalars[param]
                elif 'constexpr' in str(spec.annotation):
                    signature[param] = 'constexpr'
                    constexprs[param] = blocks.get(param, flag)
                elif param in index:
                    signature[param] = '*i64'
                elif param in fp32 or (name == 'backward_rows'
                                       and param in ('DK', 'DV')):
                    signature[param] = '*fp32'
                elif param == 'DT_PART':
                    signature[param] = '*fp64'
                else:
                    signature[param] = '*' + sys.argv[2]
            compiled = triton.compile(ASTSource(fn=kernel, signature=signature,
                                                constexprs=constexprs),
                                      target=target)
            assert 'cubin' in compiled.asm
            count += 1
    print(count)
""")


def test_kernels_compile_for_h100():
    """Every kernel (all flags on / all off) compiles to an sm_90 cubin with
    the real compiler, not the interpreter (no GPU needed: ptxas ships with
    triton). Catches code that only the interpreter accepts."""
    pytest.importorskip('triton.backends.compiler')
    result = compile_for_gpu(COMPILE_CHECK, '90', 'bf16')
    from pyg_metric_attn.nn.triton.kernels import KERNELS
    assert result.stdout.split()[-1] == str(2 * len(KERNELS))


@pytest.mark.parametrize('metric,aggr', [('metric', 'add'), ('dot', 'mean')])
def test_layer_triton_backend_equals_fused(metric, aggr):
    """MetricAttentionConv(backend='triton') against the fused path: outputs,
    weights in the caller's edge order and parameter gradients (heads, edge
    features, a learned time scale, self-loops added, bipartite)."""
    from pyg_metric_attn import MetricAttentionConv

    g = torch.Generator().manual_seed(3)
    x_src, x_dst = torch.randn(9, 6, generator=g), torch.randn(7, 5, generator=g)
    edge_index = torch.stack([torch.randint(0, 9, (30,), generator=g),
                              torch.randint(0, 7, (30,), generator=g)])
    edge_attr = torch.randn(30, 2, generator=g)
    x_src, x_dst, edge_index, edge_attr = (
        t.to(DEVICE) for t in (x_src, x_dst, edge_index, edge_attr))
    torch.manual_seed(0)
    layers = {backend: MetricAttentionConv(
        (6, 5), 3, heads=2, metric=metric, edge_dim=2, learn_time_scale=True,
        aggr=aggr, backend=backend).to(DEVICE) for backend in ('fused', 'triton')}
    layers['triton'].load_state_dict(layers['fused'].state_dict())
    results = {}
    for backend, layer in layers.items():
        out, (edges, alpha) = layer((x_src, x_dst), edge_index, edge_attr,
                                    return_attention_weights=True)
        (out.square().sum() + alpha.sum()).backward()
        results[backend] = (out, edges, alpha, {
            name: p.grad for name, p in layer.named_parameters()})
    out, edges, alpha, grads = results['fused']
    t_out, t_edges, t_alpha, t_grads = results['triton']
    assert torch.equal(edges, t_edges)
    torch.testing.assert_close(t_out, out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(t_alpha, alpha, rtol=1e-5, atol=1e-6)
    for name, grad in grads.items():
        torch.testing.assert_close(t_grads[name], grad, rtol=1e-4, atol=1e-5,
                                   msg=name)


# ---------------------------------------------------------------- unsafe input

def test_pyg_index_subclasses_are_read_as_plain_tensors():
    """PyG's ``EdgeIndex`` / ``Index`` keep their data in a plain tensor of
    their own; the kernels read that (the subclass itself has no storage the
    interpreter, or a GPU, could read: address 0x0 on CUDA)."""
    from torch_geometric import EdgeIndex
    gen = torch.Generator().manual_seed(12)
    rowptr, col = messy_csr(6, 5, gen, p=0.5)
    q, k, v, _ = inputs(6, 5, 2, 3, 3, col.numel(), gen)
    expected, _ = ta.triton_metric_attention(q, k, v, rowptr, col)
    row = torch.repeat_interleave(torch.arange(6, device=DEVICE), rowptr.diff())
    edge_index = EdgeIndex(torch.stack([col, row]), sparse_size=(5, 6),
                           sort_order='col')
    out, _ = ta.triton_metric_attention(q, k, v, rowptr, edge_index[0])
    assert torch.equal(out, expected)
    out, _ = ta.triton_metric_attention(q, k, v, edge_index.get_indptr(), edge_index[0])
    assert torch.equal(out, expected)


@pytest.mark.parametrize('bad', [-1, 5])
def test_column_out_of_range_raises_index_error(bad):
    """A source index outside [0, N_src) is never read: IndexError naming it
    (on a GPU, a device-side assert that ends the process)."""
    gen = torch.Generator().manual_seed(13)
    rowptr, col = messy_csr(6, 5, gen, p=0.5)
    q, k, v, _ = inputs(6, 5, 2, 3, 3, col.numel(), gen)
    col = col.clone()
    col[3] = bad
    if DEVICE == 'cuda':  # asserted on the device (no host read)
        expect_device_assert(attention_script(rowptr, col, 5))
        return
    with pytest.raises(IndexError, match=f'{bad}.*\\[0, 5\\)'):
        ta.triton_metric_attention(q, k, v, rowptr, col)


def attention_script(rowptr, col, num_src):
    """A script calling the kernels on CUDA with this ``rowptr`` and ``col``."""
    return textwrap.dedent(f"""
        import torch
        from pyg_metric_attn.nn import triton as ta
        rowptr = torch.tensor({rowptr.tolist()}, device='cuda')
        col = torch.tensor({col.tolist()}, device='cuda')
        q = torch.randn({rowptr.numel() - 1}, 2, 3, device='cuda')
        k, v = (torch.randn({num_src}, 2, 3, device='cuda') for _ in range(2))
        ta.triton_metric_attention(q, k, v, rowptr, col)
    """)


def test_bad_row_pointer_raises():
    """rowptr must run non-decreasing from 0 to E: anything else would make
    the kernels read edges that do not exist."""
    gen = torch.Generator().manual_seed(14)
    rowptr, col = messy_csr(6, 5, gen, p=0.5)
    q, k, v, _ = inputs(6, 5, 2, 3, 3, col.numel(), gen)
    for broken in (rowptr + 1, rowptr.flip(0), torch.cat([rowptr[:-1],
                                                          rowptr[-1:] + 2])):
        if DEVICE == 'cuda':  # asserted on the device (no host read)
            expect_device_assert(attention_script(broken, col, 5))
            continue
        with pytest.raises(ValueError, match='rowptr'):
            ta.triton_metric_attention(q, k, v, broken, col)


def test_prepared_graph_gives_the_same_result():
    """A graph prepared once (checks, transpose, schedules) and passed as
    ``graph=`` gives the on-the-fly call's outputs and gradients bitwise."""
    gen = torch.Generator().manual_seed(15)
    rowptr, col = messy_csr(7, 6, gen, p=0.5)
    q, k, v, b = inputs(7, 6, 2, 3, 4, col.numel(), gen)
    graph = ta.prepare_triton_graph(rowptr, col, 6)
    results = []
    for kwargs in (dict(rowptr=rowptr, col=col), dict(graph=graph),
                   dict(graph=graph)):
        q1, k1, v1, b1 = leaves(q, k, v, b)
        out, _ = ta.triton_metric_attention(q1, k1, v1, edge_bias=b1, **kwargs)
        results.append((out,) + torch.autograd.grad(out.square().sum(),
                                                    (q1, k1, v1, b1)))
    for other in results[1:]:
        assert all(torch.equal(a, b_) for a, b_ in zip(results[0], other,
                                                      strict=True))
    with pytest.raises(ValueError, match='not both'):
        ta.triton_metric_attention(q, k, v, rowptr, col, graph=graph)
    with pytest.raises(ValueError, match='destinations'):
        ta.triton_metric_attention(q[:-1], k, v, graph=graph)
    no_transpose = ta.prepare_triton_graph(rowptr, col, 6, transpose=False)
    with pytest.raises(ValueError, match='transpose=True'):
        ta.triton_metric_attention(q, k.requires_grad_(), v, graph=no_transpose)


def test_torch_compile_fullgraph():
    """The kernels are custom operators with fake implementations and autograd:
    torch.compile traces the whole call, graph preparation included, as one
    graph (``fullgraph=True``), forward and backward equal eager's. On CPU
    ``backend='aot_eager'`` keeps the test fast; inductor traces it too."""
    gen = torch.Generator().manual_seed(16)
    rowptr, col = messy_csr(6, 5, gen, p=0.5)
    q, k, v, b = inputs(6, 5, 2, 3, 4, col.numel(), gen)

    def step(q, k, v, b, t):
        out, w = ta.triton_metric_attention(q, k, v, rowptr, col, 'metric', t, b,
                                            dropout_p=0.2, seed=3, need_weights=True)
        return out.square().sum() + w.sum()

    compiled = torch.compile(step, fullgraph=True, backend='aot_eager')
    results = []
    for fn in (step, compiled):
        q1, k1, v1, b1 = leaves(q, k, v, b)
        t1 = torch.tensor(0.7, device=DEVICE, requires_grad=True)
        loss = fn(q1, k1, v1, b1, t1)
        results.append((loss,) + torch.autograd.grad(loss, (q1, k1, v1, b1, t1)))
    for eager, traced in zip(*results, strict=True):
        assert torch.equal(eager, traced)


def test_repeated_step_never_syncs():
    """After the graph is prepared, a training step (dropout with a drawn
    seed, a learned time scale, edge bias, weights) reads nothing back to the
    host: no ``.item()``, ``nonzero``, ``unique``; it launches the forward
    kernels and the two backward passes. Eagerly the operators' code runs
    without the dispatcher (less host time): no custom operator is
    dispatched."""
    from benchmarks.op_count import HOST_READS, OpCounter
    gen = torch.Generator().manual_seed(17)
    rowptr, col = messy_csr(8, 6, gen, p=0.5)
    q, k, v, b = leaves(*inputs(8, 6, 2, 3, 4, col.numel(), gen))
    t = torch.tensor(0.7, device=DEVICE, requires_grad=True)
    graph = ta.prepare_triton_graph(rowptr, col, 6)

    def step():
        out, w = ta.triton_metric_attention(q, k, v, time_scale=t, edge_bias=b,
                                            dropout_p=0.3, need_weights=True,
                                            graph=graph)
        (out.square().sum() + w.sum()).backward()

    step()
    with OpCounter() as counter:
        step()
    assert not {op: counter.ops[op] for op in HOST_READS if counter.ops[op]}
    assert not counter.ops['triton_attention']
    assert not counter.ops['triton_attention_backward']
    assert counter.ops['segment_reduce'] == 1  # inside the backward
    assert counter.launches == {'forward': 1, 'weights': 1, 'backward_rows': 1,
                                'backward_columns': 1}


@pytest.mark.parametrize('long_rows', [False, True])
def test_launches_per_step(monkeypatch, long_rows):
    """A repeated training step launches the forward kernel once and the two
    backward passes once each, and merges split rows and columns only on a
    graph that has them: preparing the graph trims its schedules to the
    rows and columns in use (here, with chunks of 8 edges, the hub row and
    the hub column); a float time scale costs no fill either."""
    from benchmarks.op_count import OpCounter
    monkeypatch.setattr(schedule, 'ROW_CHUNK', 8)
    gen = torch.Generator().manual_seed(21)
    rowptr, col = hub_graph() if long_rows else messy_csr(6, 40, gen, p=0.05)
    graph = ta.prepare_triton_graph(rowptr, col, 40)
    degrees = rowptr.diff()
    assert (graph.rows.n_split > 0) == long_rows
    assert graph.rows.n_split == int((degrees > 8).sum())
    assert graph.cols.n_split == int((torch.bincount(col, minlength=40) > 8).sum())
    assert graph.rows.n_items == int(((degrees + 7) // 8).clamp(min=1).sum())
    q, k, v, _ = leaves(*inputs(6, 40, 2, 3, 4, col.numel(), gen))

    def step():
        out, _ = ta.triton_metric_attention(q, k, v, time_scale=0.8, graph=graph)
        out.square().sum().backward()

    step()
    with OpCounter() as counter:
        step()
    merges = (dict(combine_forward=1, segment_sum=3) if long_rows else {})
    assert counter.launches == dict(forward=1, backward_rows=1,
                                    backward_columns=1, **merges)
    assert not counter.ops['fill'] and not counter.ops['full']


def test_rows_and_chunks_in_their_own_units(monkeypatch):
    """Keys near 1e20 beside ordinary ones: a row that meets them runs in its
    own powers of two, the others in none, and the chunks of the split hub
    row, in different units, merge in the largest; outputs, lse and weights
    match float64, every gradient is finite and the value gradient exact."""
    monkeypatch.setattr(function, 'BLOCK_E', 4)
    monkeypatch.setattr(schedule, 'ROW_CHUNK', 8)
    gen = torch.Generator().manual_seed(22)
    rowptr, col = hub_graph()
    q, k, v, b = inputs(6, 40, 2, 3, 4, col.numel(), gen)
    k[30:] *= 1e20  # the hub row's last chunks, and rows 0, 1, 3, 4 not
    for metric in METRICS:
        q1, k1, v1, b1 = leaves(q, k, v, b)
        out, lse, w = ta.metric_attention_lse(q1, k1, v1, rowptr, col, metric, 0.5,
                                              b1, need_weights=True)
        q2, k2, v2, b2 = leaves(q, k, v, b, dtype=torch.float64)
        out2, lse2, w2 = reference(q2, k2, v2, rowptr, col, metric, 0.5, b2)
        assert_close(out, out2, 1e-5, f'{metric} out')
        assert_close(w, w2, 1e-5, f'{metric} weights')
        assert_close(lse, lse2.float(), 1e-5, f'{metric} lse')
        g_out = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(DEVICE)
        grads = torch.autograd.grad((out.double() * g_out).sum(), (q1, k1, v1, b1))
        assert all(g.isfinite().all() for g in grads)
        grad_v, = torch.autograd.grad((out2 * g_out).sum(), (v2,))
        assert_close(grads[2], grad_v, 1e-5, f'{metric} grad value')


class _FakeCompiled:
    """What a GPU's first launch returns: a compiled kernel, entered by
    ``[grid](*every argument in signature order)``."""
    def __init__(self, calls):
        self.calls = calls

    def __getitem__(self, grid):
        return lambda *args: self.calls.append(('compiled', grid, args))


class _FakeJit:
    def __init__(self):
        self.arg_names = ['X', 'n', 'LAST', 'FIRST']
        self.calls = []

    def __getitem__(self, grid):
        def run(*args, **constants):
            self.calls.append(('jit', grid, args, constants))
            return _FakeCompiled(self.calls)
        return run


def test_a_repeated_launch_enters_the_compiled_kernel(monkeypatch):
    """A launch keeps the compiled kernel of its first run and enters it
    with every argument, the constants in signature order; a tensor of
    another alignment goes through Triton again (its specialisation
    differs). Kernels that are no JITFunction are launched as before."""
    fake = _FakeJit()
    monkeypatch.setitem(function.kernels(), 'fake', fake)
    monkeypatch.setattr(function, '_is_jit_function', lambda k: k is fake)
    launch = function.Launch('fake', (5, 2), FIRST=1, LAST=True, num_warps=4)
    x = torch.zeros(8)
    launch(x, 3)
    launch(x, 3)
    launch(x[1:], 3)  # 4 bytes off: not 16-byte aligned
    launch(x[1:], 3)
    assert [call[0] for call in fake.calls] == ['jit', 'compiled', 'jit', 'compiled']
    assert fake.calls[0][1:] == ((5, 2, 1), (x, 3), dict(FIRST=1, LAST=True,
                                                         num_warps=4))
    assert fake.calls[1] == ('compiled', (5, 2, 1), (x, 3, True, 1))


def test_inputs_of_another_alignment_give_the_same_result():
    """Repeated launches on one prepared graph, with inputs that lie 4 bytes
    off a 16-byte boundary between aligned ones: bitwise the same outputs
    and gradients (on a GPU the compiled kernel of each alignment is kept
    and entered directly: :class:`function.Launch`)."""
    gen = torch.Generator().manual_seed(25)
    rowptr, col = messy_csr(7, 6, gen, p=0.5)
    graph = ta.prepare_triton_graph(rowptr, col, 6)
    q, k, v, b = inputs(7, 6, 2, 3, 4, col.numel(), gen)
    results = []
    for offset in (0, 1, 0, 1):
        shifted = []
        for x in (q, k, v, b):
            buffer = torch.empty(x.numel() + offset, device=DEVICE, dtype=x.dtype)
            shifted.append(buffer[offset:].view_as(x).copy_(x).requires_grad_())
        out, _ = ta.triton_metric_attention(*shifted[:3], edge_bias=shifted[3],
                                            graph=graph)
        results.append((out,) + torch.autograd.grad(out.square().sum(), shifted))
    for other in results[1:]:
        assert all(torch.equal(a, b_) for a, b_ in zip(results[0], other,
                                                      strict=True))


def test_plans_are_made_once_per_graph_and_dtype(monkeypatch):
    """A repeated step on a prepared graph reuses the forward and backward
    plans made by the first; another dtype gets its own."""
    made = []
    for plan in (function.ForwardPlan, function.BackwardPlan):
        make = plan.of
        monkeypatch.setattr(plan, 'of', staticmethod(
            lambda *args, make=make, name=plan.__name__, **kwargs:
            made.append(name) or make(*args, **kwargs)))
    gen = torch.Generator().manual_seed(23)
    rowptr, col = messy_csr(7, 6, gen, p=0.5)
    graph = ta.prepare_triton_graph(rowptr, col, 6)
    for dtype in (torch.float32, torch.float32, torch.bfloat16):
        q, k, v, _ = leaves(*inputs(7, 6, 2, 3, 4, col.numel(), gen), dtype=dtype)
        out, _ = ta.triton_metric_attention(q, k, v, graph=graph)
        out.float().sum().backward()
    assert made == ['ForwardPlan', 'BackwardPlan'] * 2


def test_layer_takes_edge_index_in_every_sort_order():
    """MetricAttentionConv(backend='triton') on PyG's EdgeIndex (unsorted,
    sorted by row, sorted by column) gives the plain tensor's output: the
    prepared graph reads the subclasses' plain data."""
    from torch_geometric import EdgeIndex

    from pyg_metric_attn import MetricAttentionConv
    g = torch.Generator().manual_seed(18)
    x = torch.randn(8, 5, generator=g).to(DEVICE)
    edge_index = torch.randint(0, 8, (2, 20), generator=g).to(DEVICE)
    torch.manual_seed(0)
    conv = MetricAttentionConv(5, 3, heads=2, backend='triton').to(DEVICE)
    expected = conv(x, edge_index)
    for order in (None, 'row', 'col'):
        index = EdgeIndex(edge_index, sparse_size=(8, 8))
        if order is not None:
            index = index.sort_by(order).values
        torch.testing.assert_close(conv(x, index), expected, rtol=1e-5, atol=1e-6)


def test_layer_compiles_to_one_graph():
    """MetricAttentionConv(backend='triton') under torch.compile(fullgraph=True):
    graph checks, self-loops, the prepared graph and both custom operators
    trace as one graph; output and gradients equal eager's."""
    from pyg_metric_attn import MetricAttentionConv
    g = torch.Generator().manual_seed(19)
    x = torch.randn(8, 5, generator=g).to(DEVICE)
    edge_index = torch.randint(0, 8, (2, 20), generator=g).to(DEVICE)
    edge_attr = torch.randn(20, 2, generator=g).to(DEVICE)
    torch.manual_seed(0)
    conv = MetricAttentionConv(5, 3, heads=2, edge_dim=2, learn_time_scale=True,
                               backend='triton').to(DEVICE)
    compiled = torch.compile(conv, fullgraph=True, backend='aot_eager')
    results = []
    for fn in (conv, compiled):
        out = fn(x, edge_index, edge_attr)
        results.append((out,) + torch.autograd.grad(out.square().sum(),
                                                    list(conv.parameters())))
    for eager, traced in zip(*results, strict=True):
        torch.testing.assert_close(traced, eager, rtol=1e-6, atol=1e-7)


def test_compiled_training_step_reads_the_graph_from_the_cache():
    """A full-batch training loop under ``torch.compile(fullgraph=True)`` (as
    with ``mode='reduce-overhead'`` on a GPU) once an eager step has
    prepared the graph: one graph, not compiled again at the next step,
    holding the layer's maps and the custom operator but none of the
    graph's construction (no ``nonzero``, sort, ``searchsorted``,
    ``cumsum``): the cached structures enter as inputs, marked static for
    CUDA graphs. Output and gradients equal eager's."""
    import torch._dynamo

    from pyg_metric_attn import MetricAttentionConv
    from pyg_metric_attn.nn.edge_attention import LayerGraph
    from pyg_metric_attn.utils import graph_cache
    g = torch.Generator().manual_seed(24)
    x = torch.randn(8, 5, generator=g).to(DEVICE)
    edge_index = torch.randint(0, 8, (2, 20), generator=g).to(DEVICE)
    torch.manual_seed(0)
    conv = MetricAttentionConv(5, 3, heads=2, learn_time_scale=True,
                               backend='triton').to(DEVICE)
    graph_cache.clear()
    expected = conv(x, edge_index)  # the eager step prepares the graph
    expected_grads = torch.autograd.grad(expected.square().sum(),
                                         list(conv.parameters()))
    graphs = []

    def recording(graph_module, example_inputs):
        graphs.append(graph_module)
        return torch._dynamo.lookup_backend('aot_eager')(graph_module,
                                                         example_inputs)
    torch._dynamo.reset()
    compiled = torch.compile(conv, fullgraph=True, backend=recording)
    with torch._dynamo.config.patch(error_on_recompile=True):
        for _ in range(2):
            out = compiled(x, edge_index)
            grads = torch.autograd.grad(out.square().sum(),
                                        list(conv.parameters()))
    assert len(graphs) == 1
    targets = ' '.join(str(node.target) for node in graphs[0].graph.nodes)
    assert 'pyg_metric_attn.triton_attention' in targets
    for construction in ('nonzero', 'sort', 'searchsorted', 'cumsum'):
        assert construction not in targets
    perm, prepared = LayerGraph(edge_index, 8, 8, True).triton_graph()  # cached
    assert all(getattr(t, '_dynamo_static_input_type', None)
               for t in (perm, *prepared.tensors()))
    torch.testing.assert_close(out, expected)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad)
