r"""The Triton kernels of fused sparse metric-attention.

A program owns one *work item* (a row, a column, or a chunk of a long one:
see :mod:`.schedule`) and one head; grid ``(items, H)``. The kernels are
thin: a prologue, a loop over ``BLOCK_E`` edges built from the ``@triton.jit``
helpers below (each fragment written once), an epilogue.

**Forward** (:func:`forward_kernel`). FlashAttention-style online softmax
over a sparse row: load :math:`q_i` once, gather ``[BLOCK_E, D]`` key tiles
by index, form the logits from the *direct* differences :math:`q_i - k_j` in
float32 registers (never the expanded :math:`|q|^2 - 2 q\cdot k + |k|^2`,
whose cancellation loses every digit once points sit ~1e4 from the origin),
keep a running max :math:`m`, a running sum :math:`l` of the *undropped*
probabilities and a float32 accumulator :math:`\sum_j e^{s_{ij}-m} z_{ij}
v_j`. It writes ``out`` and the row state ``(m, log l)`` (float32
``[N_dst, H, 2]``), the only per-row state the backward needs. Rows without
edges, or whose logits are all ``-inf``, give 0, never NaN.

**Backward.** Recompute, do not store: with the saved row state
:math:`p_{ij} = e^{s_{ij} - m_i - \log l_i}` is exact per edge even for split
rows. With :math:`D_i = \sum_c \mathrm{dout}_{ic}\mathrm{out}_{ic}` and
:math:`dp_{ij} = z_{ij}(\mathrm{dout}_i \cdot v_j + g^w_{ij})`,
:math:`ds_{ij} = p_{ij}(dp_{ij} - D_i)`. :func:`backward_rows_kernel` (the
forward's schedule) writes ``dq``, ``db`` (each edge owned by one program)
and per-item partials of ``dt``; :func:`backward_columns_kernel` runs over
the transpose and writes ``dk``, ``dv`` with every sum in a fixed order
(bitwise reproducible). Without the transpose, the rows kernel adds ``dk``,
``dv`` with float32 atomics instead (order depends on scheduling). The CSC
pass recomputes :math:`D` flops per edge (negligible in a memory-bound
kernel) where atomics serialise on hub sources.

**Range.** Logits are float32 registers, yet may lie beyond float32's range
(points near 1e20 give :math:`|q|^2 \sim 10^{40}`), where a row would turn
to NaN or all its weights underflow although its softmax is well defined.
The points are loaded times powers of two :math:`1/c_q, 1/c_k`, and logits
and bias are carried in units of a power of two :math:`R = R_a R_b`:
:math:`p = e^{(s' - m') R_a R_b}` only ever overflows towards ``-inf`` (a
zero weight). The powers come from the largest finite ``|q|``, ``|k|``,
``|b|`` (:func:`finite_abs_max_kernel`, one atomic max per block) and are 1
unless a logit could exceed :math:`2^{100}`; the forward kernel derives them
(:func:`_range_constants`) and writes them to ``RANGE`` for the later
kernels, so no torch op and no host sync computes them.

**Dropout.** ``keep = tl.rand(seed, e * H + h) >= p``: a counter-based
Philox stream indexed by the CSR edge position and head (int32 counters
while :math:`E H < 2^{31}`), redrawn bit-identically in backward by both
passes. No ``[E, H]`` mask is stored.

**Bounds.** Every gather is masked by its edge mask; indices are in bounds
by construction: work items and split segments are indexed by the program
id (< the grid), edge positions lie in ``[lo, hi)`` of a validated
``rowptr``, and node indices come from ``col`` / ``row``, validated (or
built) by :func:`~pyg_metric_attn.nn.triton.prepare_triton_graph`.

This module decorates with ``triton.jit`` at import, which reads
``TRITON_INTERPRET``: it is imported on the first launch, not with the package.
"""
import triton
import triton.language as tl

# -------------------------------------------------------------- fragments


@triton.jit
def _power_of_two_above(log2_x):
    """The exponent of the smallest power of two >= ``2^log2_x``, at least 0."""
    return tl.maximum(tl.ceil(log2_x), 0.0)


