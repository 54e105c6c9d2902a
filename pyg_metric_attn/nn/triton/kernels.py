r"""The Triton kernels of fused sparse metric-attention.

A program owns one *work item* (a row, a column, or a chunk of a long one:
see :mod:`.schedule`) and one head; grid ``(items, H)``. The kernels are
thin: a prologue, a loop over ``BLOCK_E`` edges built from the ``@triton.jit``
helpers below (each fragment written once), an epilogue. A step launches
:func:`forward_kernel` once and the two backward passes once each; the
merges of split rows and columns (:func:`combine_forward_kernel`,
:func:`segment_sum_kernel`) run only on graphs that have any.

**Forward** (:func:`forward_kernel`). FlashAttention-style online softmax
over a sparse row: load :math:`q_i` once, gather ``[BLOCK_E, D]`` key tiles
by index, form the logits from the *direct* differences :math:`q_i - k_j` in
float32 registers (never the expanded :math:`|q|^2 - 2 q\cdot k + |k|^2`,
whose cancellation loses every digit once points sit ~1e4 from the origin),
keep a running max :math:`m`, a running sum :math:`l` of the *undropped*
probabilities and a float32 accumulator :math:`\sum_j e^{s_{ij}-m} z_{ij}
v_j`. It writes ``out`` and the row state (float32 ``[N_dst, H, 4]``: ``m``,
``log l`` and the row's range exponents below), the only per-row state the
backward needs. Rows without edges, or whose logits are all ``-inf``, give
0, never NaN.

**Backward.** Recompute, do not store: with the saved row state
:math:`p_{ij} = e^{s_{ij} - m_i - \log l_i}` is exact per edge even for split
rows. With :math:`D_i = \sum_c \mathrm{dout}_{ic}\mathrm{out}_{ic}` and
:math:`dp_{ij} = z_{ij}(\mathrm{dout}_i \cdot v_j + g^w_{ij})`,
:math:`ds_{ij} = p_{ij}(dp_{ij} - D_i)`. :func:`backward_rows_kernel` (the
forward's schedule) forms :math:`D_i` (and writes it for the second pass),
writes ``dq``, ``db`` (each edge owned by one program) and per-item partials
of ``dt``; :func:`backward_columns_kernel` runs over the transpose and writes
``dk``, ``dv`` with every sum in a fixed order (bitwise reproducible).
Without the transpose, the rows kernel adds ``dk``, ``dv`` with float32
atomics instead (order depends on scheduling). The CSC pass recomputes
:math:`D` flops per edge (negligible in a memory-bound kernel) where atomics
serialise on hub sources.

**Range.** Logits are float32 registers, yet may lie beyond float32's range
(points near 1e20 give :math:`|q|^2 \sim 10^{40}`), where a row would turn
to NaN or all its weights underflow although its softmax is well defined.
Each row is therefore computed with its own powers of two: its points are
loaded times :math:`1/c_q, 1/c_k`, and its logits and bias are carried in
units of :math:`R = R_a R_b`, so that :math:`p = e^{(s' - m') R_a R_b}` only
ever overflows towards ``-inf`` (a zero weight). The forward pass first runs
a row with all powers 1 while it keeps the largest finite ``|q|``, ``|k|``,
``|b|`` it loads (:func:`_forward_pass`); the powers those imply
(:func:`_exponents`: 1 unless a logit could exceed :math:`2^{100}` or a
point :math:`2^{60}`) are 1 for every ordinary row, whose result is then
final, and otherwise the row runs once more with them. Their exponents join
the row state, where the later kernels read them (:func:`_row_state`,
:func:`_constants`); the chunks of a split row are merged in the largest
units among them. No torch op, no launch and no host sync computes them.

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
def _finite_abs(x):
    """``|x|`` where finite, else 0 (a non-finite entry must not rescale a
    row's other logits)."""
    magnitude = tl.abs(x)
    return tl.where(magnitude < float('inf'), magnitude, 0.0)


@triton.jit
def _exponents(abs_q, abs_k, abs_b, t, D, DOT: tl.constexpr):
    """The range exponents ``(e_q, e_k, e_r)`` of a row from its largest
    finite ``|q|``, ``|k|``, ``|b|`` and the time scale (exponents in float32:
    no product can overflow). Bounds: ``|q_i| <= max|q| sqrt(D)``; logits
    ``(|q| + |k|)^2 / |t|`` (metric) or ``|q| |k| / (sqrt(D) |t|)`` (dot);
    ``c`` keeps points below ``2^60``, ``R`` logits below ``2^100``. Clamped
    so that they pack exactly into the row state."""
    half_log_d = 0.5 * tl.log2(D.to(tl.float32))
    log_q = tl.log2(abs_q) + half_log_d
    log_k = tl.log2(abs_k) + half_log_d
    log_t = tl.log2(tl.abs(t))
    if DOT:
        e_q = _power_of_two_above(log_q - 60.0)
        e_k = _power_of_two_above(log_k - 60.0)
        log_bound = log_q + log_k - half_log_d - log_t
    else:
        top = tl.maximum(log_q, log_k)
        low = tl.minimum(log_q, log_k)
        log_sum = tl.where(top == float('-inf'), top,
                           top + tl.log2(1.0 + tl.exp2(low - top)))
        e_q = _power_of_two_above(log_sum - 60.0)
        e_k = e_q
        log_bound = 2.0 * log_sum - log_t
    e_r = _power_of_two_above(tl.maximum(log_bound, tl.log2(abs_b)) - 100.0)
    return tl.minimum(e_q, 127.0), tl.minimum(e_k, 127.0), tl.minimum(e_r, 1000.0)


@triton.jit
def _units(e_r):
    """``(R_a, R_b)`` with ``R_a R_b = 2^e_r``, each representable."""
    e_a = tl.ceil(0.5 * e_r)
    return tl.exp2(e_a), tl.exp2(e_r - e_a)


@triton.jit
def _constants(e_q, e_k, e_r, t, D, DOT: tl.constexpr):
    """``(1/c_q, 1/c_k, logit scale, R_a, R_b, 1/R, dq factor, dk factor)``
    of the exponents (scalars, or one per edge)."""
    if DOT:
        logit_scale = 1.0 / (tl.sqrt(D.to(tl.float32)) * t)
        grad_q = tl.exp2(e_k) * logit_scale
        grad_k = tl.exp2(e_q) * logit_scale
    else:
        logit_scale = 1.0 / t
        grad_q = -2.0 * tl.exp2(e_q) / t
        grad_k = 2.0 * tl.exp2(e_q) / t
    r_a, r_b = _units(e_r)
    return (tl.exp2(-e_q), tl.exp2(-e_k), tl.exp2(e_q + e_k - e_r) * logit_scale,
            r_a, r_b, tl.exp2(-e_r), grad_q, grad_k)


@triton.jit
def _unpack(packed):
    """``(e_q, e_k)`` from ``e_q + 128 e_k`` (small integers: exact)."""
    e_k = tl.floor(packed / 128.0)
    return packed - 128.0 * e_k, e_k


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
def _dropout_scale(seed, e, h, H, p_drop, drop_scale, WIDE: tl.constexpr):
    """``z``: ``1 / (1 - p)`` for a kept edge, 0 for a dropped one."""
    off = e.to(tl.int64) * H + h
    if not WIDE:
        off = off.to(tl.int32)
    return tl.where(tl.rand(seed, off) >= p_drop, drop_scale, 0.0)


@triton.jit
def _row_state(STATS, i, h, H, mask):
    """The saved state of rows ``i`` (a scalar, or one per edge): ``(m',
    log l, e_q, e_k, e_r)`` (``m' = 0`` for rows without edges)."""
    state = STATS + (i * H + h) * 4
    m = tl.load(state, mask=mask, other=0.0)
    log_l = tl.load(state + 1, mask=mask, other=0.0)
    e_q, e_k = _unpack(tl.load(state + 2, mask=mask, other=0.0))
    return (tl.where(m == float('-inf'), 0.0, m), log_l, e_q, e_k,
            tl.load(state + 3, mask=mask, other=0.0))


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
def _forward_pass(lo, hi, COL, K, V, BIAS, q_raw, h, H, D, C, offs_d, offs_c,
                  dmask, cmask, e_q, e_k, e_r, t, seed, p_drop, drop_scale,
                  DOT: tl.constexpr, HAS_BIAS: tl.constexpr,
                  DROPOUT: tl.constexpr, WIDE: tl.constexpr,
                  NEED_MEAN: tl.constexpr, BLOCK_E: tl.constexpr,
                  BLOCK_C: tl.constexpr):
    """The online softmax over edges ``[lo, hi)`` of a row in the units of
    the exponents: ``(m', l, mean numerator, acc)`` and the largest finite
    ``|k|`` and ``|b|`` loaded."""
    inv_cq, inv_ck, scale, r_a, r_b, inv_r, grad_q, grad_k = _constants(
        e_q, e_k, e_r, t, D, DOT)
    q = q_raw * inv_cq
    m_i = tl.full([], float('-inf'), tl.float32)
    l_i = tl.zeros([], tl.float32)
    ms_i = tl.zeros([], tl.float32)
    acc = tl.zeros([BLOCK_C], tl.float32)
    k_max = tl.zeros([], tl.float32)
    b_max = tl.zeros([], tl.float32)
    for e0 in range(lo, hi, BLOCK_E):
        e = e0 + tl.arange(0, BLOCK_E)
        emask = e < hi
        j = tl.load(COL + e, mask=emask, other=0).to(tl.int64)
        k = _gather(K, j, h, H, D, offs_d, emask, dmask)
        k_max = tl.maximum(k_max, tl.max(tl.max(_finite_abs(k), 1), 0))
        s0, s, diff = _logits(q[None, :], k * inv_ck, scale, BIAS, e, h, H, emask,
                              inv_r, DOT, HAS_BIAS)
        if HAS_BIAS:  # the bias as it entered the logits (R = 1 in a first pass)
            b_max = tl.maximum(b_max, tl.max(_finite_abs(s - s0), 0))
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
    return m_i, l_i, ms_i, acc, k_max, b_max


@triton.jit
def _write_row(OUT, STATS, MEAN, row, h, H, C, offs_c, cmask, m_i, l_i, ms_i, acc,
               e_q, e_k, e_r, NEED_MEAN: tl.constexpr):
    """The row epilogue: ``out = acc / l``, the row state and the mean logit."""
    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    inv_l = tl.where(l_i > 0.0, 1.0 / l_safe, 0.0)
    tl.store(OUT + (row * H + h) * C + offs_c, (acc * inv_l).to(OUT.dtype.element_ty),
             mask=cmask)
    state = STATS + (row * H + h) * 4
    tl.store(state, m_i)
    tl.store(state + 1, tl.log(l_safe))
    tl.store(state + 2, e_q + 128.0 * e_k)
    tl.store(state + 3, e_r)
    if NEED_MEAN:
        tl.store(MEAN + row * H + h, ms_i * inv_l)


# ---------------------------------------------------------------- kernels


@triton.jit
def forward_kernel(Q, K, V, BIAS, TS, SEED, COL, SCHED, n_items, PART_ML,
                   PART_ACC, OUT, STATS, MEAN, H, D, C, p_drop, drop_scale,
                   DOT: tl.constexpr, HAS_BIAS: tl.constexpr, DROPOUT: tl.constexpr,
                   WIDE: tl.constexpr, NEED_MEAN: tl.constexpr,
                   BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_C: tl.constexpr):
    """Online softmax over one row (chunk): ``out``, the row state, the mean
    logit; a chunk of a split row writes ``(m, l, mean, exponents)`` and its
    accumulator to scratch. A row whose points or logits leave float32's
    comfortable range runs a second time in its own units (module notes)."""
    it, h, row, lo, hi, slot = _work_item(SCHED, n_items)
    if row >= 0:
        offs_d, offs_c, dmask, cmask = _lanes(D, C, BLOCK_D, BLOCK_C)
        t = tl.load(TS)
        seed = _seed(SEED, DROPOUT)
        q = _vector(Q, row, h, H, D, offs_d, dmask)
        e_q = tl.zeros([], tl.float32)
        e_k = tl.zeros([], tl.float32)
        e_r = tl.zeros([], tl.float32)
        m_i, l_i, ms_i, acc, k_max, b_max = _forward_pass(
            lo, hi, COL, K, V, BIAS, q, h, H, D, C, offs_d, offs_c, dmask, cmask,
            e_q, e_k, e_r, t, seed, p_drop, drop_scale, DOT, HAS_BIAS, DROPOUT,
            WIDE, NEED_MEAN, BLOCK_E, BLOCK_C)
        e_q, e_k, e_r = _exponents(tl.max(_finite_abs(q), 0), k_max, b_max, t, D,
                                   DOT)
        if e_q + e_k + e_r > 0.0:
            m_i, l_i, ms_i, acc, k_max, b_max = _forward_pass(
                lo, hi, COL, K, V, BIAS, q, h, H, D, C, offs_d, offs_c, dmask,
                cmask, e_q, e_k, e_r, t, seed, p_drop, drop_scale, DOT, HAS_BIAS,
                DROPOUT, WIDE, NEED_MEAN, BLOCK_E, BLOCK_C)
        if slot < 0:
            _write_row(OUT, STATS, MEAN, row, h, H, C, offs_c, cmask, m_i, l_i, ms_i,
                       acc, e_q, e_k, e_r, NEED_MEAN)
        else:
            part = PART_ML + (slot * H + h) * 5
            tl.store(part, m_i)
            tl.store(part + 1, l_i)
            tl.store(part + 2, ms_i)
            tl.store(part + 3, e_q + 128.0 * e_k)
            tl.store(part + 4, e_r)
            tl.store(PART_ACC + (slot * H + h) * C + offs_c, acc, mask=cmask)


@triton.jit
def combine_forward_kernel(SPLIT, n_split, PART_ML, PART_ACC, OUT, STATS, MEAN,
                           H, C, NEED_MEAN: tl.constexpr, BLOCK_C: tl.constexpr):
    """Merge the chunks of a split row, in chunk order (flash-decoding), in
    the largest units among them."""
    h, row, lo, hi = _split_segment(SPLIT, n_split)
    if row >= 0:
        offs_c = tl.arange(0, BLOCK_C)
        cmask = offs_c < C
        e_q = tl.zeros([], tl.float32)
        e_k = tl.zeros([], tl.float32)
        e_r = tl.zeros([], tl.float32)
        for slot in range(lo, hi):
            part = PART_ML + (slot * H + h) * 5
            e_q_c, e_k_c = _unpack(tl.load(part + 3))
            e_q = tl.maximum(e_q, e_q_c)
            e_k = tl.maximum(e_k, e_k_c)
            e_r = tl.maximum(e_r, tl.load(part + 4))
        r_a, r_b = _units(e_r)
        m_i = tl.full([], float('-inf'), tl.float32)
        l_i = tl.zeros([], tl.float32)
        ms_i = tl.zeros([], tl.float32)
        acc = tl.zeros([BLOCK_C], tl.float32)
        for slot in range(lo, hi):
            part = PART_ML + (slot * H + h) * 5
            to_row = tl.exp2(tl.load(part + 4) - e_r)  # chunk units -> row units
            m_c = tl.load(part) * to_row
            l_c = tl.load(part + 1)
            ms_c = tl.load(part + 2) * to_row
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
                   e_q, e_k, e_r, NEED_MEAN)


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
def weights_kernel(Q, K, BIAS, TS, SEED, ROW, COL, STATS, WEIGHTS, E, H, D,
                   p_drop, drop_scale,
                   DOT: tl.constexpr, HAS_BIAS: tl.constexpr, DROPOUT: tl.constexpr,
                   WIDE: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr):
    """Edge-parallel: ``weights[e, h] = exp(s_e - lse_row(e)) z_e``."""
    pid = tl.program_id(0)
    h = tl.program_id(1)
    e = pid.to(tl.int64) * BLOCK_E + tl.arange(0, BLOCK_E)
    emask = e < E
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    i = tl.load(ROW + e, mask=emask, other=0).to(tl.int64)
    j = tl.load(COL + e, mask=emask, other=0).to(tl.int64)
    m, log_l, e_q, e_k, e_r = _row_state(STATS, i, h, H, emask)
    inv_cq, inv_ck, scale, r_a, r_b, inv_r, grad_q, grad_k = _constants(
        e_q, e_k, e_r, tl.load(TS), D, DOT)
    q = _gather(Q, i, h, H, D, offs_d, emask, dmask) * inv_cq[:, None]
    k = _gather(K, j, h, H, D, offs_d, emask, dmask) * inv_ck[:, None]
    s0, s, diff = _logits(q, k, scale, BIAS, e, h, H, emask, inv_r, DOT, HAS_BIAS)
    p = _probabilities(s, m, log_l, emask, r_a, r_b)
    if DROPOUT:
        p = p * _dropout_scale(_seed(SEED, DROPOUT), e, h, H, p_drop, drop_scale,
                               WIDE)
    tl.store(WEIGHTS + e * H + h, p.to(WEIGHTS.dtype.element_ty), mask=emask)


