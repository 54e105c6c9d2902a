r"""The Triton kernels of the exact dense-attention correction
(:mod:`pyg_metric_attn.nn.exact_attention`; launcher :mod:`.exact`).

The inputs have two leading (softmax) dimensions ``(n0, n1)``, any strides
(a broadcast dimension has stride 0). Grid ``(blocks, N1, N0)``: a program
owns ``BLOCK_M`` queries (forward, :func:`exact_backward_rows_kernel`) or
``BLOCK_N`` keys (:func:`exact_backward_columns_kernel`) of one softmax. It
first reads its softmax's flag and returns at once where it is 0, so an
unflagged softmax costs one load per program and no other memory traffic.

Flagged softmaxes run in float64 throughout. The logits come from the
direct differences, one coordinate at a time (:func:`_scores`:
:math:`\sum_d (q_{id} - k_{jd})^2` in ``[BLOCK_M, BLOCK_N]`` registers,
never the expanded form), so they are accurate to a few float64 units for
every finite float32 point. **Forward**: FlashAttention's online softmax
over key blocks; it writes the output and the row state :math:`(m_i, \log
l_i)` (largest logit and the log of the normaliser, float64 ``[..., L_q,
2]``). **Backward** recomputes :math:`p_{ij} = e^{(s_{ij} - m_i) - \log
l_i}` (subtracting :math:`m_i` first keeps :math:`p` exact to float64 even
for logits of 1e6 and more) and, with :math:`dp_{ij} = z_{ij}\,
\mathrm{dout}_i \cdot v_j` and :math:`D_i = \sum_j p_{ij} dp_{ij}` (summed
by the rows kernel in a first pass, not taken from the rounded output),
:math:`ds_{ij} = p_{ij} (dp_{ij} - D_i)`. The rows kernel writes
:math:`D`, ``dq``, the per-block partial sums of ``dt`` and, for a float
mask that needs one, its gradient :math:`ds` (``[..., L_q, L_k]``); the
columns kernel ``dk`` and ``dv``. For the distance logits :math:`\partial
s_{ij} / \partial q_i = -2 (q_i - k_j) / t`, summed as :math:`-2 (q_i
\sum_j ds_{ij} - \sum_j ds_{ij} k_j) / t`; :math:`\partial s_{ij} /
\partial t = -s_{ij} / t`. A row that may attend to no key has :math:`l = 0`:
its output is NaN (as SDPA's) and its weights count as 0 in backward.

**Dropout**: ``keep = tl.rand(seed, (n L_q + i) L_k + j) >= p`` with 64-bit
Philox counters, redrawn identically by every pass.

This module decorates with ``triton.jit`` at import, which reads
``TRITON_INTERPRET``: it is imported on the first launch.
"""
import triton
import triton.language as tl


@triton.jit
def _float64(x):
    """``x`` in float64, 16-bit floats through float32 (exact either way;
    no direct 16-bit <-> float64 conversion is relied on)."""
    if x.dtype == tl.float64:
        return x
    return x.to(tl.float32).to(tl.float64)


@triton.jit
def _narrowed(x, dtype):
    """float64 ``x`` in ``dtype``, 16-bit floats through float32."""
    if dtype == tl.float64:
        return x
    return x.to(tl.float32).to(dtype)