@triton.jit
def _range_constants(ABSMAX, TS, D, DOT: tl.constexpr):
    """The ``RANGE`` constants from the largest finite ``|q|``, ``|k|``, ``|b|``
    and the time scale (exponents in float32: no product can overflow).
    Bounds: ``|q_i| <= max|q| sqrt(D)``; logits ``(|q| + |k|)^2 / |t|``
    (metric) or ``|q| |k| / (sqrt(D) |t|)`` (dot); ``c`` keeps points below
    ``2^60``, ``R`` logits below ``2^100``."""
    t = tl.load(TS)
    half_log_d = 0.5 * tl.log2(D.to(tl.float32))
    log_q = tl.log2(tl.load(ABSMAX)) + half_log_d
    log_k = tl.log2(tl.load(ABSMAX + 1)) + half_log_d
    log_b = tl.log2(tl.load(ABSMAX + 2))
    log_t = tl.log2(tl.abs(t))
    if DOT:
        e_q = _power_of_two_above(log_q - 60.0)
        e_k = _power_of_two_above(log_k - 60.0)
        log_bound = log_q + log_k - half_log_d - log_t
        logit_scale = 1.0 / (tl.sqrt(D.to(tl.float32)) * t)
        grad_q = tl.exp2(e_k) * logit_scale
        grad_k = tl.exp2(e_q) * logit_scale
    else:
        top = tl.maximum(log_q, log_k)
        low = tl.minimum(log_q, log_k)
        log_sum = tl.where(top == float('-inf'), top,
                           top + tl.log2(1.0 + tl.exp2(low - top)))
        e_q = _power_of_two_above(log_sum - 60.0)
        e_k = e_q
        log_bound = 2.0 * log_sum - log_t
        logit_scale = 1.0 / t
        grad_q = -2.0 * tl.exp2(e_q) / t
        grad_k = 2.0 * tl.exp2(e_q) / t
    e_r = _power_of_two_above(tl.maximum(log_bound, log_b) - 100.0)
    e_a = tl.ceil(0.5 * e_r)
    return (tl.exp2(-e_q), tl.exp2(-e_k), tl.exp2(e_q + e_k - e_r) * logit_scale,
            tl.exp2(e_a), tl.exp2(e_r - e_a), tl.exp2(-e_r), grad_q, grad_k)


@triton.jit
def _ranges(RANGE):
    """(1/c_q, 1/c_k, logit scale, R_a, R_b, 1/R, dq factor, dk factor)."""
    return (tl.load(RANGE), tl.load(RANGE + 1), tl.load(RANGE + 2),
            tl.load(RANGE + 3), tl.load(RANGE + 4), tl.load(RANGE + 5),
            tl.load(RANGE + 6), tl.load(RANGE + 7))


@triton.jit
def _lanes(D, C, BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr):
    """The feature offsets and masks ``(offs_d, offs_c, dmask, cmask)``."""
    offs_d = tl.arange(0, BLOCK_D)
    offs_c = tl.arange(0, BLOCK_C)
    return offs_d, offs_c, offs_d < D, offs_c < C


@triton.jit
def _seed(SEED, DROPOUT: tl.constexpr):
    return tl.load(SEED).to(tl.int32) if DROPOUT else 0


@triton.jit
def _work_item(SCHED, n_items):
    """This program's item and head: ``(item, head, segment or -1, first
    entry, end entry, scratch slot or -1)``."""
    it = tl.program_id(0)
    return (it, tl.program_id(1), tl.load(SCHED + it), tl.load(SCHED + n_items + it),
            tl.load(SCHED + 2 * n_items + it), tl.load(SCHED + 3 * n_items + it))


@triton.jit
def _split_segment(SPLIT, n_split):
    """This program's split segment and head: ``(head, segment or -1, first
    slot, end slot)``."""
    sid = tl.program_id(0)
    return (tl.program_id(1), tl.load(SPLIT + sid), tl.load(SPLIT + n_split + sid),
            tl.load(SPLIT + 2 * n_split + sid))