@triton.jit
def backward_rows_kernel(Q, K, V, BIAS, TS, SEED, COL, SCHED, n_items, STATS,
                         MEAN, OUT, DOUT, GW, GW_DELTA, DELTA, DQ, PART_DQ, DB,
                         DT_PART, DK, DV, H, D, C, p_drop, drop_scale,
                         DOT: tl.constexpr, HAS_BIAS: tl.constexpr,
                         HAS_GW: tl.constexpr, DROPOUT: tl.constexpr,
                         WIDE: tl.constexpr, NEED_DB: tl.constexpr,
                         NEED_DT: tl.constexpr, ATOMIC_KV: tl.constexpr,
                         BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr,
                         BLOCK_C: tl.constexpr):
    """Over the rows: :math:`D_i` (written to ``DELTA`` for the columns
    pass), ``dq``, ``db``, ``dt`` partials (float64, in logit units, over
    ``-t``; 0 for an idle item) and ``dk``, ``dv`` by atomics if
    ``ATOMIC_KV``."""
    it, h, row, lo, hi, slot = _work_item(SCHED, n_items)
    dt_item = tl.zeros([], tl.float64)
    if row >= 0:
        offs_d, offs_c, dmask, cmask = _lanes(D, C, BLOCK_D, BLOCK_C)
        t = tl.load(TS)
        m, log_l, e_q, e_k, e_r = _row_state(STATS, row, h, H, True)
        inv_cq, inv_ck, scale, r_a, r_b, inv_r, grad_q, grad_k = _constants(
            e_q, e_k, e_r, t, D, DOT)
        seed = _seed(SEED, DROPOUT)
        q = _vector(Q, row, h, H, D, offs_d, dmask) * inv_cq
        do = _vector(DOUT, row, h, H, C, offs_c, cmask)
        delta = tl.sum(do * _vector(OUT, row, h, H, C, offs_c, cmask), 0)
        if HAS_GW:  # the weights' gradient enters through sum_j g_ij w_ij
            delta += tl.load(GW_DELTA + row * H + h)
        tl.store(DELTA + row * H + h, delta)
        s_mean = tl.load(MEAN + row * H + h) if NEED_DT else 0.0
        dq = tl.zeros([BLOCK_D], tl.float32)
        dt = tl.zeros([BLOCK_E], tl.float32)
        for e0 in range(lo, hi, BLOCK_E):
            e = e0 + tl.arange(0, BLOCK_E)
            emask = e < hi
            j = tl.load(COL + e, mask=emask, other=0).to(tl.int64)
            k = _gather(K, j, h, H, D, offs_d, emask, dmask) * inv_ck
            s0, s, diff = _logits(q[None, :], k, scale, BIAS, e, h, H, emask,
                                  inv_r, DOT, HAS_BIAS)
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
        if NEED_DT:  # ds (s0' - mean') in units R: times R, over -t
            dt_item = (tl.sum(dt, 0).to(tl.float64) * r_a.to(tl.float64)
                       * r_b.to(tl.float64) / -t.to(tl.float64))
        if slot < 0:
            tl.store(DQ + (row * H + h) * D + offs_d, dq.to(DQ.dtype.element_ty),
                     mask=dmask)
        else:
            tl.store(PART_DQ + (slot * H + h) * D + offs_d, dq, mask=dmask)
    if NEED_DT:
        tl.store(DT_PART + it * H + h, dt_item)