@triton.jit
def _scores(Q, K, MASK, offs_m, offs_n, Lq, Lk, D, sqm, sqd, skn, skd, smm, smn,
            t, DOT: tl.constexpr, HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr,
            CAUSAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``(f, s, valid)`` of a ``[BLOCK_M, BLOCK_N]`` tile: the float64 logits
    without and with the mask (``s = -inf`` where a key may not be attended
    or lies out of range) and where they are allowed."""
    m_in = offs_m < Lq
    n_in = offs_n < Lk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float64)
    for d in range(0, D):
        qd = _float64(tl.load(Q + offs_m * sqm + d * sqd, mask=m_in, other=0.0))
        kd = _float64(tl.load(K + offs_n * skn + d * skd, mask=n_in, other=0.0))
        if DOT:
            acc += qd[:, None] * kd[None, :]
        else:
            diff = qd[:, None] - kd[None, :]
            acc += diff * diff
    if DOT:
        f = acc / (_root(D) * t)
    else:
        f = -acc / t
    valid = m_in[:, None] & n_in[None, :]
    if CAUSAL:
        valid = valid & (offs_n[None, :] <= offs_m[:, None])
    s = f
    if HAS_MASK:
        allowed = tl.load(MASK + offs_m[:, None] * smm + offs_n[None, :] * smn,
                          mask=valid, other=0)
        if MASK_BOOL:
            valid = valid & (allowed != 0)
        else:
            s = s + _float64(allowed)
    return f, tl.where(valid, s, float('-inf')), valid


@triton.jit
def _root(D):
    """:math:`\\sqrt{D}` in float64 (``D`` may arrive as a constant, or a
    Python number in the interpreter)."""
    return tl.sqrt(tl.zeros((), tl.float64) + D)


@triton.jit
def _keep_scale(SEED, n, offs_m, offs_n, Lq, Lk, p_drop, DROPOUT: tl.constexpr):
    """``z = keep / (1 - p)`` (float64; 1 without dropout)."""
    if DROPOUT:
        seed = tl.load(SEED).to(tl.int32)
        off = (n * Lq + offs_m.to(tl.int64))[:, None] * Lk + offs_n[None, :]
        p = tl.zeros((), tl.float64) + p_drop
        return tl.where(tl.rand(seed, off) >= p_drop, 1.0 / (1.0 - p), 0.0)
    else:
        return 1.0


@triton.jit
def _probabilities(STATS, n, offs_m, Lq, s):
    """``p = exp((s - m) - log l)`` from the saved row state (0 in a row
    that may attend to no key)."""
    row = (n * Lq + offs_m) * 2
    m_in = offs_m < Lq
    largest = tl.load(STATS + row, mask=m_in, other=float('-inf'))
    log_norm = tl.load(STATS + row + 1, mask=m_in, other=0.0)
    empty = largest == float('-inf')
    largest = tl.where(empty, float('inf'), largest)
    log_norm = tl.where(empty, 0.0, log_norm)
    return tl.exp((s - largest[:, None]) - log_norm[:, None])


@triton.jit
def _tile(X, offs, L, W, sl, sw, BLOCK_W: tl.constexpr):
    """Rows ``offs`` of ``X`` ``[L, W]`` as float64 ``[len(offs), BLOCK_W]``
    (zero padded)."""
    offs_w = tl.arange(0, BLOCK_W)
    return _float64(tl.load(X + offs[:, None] * sl + offs_w[None, :] * sw,
                            mask=(offs < L)[:, None] & (offs_w < W)[None, :],
                            other=0.0))


@triton.jit
def _store_tile(X, value, offs, L, W, sl, sw, BLOCK_W: tl.constexpr):
    offs_w = tl.arange(0, BLOCK_W)
    tl.store(X + offs[:, None] * sl + offs_w[None, :] * sw,
             _narrowed(value, X.dtype.element_ty),
             mask=(offs < L)[:, None] & (offs_w < W)[None, :])


@triton.jit
def _matmul(a, b):
    """``a @ b`` in float64 as a broadcast product and a sum: ``tl.dot``
    takes no float64 operands in the Triton versions this package supports."""
    return tl.sum(a[:, :, None] * b[None, :, :], 1)


@triton.jit
def _matmul_nt(a, b):
    """``a @ b.T`` (see :func:`_matmul`)."""
    return tl.sum(a[:, None, :] * b[None, :, :], 2)


@triton.jit
def _matmul_tn(a, b):
    """``a.T @ b`` (see :func:`_matmul`)."""
    return tl.sum(a[:, :, None] * b[:, None, :], 0)


@triton.jit
def _softmax_flag(FLAGS, sf0, sf1):
    """This program's softmax ``(n0, n1)`` and its flag (0: not flagged)."""
    n1 = tl.program_id(1).to(tl.int64)
    n0 = tl.program_id(2).to(tl.int64)
    return n0, n1, tl.load(FLAGS + n0 * sf0 + n1 * sf1)


@triton.jit
def _softmax_inputs(TS, Q, K, V, MASK, n0, n1, N1, st0, st1, sq0, sq1, sk0, sk1,
                    sv0, sv1, sm0, sm1):
    """The softmax's flat index, time scale and input pointers."""
    return (n0 * N1 + n1, tl.load(TS + n0 * st0 + n1 * st1), Q + n0 * sq0 + n1 * sq1,
            K + n0 * sk0 + n1 * sk1, V + n0 * sv0 + n1 * sv1,
            MASK + n0 * sm0 + n1 * sm1)


@triton.jit
def _recompute(Q, K, V, MASK, SEED, STATS, dout, n, offs_m, offs_n, Lq, Lk, D, C,
               sqm, sqd, skn, skd, svn, svc, smm, smn, t, p_drop,
               DOT: tl.constexpr, HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr,
               CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
    """Backward's tile ``(f, p, z, dp)``: the unmasked logits, the weights
    from the saved row state, the dropout scale and :math:`dp = z\\,
    \\mathrm{dout} \\cdot v`."""
    f, s, _ = _scores(Q, K, MASK, offs_m, offs_n, Lq, Lk, D, sqm, sqd, skn, skd,
                      smm, smn, t, DOT, HAS_MASK, MASK_BOOL, CAUSAL, BLOCK_M,
                      BLOCK_N)
    p = _probabilities(STATS, n, offs_m, Lq, s)
    z = _keep_scale(SEED, n, offs_m, offs_n, Lq, Lk, p_drop, DROPOUT)
    v = _tile(V, offs_n, Lk, C, svn, svc, BLOCK_C)
    return f, p, z, _matmul_nt(dout, v) * z


@triton.jit
def exact_forward_kernel(
        FLAGS, TS, Q, K, V, MASK, SEED, OUT, STATS, Lq, Lk, D, C, N1,
        sf0, sf1, st0, st1, sq0, sq1, sqm, sqd, sk0, sk1, skn, skd,
        sv0, sv1, svn, svc, sm0, sm1, smm, smn, so0, so1, som, soc, p_drop,
        DOT: tl.constexpr, HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr,
        CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
    n0, n1, flag = _softmax_flag(FLAGS, sf0, sf1)
    if flag == 0:
        return
    n, t, Q, K, V, MASK = _softmax_inputs(TS, Q, K, V, MASK, n0, n1, N1, st0, st1,
                                          sq0, sq1, sk0, sk1, sv0, sv1, sm0, sm1)
    block = tl.program_id(0)
    offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
    m_i = tl.full((BLOCK_M,), float('-inf'), tl.float64)
    l_i = tl.zeros((BLOCK_M,), tl.float64)
    acc = tl.zeros((BLOCK_M, BLOCK_C), tl.float64)
    end = Lk
    if CAUSAL:
        end = tl.minimum(Lk, (block + 1) * BLOCK_M)
    for start in range(0, end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        _, s, _ = _scores(Q, K, MASK, offs_m, offs_n, Lq, Lk, D, sqm, sqd, skn,
                          skd, smm, smn, t, DOT, HAS_MASK, MASK_BOOL, CAUSAL,
                          BLOCK_M, BLOCK_N)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        shift = tl.where(m_new == float('-inf'), 0.0, m_new)
        alpha = tl.exp(m_i - shift)
        p = tl.exp(s - shift[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        p = p * _keep_scale(SEED, n, offs_m, offs_n, Lq, Lk, p_drop, DROPOUT)
        v = _tile(V, offs_n, Lk, C, svn, svc, BLOCK_C)
        acc = acc * alpha[:, None] + _matmul(p, v)
        m_i = m_new
    m_in = offs_m < Lq
    l_i = tl.where(m_in, l_i, 1.0)  # rows past the end: no 0 / 0
    OUT += n0 * so0 + n1 * so1
    _store_tile(OUT, acc / l_i[:, None], offs_m, Lq, C, som, soc, BLOCK_C)
    row = (n * Lq + offs_m) * 2
    tl.store(STATS + row, m_i, mask=m_in)
    tl.store(STATS + row + 1, tl.log(l_i), mask=m_in)


@triton.jit
def exact_backward_rows_kernel(
        FLAGS, TS, Q, K, V, MASK, SEED, DO, STATS, DELTA, DQ, DMASK, DT,
        Lq, Lk, D, C, N1, n_blocks,
        sf0, sf1, st0, st1, sq0, sq1, sqm, sqd, sk0, sk1, skn, skd,
        sv0, sv1, svn, svc, sm0, sm1, smm, smn, sd0, sd1, sdm, sdc,
        sg0, sg1, sgm, sgd, p_drop,
        DOT: tl.constexpr, HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr,
        CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, NEED_DQ: tl.constexpr,
        NEED_DT: tl.constexpr, NEED_DMASK: tl.constexpr, BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr):
    n0, n1, flag = _softmax_flag(FLAGS, sf0, sf1)
    if flag == 0:
        return
    n, t, Q, K, V, MASK = _softmax_inputs(TS, Q, K, V, MASK, n0, n1, N1, st0, st1,
                                          sq0, sq1, sk0, sk1, sv0, sv1, sm0, sm1)
    DO += n0 * sd0 + n1 * sd1
    block = tl.program_id(0)
    offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
    dout = _tile(DO, offs_m, Lq, C, sdm, sdc, BLOCK_C)
    end = Lk
    if CAUSAL:
        end = tl.minimum(Lk, (block + 1) * BLOCK_M)
    delta = tl.zeros((BLOCK_M,), tl.float64)
    for start in range(0, end, BLOCK_N):
        offs_n = start + tl.arange(0, BLOCK_N)
        _, p, _, dp = _recompute(Q, K, V, MASK, SEED, STATS, dout, n, offs_m,
                                 offs_n, Lq, Lk, D, C, sqm, sqd, skn, skd, svn, svc,
                                 smm, smn, t, p_drop, DOT, HAS_MASK, MASK_BOOL,
                                 CAUSAL, DROPOUT, BLOCK_M, BLOCK_N, BLOCK_C)
        delta += tl.sum(p * dp, 1)
    tl.store(DELTA + n * Lq + offs_m, delta, mask=offs_m < Lq)
    if NEED_DQ or NEED_DT or NEED_DMASK:
        dq = tl.zeros((BLOCK_M, BLOCK_D), tl.float64)
        row_sum = tl.zeros((BLOCK_M,), tl.float64)
        dt = tl.zeros((BLOCK_M,), tl.float64)
        for start in range(0, end, BLOCK_N):
            offs_n = start + tl.arange(0, BLOCK_N)
            f, p, _, dp = _recompute(Q, K, V, MASK, SEED, STATS, dout, n, offs_m,
                                     offs_n, Lq, Lk, D, C, sqm, sqd, skn, skd, svn,
                                     svc, smm, smn, t, p_drop, DOT, HAS_MASK,
                                     MASK_BOOL, CAUSAL, DROPOUT, BLOCK_M, BLOCK_N,
                                     BLOCK_C)
            ds = p * (dp - delta[:, None])
            if NEED_DQ:
                dq += _matmul(ds, _tile(K, offs_n, Lk, D, skn, skd, BLOCK_D))
                row_sum += tl.sum(ds, 1)
            if NEED_DT:
                dt += tl.sum(tl.where(p > 0, ds * f, 0.0), 1)
            if NEED_DMASK:
                tl.store(DMASK + (n * Lq + offs_m)[:, None] * Lk + offs_n[None, :],
                         ds, mask=(offs_m < Lq)[:, None] & (offs_n < Lk)[None, :])
        if NEED_DQ:
            if DOT:
                dq = dq / (_root(D) * t)
            else:
                q = _tile(Q, offs_m, Lq, D, sqm, sqd, BLOCK_D)
                dq = -2.0 / t * (row_sum[:, None] * q - dq)
            DQ += n0 * sg0 + n1 * sg1
            _store_tile(DQ, dq, offs_m, Lq, D, sgm, sgd, BLOCK_D)
        if NEED_DT:
            tl.store(DT + n * n_blocks + block, -tl.sum(dt, 0) / t)


@triton.jit
def exact_backward_columns_kernel(
        FLAGS, TS, Q, K, V, MASK, SEED, DO, STATS, DELTA, DK, DV,
        Lq, Lk, D, C, N1,
        sf0, sf1, st0, st1, sq0, sq1, sqm, sqd, sk0, sk1, skn, skd,
        sv0, sv1, svn, svc, sm0, sm1, smm, smn, sd0, sd1, sdm, sdc,
        sk_0, sk_1, sk_n, sk_d, sv_0, sv_1, sv_n, sv_c, p_drop,
        DOT: tl.constexpr, HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr,
        CAUSAL: tl.constexpr, DROPOUT: tl.constexpr, NEED_DK: tl.constexpr,
        NEED_DV: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        BLOCK_C: tl.constexpr, BLOCK_D: tl.constexpr):
    n0, n1, flag = _softmax_flag(FLAGS, sf0, sf1)
    if flag == 0:
        return
    n, t, Q, K, V, MASK = _softmax_inputs(TS, Q, K, V, MASK, n0, n1, N1, st0, st1,
                                          sq0, sq1, sk0, sk1, sv0, sv1, sm0, sm1)
    DO += n0 * sd0 + n1 * sd1
    block = tl.program_id(0)
    offs_n = block * BLOCK_N + tl.arange(0, BLOCK_N)
    dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float64)
    column_sum = tl.zeros((BLOCK_N,), tl.float64)
    dv = tl.zeros((BLOCK_N, BLOCK_C), tl.float64)
    first = 0
    if CAUSAL:  # queries i >= j only
        first = (block * BLOCK_N) // BLOCK_M * BLOCK_M
    for start in range(first, Lq, BLOCK_M):
        offs_m = start + tl.arange(0, BLOCK_M)
        dout = _tile(DO, offs_m, Lq, C, sdm, sdc, BLOCK_C)
        _, p, z, dp = _recompute(Q, K, V, MASK, SEED, STATS, dout, n, offs_m, offs_n,
                                 Lq, Lk, D, C, sqm, sqd, skn, skd, svn, svc, smm,
                                 smn, t, p_drop, DOT, HAS_MASK, MASK_BOOL, CAUSAL,
                                 DROPOUT, BLOCK_M, BLOCK_N, BLOCK_C)
        if NEED_DV:
            dv += _matmul_tn(p * z, dout)
        if NEED_DK:
            delta = tl.load(DELTA + n * Lq + offs_m, mask=offs_m < Lq, other=0.0)
            ds = p * (dp - delta[:, None])
            dk += _matmul_tn(ds, _tile(Q, offs_m, Lq, D, sqm, sqd, BLOCK_D))
            column_sum += tl.sum(ds, 0)
    if NEED_DK:
        if DOT:
            dk = dk / (_root(D) * t)
        else:
            k = _tile(K, offs_n, Lk, D, skn, skd, BLOCK_D)
            dk = 2.0 / t * (dk - column_sum[:, None] * k)
        DK += n0 * sk_0 + n1 * sk_1
        _store_tile(DK, dk, offs_n, Lk, D, sk_n, sk_d, BLOCK_D)
    if NEED_DV:
        DV += n0 * sv_0 + n1 * sv_1
        _store_tile(DV, dv, offs_n, Lk, C, sv_n, sv_c, BLOCK_C)