@triton.jit
def _vector(X, i, h, H, W, offs, wmask):
    """``X[i, h, :W]`` as float32 ``[BLOCK_W]`` (zero padded)."""
    return tl.load(X + (i * H + h) * W + offs, mask=wmask, other=0.0).to(tl.float32)


@triton.jit
def _gather(X, idx, h, H, W, offs, emask, wmask):
    """``X[idx, h, :W]`` as float32 ``[BLOCK_E, BLOCK_W]`` (zero padded)."""
    return tl.load(X + (idx * H + h)[:, None] * W + offs[None, :],
                   mask=emask[:, None] & wmask[None, :], other=0.0).to(tl.float32)


@triton.jit
def _logits(a, b, scale, BIAS, e, h, H, emask, inv_r,
            DOT: tl.constexpr, HAS_BIAS: tl.constexpr):
    """Logits without and with the bias (``[BLOCK_E]``, range units) of the
    points ``a``, ``b`` (broadcast to ``[BLOCK_E, BLOCK_D]``) and their
    difference (the metric gradients' direction)."""
    diff = a - b
    if DOT:
        s0 = tl.sum(a * b, 1) * scale
    else:
        s0 = -tl.sum(diff * diff, 1) * scale
    s = s0
    if HAS_BIAS:
        s += tl.load(BIAS + e * H + h, mask=emask, other=0.0).to(tl.float32) * inv_r
    return s0, s, diff


@triton.jit
def _row_tile(e0, hi, COL, K, BIAS, q, h, H, D, offs_d, dmask, scale, inv_ck, inv_r,
              DOT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_E: tl.constexpr):
    """``BLOCK_E`` edges of a row from ``e0`` (masked at ``hi``): ``(e, emask,
    j, k, s0, s, q - k)`` with the sources ``j``, their keys and logits."""
    e = e0 + tl.arange(0, BLOCK_E)
    emask = e < hi
    j = tl.load(COL + e, mask=emask, other=0).to(tl.int64)
    k = _gather(K, j, h, H, D, offs_d, emask, dmask) * inv_ck
    s0, s, diff = _logits(q[None, :], k, scale, BIAS, e, h, H, emask, inv_r, DOT,
                          HAS_BIAS)
    return e, emask, j, k, s0, s, diff


@triton.jit
def _dropout_scale(seed, e, h, H, p_drop, drop_scale, WIDE: tl.constexpr):
    """``z``: ``1 / (1 - p)`` for a kept edge, 0 for a dropped one."""
    off = e.to(tl.int64) * H + h
    if not WIDE:
        off = off.to(tl.int32)
    return tl.where(tl.rand(seed, off) >= p_drop, drop_scale, 0.0)


@triton.jit
def _row_state(STATS, i, h, H, mask):
    """The saved row state ``(m', log l)`` (``m' = 0`` for rows without edges)."""
    m = tl.load(STATS + (i * H + h) * 2, mask=mask, other=0.0)
    log_l = tl.load(STATS + (i * H + h) * 2 + 1, mask=mask, other=0.0)
    return tl.where(m == float('-inf'), 0.0, m), log_l


@triton.jit
def _probabilities(s, m, log_l, emask, r_a, r_b):
    """The softmax weights recomputed from the row state (0 off the mask)."""
    return tl.where(emask, tl.exp((s - m) * r_a * r_b - log_l), 0.0)


@triton.jit
def _logit_gradient(p, dp, GW, e, h, H, emask, delta, seed, p_drop, drop_scale,
                    HAS_GW: tl.constexpr, DROPOUT: tl.constexpr, WIDE: tl.constexpr):
    """``(ds, p z)`` from ``dp = dout . v``: the weights' own gradient joins
    ``dp``, dropout scales both, ``ds = p (z dp - D_i)``."""
    if HAS_GW:
        dp += tl.load(GW + e * H + h, mask=emask, other=0.0).to(tl.float32)
    pz = p
    if DROPOUT:
        z = _dropout_scale(seed, e, h, H, p_drop, drop_scale, WIDE)
        dp = dp * z
        pz = p * z
    return p * (dp - delta), pz