@triton.jit
def backward_columns_kernel(Q, K, V, BIAS, TS, SEED, CSC_ROW, CSC_EDGE, SCHED,
                            n_items, STATS, DELTA, DOUT, GW, DK, DV, PART_DK,
                            PART_DV, H, D, C, p_drop, drop_scale,
                            DOT: tl.constexpr, HAS_BIAS: tl.constexpr,
                            HAS_GW: tl.constexpr, DROPOUT: tl.constexpr,
                            WIDE: tl.constexpr, BLOCK_E: tl.constexpr,
                            BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr):
    """Over the transpose (deterministic): ``dk``, ``dv`` of one source
    (chunk); every edge in the units of its row."""
    it, h, col, lo, hi, slot = _work_item(SCHED, n_items)
    if col >= 0:
        offs_d, offs_c, dmask, cmask = _lanes(D, C, BLOCK_D, BLOCK_C)
        t = tl.load(TS)
        seed = _seed(SEED, DROPOUT)
        k_raw = _vector(K, col, h, H, D, offs_d, dmask)
        v = _vector(V, col, h, H, C, offs_c, cmask)
        dk = tl.zeros([BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_C], tl.float32)
        for c0 in range(lo, hi, BLOCK_E):
            ce = c0 + tl.arange(0, BLOCK_E)
            emask = ce < hi
            e = tl.load(CSC_EDGE + ce, mask=emask, other=0)
            i = tl.load(CSC_ROW + ce, mask=emask, other=0)
            m, log_l, e_q, e_k, e_r = _row_state(STATS, i, h, H, emask)
            inv_cq, inv_ck, scale, r_a, r_b, inv_r, grad_q, grad_k = _constants(
                e_q, e_k, e_r, t, D, DOT)
            q = _gather(Q, i, h, H, D, offs_d, emask, dmask) * inv_cq[:, None]
            s0, s, diff = _logits(q, k_raw[None, :] * inv_ck[:, None], scale,
                                  BIAS, e, h, H, emask, inv_r, DOT, HAS_BIAS)
            p = _probabilities(s, m, log_l, emask, r_a, r_b)
            do = _gather(DOUT, i, h, H, C, offs_c, emask, cmask)
            delta = tl.load(DELTA + i * H + h, mask=emask, other=0.0)
            ds, pz = _logit_gradient(p, tl.sum(do * v[None, :], 1), GW, e, h, H,
                                     emask, delta, seed, p_drop, drop_scale, HAS_GW,
                                     DROPOUT, WIDE)
            dv += tl.sum(pz[:, None] * do, 0)
            if DOT:
                dk += tl.sum((ds * grad_k)[:, None] * q, 0)
            else:
                dk += tl.sum((ds * grad_k)[:, None] * diff, 0)
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
    'forward': forward_kernel, 'combine_forward': combine_forward_kernel,
    'segment_sum': segment_sum_kernel, 'weights': weights_kernel,
    'backward_rows': backward_rows_kernel,
    'backward_columns': backward_columns_kernel,
}