@triton.jit
def _write_row(OUT, STATS, MEAN, row, h, H, C, offs_c, cmask, m_i, l_i, ms_i, acc,
               NEED_MEAN: tl.constexpr):
    """The row epilogue: ``out = acc / l``, the row state and the mean logit."""
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    inv_l = tl.where(l_i > 0.0, 1.0 / l_safe, 0.0)
    tl.store(OUT + (row * H + h) * C + offs_c, (acc * inv_l).to(OUT.dtype.element_ty),
             mask=cmask)
    tl.store(STATS + (row * H + h) * 2, m_i)
    tl.store(STATS + (row * H + h) * 2 + 1, tl.log(l_safe))
    if NEED_MEAN:
        tl.store(MEAN + row * H + h, ms_i * inv_l)


# ---------------------------------------------------------------- kernels


@triton.jit
def finite_abs_max_kernel(X, n, ABSMAX, BLOCK: tl.constexpr):
    """``ABSMAX = max(ABSMAX, largest finite |X|)`` over one block (atomic): a
    non-finite entry must not rescale everyone else's logits."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    x = tl.abs(tl.load(X + offs, mask=offs < n, other=0.0).to(tl.float32))
    tl.atomic_max(ABSMAX, tl.max(tl.where(x < float('inf'), x, 0.0), 0))



@triton.jit
def forward_kernel(Q, K, V, BIAS, ABSMAX, TS, RANGE, SEED, COL, SCHED, n_items,
                   PART_ML, PART_ACC, OUT, STATS, MEAN, H, D, C, p_drop, drop_scale,
                   DOT: tl.constexpr, HAS_BIAS: tl.constexpr, DROPOUT: tl.constexpr,
                   WIDE: tl.constexpr, NEED_MEAN: tl.constexpr,
                   BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_C: tl.constexpr):
    """Online softmax over one row (chunk): ``out``, the row state, the mean
    logit; a chunk of a split row writes ``(m, l, mean, acc)`` to scratch.
    The first program publishes the range constants to ``RANGE``."""
    it, h, row, lo, hi, slot = _work_item(SCHED, n_items)
    inv_cq, inv_ck, scale, r_a, r_b, inv_r, grad_q, grad_k = _range_constants(
        ABSMAX, TS, D, DOT)
    if (it == 0) & (h == 0):
        tl.store(RANGE, inv_cq)
        tl.store(RANGE + 1, inv_ck)
        tl.store(RANGE + 2, scale)
        tl.store(RANGE + 3, r_a)
        tl.store(RANGE + 4, r_b)
        tl.store(RANGE + 5, inv_r)
        tl.store(RANGE + 6, grad_q)
        tl.store(RANGE + 7, grad_k)
    if row >= 0:
        offs_d, offs_c, dmask, cmask = _lanes(D, C, BLOCK_D, BLOCK_C)
        q = _vector(Q, row, h, H, D, offs_d, dmask) * inv_cq
        seed = _seed(SEED, DROPOUT)
        m_i = tl.full([], float('-inf'), tl.float32)
        l_i = tl.full([], 0.0, tl.float32)
        ms_i = tl.full([], 0.0, tl.float32)
        acc = tl.zeros([BLOCK_C], tl.float32)
        for e0 in range(lo, hi, BLOCK_E):
            e, emask, j, k, s0, s, diff = _row_tile(
                e0, hi, COL, K, BIAS, q, h, H, D, offs_d, dmask, scale, inv_ck,
                inv_r, DOT, HAS_BIAS, BLOCK_E)
            s = tl.where(emask, s, float('-inf'))
            m_new = tl.maximum(m_i, tl.max(s, 0))
            m_use = tl.where(m_new == float('-inf'), 0.0, m_new)
            p = tl.exp((s - m_use) * r_a * r_b)
            corr = tl.exp((m_i - m_use) * r_a * r_b)
            l_i = l_i * corr + tl.sum(p, 0)
            if NEED_MEAN:
                ms_i = ms_i * corr + tl.sum(p * s0, 0)
            if DROPOUT:
                p = p * _dropout_scale(seed, e, h, H, p_drop, drop_scale, WIDE)
            v = _gather(V, j, h, H, C, offs_c, emask, cmask)
            acc = acc * corr + tl.sum(p[:, None] * v, 0)
            m_i = m_new
        if slot < 0:
            _write_row(OUT, STATS, MEAN, row, h, H, C, offs_c, cmask, m_i, l_i, ms_i,
                       acc, NEED_MEAN)
        else:
            tl.store(PART_ML + (slot * H + h) * 3, m_i)
            tl.store(PART_ML + (slot * H + h) * 3 + 1, l_i)
            tl.store(PART_ML + (slot * H + h) * 3 + 2, ms_i)
            tl.store(PART_ACC + (slot * H + h) * C + offs_c, acc, mask=cmask)


@triton.jit
def combine_forward_kernel(SPLIT, n_split, PART_ML, PART_ACC, OUT, STATS, MEAN,
                           RANGE, H, C, NEED_MEAN: tl.constexpr,
                           BLOCK_C: tl.constexpr):
    """Merge the chunks of a split row, in chunk order (flash-decoding)."""
    h, row, lo, hi = _split_segment(SPLIT, n_split)
    if row >= 0:
        offs_c = tl.arange(0, BLOCK_C)
        cmask = offs_c < C
        inv_cq, inv_ck, scale, r_a, r_b, inv_r, grad_q, grad_k = _ranges(RANGE)
        m_i = tl.full([], float('-inf'), tl.float32)
        l_i = tl.full([], 0.0, tl.float32)
        ms_i = tl.full([], 0.0, tl.float32)
        acc = tl.zeros([BLOCK_C], tl.float32)
        for slot in range(lo, hi):
            m_c = tl.load(PART_ML + (slot * H + h) * 3)
            l_c = tl.load(PART_ML + (slot * H + h) * 3 + 1)
            ms_c = tl.load(PART_ML + (slot * H + h) * 3 + 2)
            a_c = _vector(PART_ACC, slot, h, H, C, offs_c, cmask)
            m_new = tl.maximum(m_i, m_c)
            m_use = tl.where(m_new == float('-inf'), 0.0, m_new)
            f_old = tl.exp((m_i - m_use) * r_a * r_b)
            f_new = tl.exp((m_c - m_use) * r_a * r_b)
            l_i = l_i * f_old + l_c * f_new
            ms_i = ms_i * f_old + ms_c * f_new
            acc = acc * f_old + a_c * f_new
            m_i = m_new
        _write_row(OUT, STATS, MEAN, row, h, H, C, offs_c, cmask, m_i, l_i, ms_i, acc,
                   NEED_MEAN)


@triton.jit
def segment_sum_kernel(SPLIT, n_split, PART, OUT, H, W, BLOCK_W: tl.constexpr):
    """``OUT[seg, h, :] =`` the sum of the segment's scratch slots, in order."""
    h, seg, lo, hi = _split_segment(SPLIT, n_split)
    if seg >= 0:
        offs = tl.arange(0, BLOCK_W)
        wmask = offs < W
        acc = tl.zeros([BLOCK_W], tl.float32)
        for slot in range(lo, hi):
            acc += _vector(PART, slot, h, H, W, offs, wmask)
        tl.store(OUT + (seg * H + h) * W + offs, acc.to(OUT.dtype.element_ty),
                 mask=wmask)


@triton.jit
def weights_kernel(Q, K, BIAS, RANGE, SEED, ROW, COL, STATS, WEIGHTS, E, H, D,
                   p_drop, drop_scale,
                   DOT: tl.constexpr, HAS_BIAS: tl.constexpr, DROPOUT: tl.constexpr,
                   WIDE: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr):
    """Edge-parallel: ``weights[e, h] = exp(s_e - lse_row(e)) z_e``."""
    pid = tl.program_id(0)
    h = tl.program_id(1)
    inv_cq, inv_ck, scale, r_a, r_b, inv_r, grad_q, grad_k = _ranges(RANGE)
    e = pid.to(tl.int64) * BLOCK_E + tl.arange(0, BLOCK_E)
    emask = e < E
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    i = tl.load(ROW + e, mask=emask, other=0).to(tl.int64)
    j = tl.load(COL + e, mask=emask, other=0).to(tl.int64)
    q = _gather(Q, i, h, H, D, offs_d, emask, dmask) * inv_cq
    k = _gather(K, j, h, H, D, offs_d, emask, dmask) * inv_ck
    s0, s, diff = _logits(q, k, scale, BIAS, e, h, H, emask, inv_r, DOT, HAS_BIAS)
    m, log_l = _row_state(STATS, i, h, H, emask)
    p = _probabilities(s, m, log_l, emask, r_a, r_b)
    if DROPOUT:
        p = p * _dropout_scale(_seed(SEED, DROPOUT), e, h, H, p_drop, drop_scale,
                               WIDE)
    tl.store(WEIGHTS + e * H + h, p.to(WEIGHTS.dtype.element_ty), mask=emask)


@triton.jit
def backward_rows_kernel(Q, K, V, BIAS, RANGE, SEED, COL, SCHED, n_items, STATS,
                         MEAN, DELTA, DOUT, GW, DQ, PART_DQ, DB, DT_PART, DK, DV,
                         H, D, C, p_drop, drop_scale,
                         DOT: tl.constexpr, HAS_BIAS: tl.constexpr,
                         HAS_GW: tl.constexpr, DROPOUT: tl.constexpr,
                         WIDE: tl.constexpr, NEED_DB: tl.constexpr,
                         NEED_DT: tl.constexpr, ATOMIC_KV: tl.constexpr,
                         BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr,
                         BLOCK_C: tl.constexpr):
    """Over the rows: ``dq``, ``db``, ``dt`` partials (and ``dk``, ``dv`` by
    atomics if ``ATOMIC_KV``)."""
    it, h, row, lo, hi, slot = _work_item(SCHED, n_items)
    if row >= 0:
        offs_d, offs_c, dmask, cmask = _lanes(D, C, BLOCK_D, BLOCK_C)
        inv_cq, inv_ck, scale, r_a, r_b, inv_r, grad_q, grad_k = _ranges(RANGE)
        seed = _seed(SEED, DROPOUT)
        q = _vector(Q, row, h, H, D, offs_d, dmask) * inv_cq
        do = _vector(DOUT, row, h, H, C, offs_c, cmask)
        m, log_l = _row_state(STATS, row, h, H, True)
        delta = tl.load(DELTA + row * H + h)
        s_mean = tl.load(MEAN + row * H + h) if NEED_DT else 0.0
        dq = tl.zeros([BLOCK_D], tl.float32)
        dt = tl.zeros([BLOCK_E], tl.float32)
        for e0 in range(lo, hi, BLOCK_E):
            e, emask, j, k, s0, s, diff = _row_tile(
                e0, hi, COL, K, BIAS, q, h, H, D, offs_d, dmask, scale, inv_ck,
                inv_r, DOT, HAS_BIAS, BLOCK_E)
            p = _probabilities(s, m, log_l, emask, r_a, r_b)
            v = _gather(V, j, h, H, C, offs_c, emask, cmask)
            ds, pz = _logit_gradient(p, tl.sum(do[None, :] * v, 1), GW, e, h, H,
                                     emask, delta, seed, p_drop, drop_scale, HAS_GW,
                                     DROPOUT, WIDE)
            if NEED_DB:
                tl.store(DB + e * H + h, ds.to(DB.dtype.element_ty), mask=emask)
            if NEED_DT:
                dt += ds * (s0 - s_mean)
            if DOT:
                dq += tl.sum(ds[:, None] * k, 0) * grad_q
            else:
                dq += tl.sum(ds[:, None] * diff, 0) * grad_q
            if ATOMIC_KV:
                if DOT:
                    dk = ds[:, None] * q[None, :] * grad_k
                else:
                    dk = ds[:, None] * diff * grad_k
                tl.atomic_add(DK + (j * H + h)[:, None] * D + offs_d[None, :], dk,
                              mask=emask[:, None] & dmask[None, :])
                tl.atomic_add(DV + (j * H + h)[:, None] * C + offs_c[None, :],
                              pz[:, None] * do[None, :],
                              mask=emask[:, None] & cmask[None, :])
        if NEED_DT:
            tl.store(DT_PART + it * H + h, tl.sum(dt, 0))
        if slot < 0:
            tl.store(DQ + (row * H + h) * D + offs_d, dq.to(DQ.dtype.element_ty),
                     mask=dmask)
        else:
            tl.store(PART_DQ + (slot * H + h) * D + offs_d, dq, mask=dmask)


@triton.jit
def backward_columns_kernel(Q, K, V, BIAS, RANGE, SEED, CSC_ROW, CSC_EDGE, SCHED,
                            n_items, STATS, DELTA, DOUT, GW, DK, DV, PART_DK,
                            PART_DV, H, D, C, p_drop, drop_scale,
                            DOT: tl.constexpr, HAS_BIAS: tl.constexpr,
                            HAS_GW: tl.constexpr, DROPOUT: tl.constexpr,
                            WIDE: tl.constexpr, BLOCK_E: tl.constexpr,
                            BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr):
    """Over the transpose (deterministic): ``dk``, ``dv`` of one source (chunk)."""
    it, h, col, lo, hi, slot = _work_item(SCHED, n_items)
    if col >= 0:
        offs_d, offs_c, dmask, cmask = _lanes(D, C, BLOCK_D, BLOCK_C)
        inv_cq, inv_ck, scale, r_a, r_b, inv_r, grad_q, grad_k = _ranges(RANGE)
        seed = _seed(SEED, DROPOUT)
        k = _vector(K, col, h, H, D, offs_d, dmask) * inv_ck
        v = _vector(V, col, h, H, C, offs_c, cmask)
        dk = tl.zeros([BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_C], tl.float32)
        for c0 in range(lo, hi, BLOCK_E):
            ce = c0 + tl.arange(0, BLOCK_E)
            emask = ce < hi
            e = tl.load(CSC_EDGE + ce, mask=emask, other=0)
            i = tl.load(CSC_ROW + ce, mask=emask, other=0)
            q = _gather(Q, i, h, H, D, offs_d, emask, dmask) * inv_cq
            s0, s, diff = _logits(q, k[None, :], scale, BIAS, e, h, H, emask, inv_r,
                                 DOT, HAS_BIAS)
            m, log_l = _row_state(STATS, i, h, H, emask)
            p = _probabilities(s, m, log_l, emask, r_a, r_b)
            do = _gather(DOUT, i, h, H, C, offs_c, emask, cmask)
            delta = tl.load(DELTA + i * H + h, mask=emask, other=0.0)
            ds, pz = _logit_gradient(p, tl.sum(do * v[None, :], 1), GW, e, h, H,
                                     emask, delta, seed, p_drop, drop_scale, HAS_GW,
                                     DROPOUT, WIDE)
            dv += tl.sum(pz[:, None] * do, 0)
            if DOT:
                dk += tl.sum(ds[:, None] * q, 0) * grad_k
            else:
                dk += tl.sum(ds[:, None] * diff, 0) * grad_k
        if slot < 0:
            tl.store(DK + (col * H + h) * D + offs_d, dk.to(DK.dtype.element_ty),
                     mask=dmask)
            tl.store(DV + (col * H + h) * C + offs_c, dv.to(DV.dtype.element_ty),
                     mask=cmask)
        else:
            tl.store(PART_DK + (slot * H + h) * D + offs_d, dk, mask=dmask)
            tl.store(PART_DV + (slot * H + h) * C + offs_c, dv, mask=cmask)


#: Every kernel, by name (for launch counting and the compile check).
KERNELS = {
    'finite_abs_max': finite_abs_max_kernel, 'forward': forward_kernel,
    'combine_forward': combine_forward_kernel,
    'segment_sum': segment_sum_kernel, 'weights': weights_kernel,
    'backward_rows': backward_rows_kernel,
    'backward_columns': backward_columns_kernel,
}
