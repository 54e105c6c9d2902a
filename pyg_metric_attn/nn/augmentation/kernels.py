r"""The Triton kernels of the fused augmentation (:mod:`..augmentation`).

Points are ``[B, H, L, D]`` tensors with any strides; one ``(b, h)`` is one
softmax, with its own centre. Sums run in ``ACC`` (float64 for float64
points, else float32).

**Statistics** (:func:`statistics_kernel`, grid ``(B H, S)``). Split ``s``
of the keys of ``(b, h)`` loops over its tiles of ``BLOCK_L`` keys and keeps
the summary of its *counted* keys (finite coordinate sum in the key dtype,
and attended where there is a mask): their count :math:`n`, mean :math:`m`,
sum of squared distances to the mean :math:`M_2 = \sum_j \|k_j - m\|^2`
(tiles pooled and merged by Chan et al.'s formulas, so no sum of large
squares cancels) and largest :math:`|k_{jd}|`. It writes them to
``PART[bh, s] = (n, M_2, max, m_0 .. m_{D-1})``.

**Augmentation** (:func:`augment_kernel`, grid ``(B H, query tiles + key
tiles)``). Every program pools the ``S`` summaries of its ``(b, h)`` (the same
code in the same order: every program gets the same centre) into the centre
:math:`c = m` (16-bit keys: rounded to a multiple of the grid :math:`2^{\lfloor
\log_2 \max|k|\rfloor}\,\varepsilon`, with :math:`\log_2` rounded to the key
dtype as :func:`~pyg_metric_attn.nn.logits.centred` does) and the key-norm
shift :math:`\sigma = (M_2 + n \|m - c\|^2) / L`, the mean over the ``L``
keys of the counted keys' :math:`\|k_j - c\|^2` (0 where it overflows). Then
it writes a tile of :math:`q' = [q - c, -\tfrac12, 0 ..]` or of :math:`k' =
[\tilde k, \|\tilde k\|^2 - \sigma, 0 ..]` with :math:`\tilde k = k - c`
rounded to the key dtype (0 for a key no query attends to), ``W`` columns.

**The check** (``CHECK``: the ``'checked'`` precision policy,
:func:`~pyg_metric_attn.nn.logits.needs_exact` in three launches' worth of
work instead of a score of torch ops). The statistics pass zeroes
``NORMS[bh] = (max |q - c|, max |k~|)``, the augmentation adds every tile's
largest norm of the centred points it writes (atomic max; a NaN row counts
as 0, an infinite one as infinite), and :func:`decide_kernel` (grid ``(B
H,)``) turns them into the flag of every softmax, :math:`\neg(u \sqrt{D}
(\max\|q\| + \max\|k\|)^2 / |t| \le \mathrm{tolerance})`, and zeroes the
flagged softmaxes' :math:`q'` and :math:`k'`, so that the fused attention
and its backward stay finite where the exact correction takes over.

**Backward** (:func:`augment_backward_kernel`, the same grid). Elementwise:
:math:`dq = dq'_{:D}` and :math:`dk = dk'_{:D} + 2 \tilde k\, dk'_D` (0 for
an unattended key), :math:`\tilde k` read back from :math:`k'`; the centre
and the shift are constants.

**Bounds.** Every load and store is masked by ``rows < L`` and the lane
masks; the grid never exceeds the tiles, and offsets are int64.

This module decorates with ``triton.jit`` at import, which reads
``TRITON_INTERPRET``: it is imported on the first launch.
"""
import triton
import triton.language as tl


@triton.jit
def _offsets(b, h, rows, lanes, stride_b, stride_h, stride_l, stride_d):
    """Element offsets ``[BLOCK_L, BLOCK]`` of ``X[b, h, rows, lanes]``."""
    return (b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
            + rows.to(tl.int64)[:, None] * stride_l + lanes[None, :] * stride_d)


@triton.jit
def _program(H, D, BLOCK: tl.constexpr):
    """This program's ``(b H + h, tile or split, b, h, lanes, lanes < D)``."""
    bh = tl.program_id(0)
    lanes = tl.arange(0, BLOCK)
    return bh, tl.program_id(1), bh // H, bh % H, lanes, lanes < D


@triton.jit
def _load_rows(X, b, h, rows, lanes, dmask, length, stride_b, stride_h, stride_l,
               stride_d):
    """``X[b, h, rows, lanes]`` (0 outside ``rows < length``, ``dmask``) and
    the rows' mask."""
    rmask = rows < length
    return tl.load(X + _offsets(b, h, rows, lanes, stride_b, stride_h, stride_l,
                                stride_d),
                   mask=rmask[:, None] & dmask[None, :], other=0.0), rmask


@triton.jit
def _store_rows(OUT, values, bh, rows, rmask, lanes, length, width):
    """``values`` into ``rows`` of the contiguous ``OUT [B H, length, width]``."""
    tl.store(OUT + (bh.to(tl.int64) * length + rows)[:, None] * width
             + lanes[None, :], values.to(OUT.dtype.element_ty),
             mask=rmask[:, None] & (lanes < width)[None, :])


@triton.jit
def _attended(ATT, b, h, rows, rmask, stride_b, stride_h, stride_l,
              HAS_MASK: tl.constexpr):
    """Whether a query may attend to each key of ``rows`` (all rows in range
    without a mask)."""
    if HAS_MASK:
        att = tl.load(ATT + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
                      + rows.to(tl.int64) * stride_l, mask=rmask, other=0)
        return rmask & (att != 0)
    return rmask


@triton.jit
def _pool(counts, means, m2s):
    """Summaries ``(count [R], mean [R, BLOCK], M_2 [R])`` pooled into one
    ``(n, m, M_2)``; rows with count 0 must have mean 0."""
    n = tl.sum(counts, 0)
    mean = tl.sum(counts[:, None] * means, 0) / tl.maximum(n, 1.0)
    gap = means - mean[None, :]
    return n, mean, tl.sum(m2s, 0) + tl.sum(counts * tl.sum(gap * gap, 1), 0)


@triton.jit
def _merge(n_a, mean_a, m2_a, n_b, mean_b, m2_b):
    """Two summaries ``(n, m, M_2)`` merged into one."""
    n = n_a + n_b
    weight = n_b / tl.maximum(n, 1.0)
    gap = mean_b - mean_a
    return n, mean_a + gap * weight, m2_a + m2_b + tl.sum(gap * gap, 0) * n_a * weight


@triton.jit
def statistics_kernel(K, ATT, PART, NORMS, stride_kb, stride_kh, stride_kl,
                      stride_kd, stride_ab, stride_ah, stride_al, H, L, D,
                      tiles_per_split, HAS_MASK: tl.constexpr,
                      CHECK: tl.constexpr, ACC: tl.constexpr,
                      BLOCK_L: tl.constexpr, BLOCK_D: tl.constexpr):
    """The summary of split ``s`` of the counted keys of ``(b, h)``:
    ``PART[bh, s] = (n, M_2, max |k|, mean)``; with ``CHECK`` split 0 also
    zeroes ``NORMS[bh]``."""
    bh, split, b, h, lanes, dmask = _program(H, D, BLOCK_D)
    if CHECK and split == 0:
        tl.store(NORMS + 2 * bh + tl.arange(0, 2), tl.zeros([2], tl.float32))
    n = tl.zeros([], ACC)
    mean = tl.zeros([BLOCK_D], ACC)
    m2 = tl.zeros([], ACC)
    largest = tl.zeros([], ACC)
    for tile in range(tiles_per_split):
        rows = (split * tiles_per_split + tile) * BLOCK_L + tl.arange(0, BLOCK_L)
        k, rmask = _load_rows(K, b, h, rows, lanes, dmask, L, stride_kb, stride_kh,
                              stride_kl, stride_kd)
        # A key counts where its coordinate sum is finite in the key dtype.
        total = tl.sum(k.to(ACC), 1).to(K.dtype.element_ty).to(ACC)
        counted = _attended(ATT, b, h, rows, rmask, stride_ab, stride_ah,
                            stride_al, HAS_MASK) & (tl.abs(total) < float('inf'))
        kept = tl.where(counted[:, None], k.to(ACC), 0.0)
        largest = tl.maximum(largest, tl.max(tl.max(tl.abs(kept), 1), 0))
        tile_n, tile_mean, tile_m2 = _pool(counted.to(ACC), kept,
                                           tl.zeros([BLOCK_L], ACC))
        n, mean, m2 = _merge(n, mean, m2, tile_n, tile_mean, tile_m2)
    part = PART + (bh * tl.num_programs(1) + split).to(tl.int64) * (3 + D)
    tl.store(part, n)
    tl.store(part + 1, m2)
    tl.store(part + 2, largest)
    tl.store(part + 3 + lanes, mean, mask=dmask)


@triton.jit
def _centre(PART, bh, n_splits, D, L, lanes, tiny, eps, KEY_DTYPE: tl.constexpr,
            ROUND: tl.constexpr, ACC: tl.constexpr, BLOCK_S: tl.constexpr):
    """The centre of ``(b, h)`` (``[BLOCK]`` lanes, 0 from ``D`` on; in the
    key dtype, held in ``ACC``) and the key-norm shift, from its summaries."""
    splits = tl.arange(0, BLOCK_S)
    smask = splits < n_splits
    part = PART + (bh * n_splits + splits).to(tl.int64) * (3 + D)
    counts = tl.load(part, mask=smask, other=0.0)
    m2s = tl.load(part + 1, mask=smask, other=0.0)
    largest = tl.max(tl.load(part + 2, mask=smask, other=0.0), 0)
    means = tl.load(part[:, None] + 3 + lanes[None, :],
                    mask=smask[:, None] & (lanes < D)[None, :], other=0.0)
    n, mean, m2 = _pool(counts, means, m2s)
    centre = mean
    if ROUND:  # to a multiple of 2^e eps (scaled first: no subnormal divisor)
        e = tl.floor(tl.log2(tl.maximum(largest, tiny).to(tl.float32))
                     .to(KEY_DTYPE).to(tl.float32))
        centre = tl.floor(mean * (tl.exp2(-e) / eps) + 0.5) * (tl.exp2(e) * eps)
    centre = centre.to(KEY_DTYPE).to(ACC)
    gap = mean - centre
    shift = (m2 + n * tl.sum(gap * gap, 0)) / L
    return centre, tl.where(tl.abs(shift) < float('inf'), shift, 0.0)


@triton.jit
def augment_kernel(Q, K, ATT, PART, QA, KA, NORMS, stride_qb, stride_qh,
                   stride_ql, stride_qd, stride_kb, stride_kh, stride_kl,
                   stride_kd, stride_ab, stride_ah, stride_al, H, LQ, LK, D, W,
                   n_splits, query_tiles, tiny, eps,
                   HAS_MASK: tl.constexpr, CHECK: tl.constexpr,
                   ROUND: tl.constexpr, ACC: tl.constexpr,
                   BLOCK_L: tl.constexpr, BLOCK_W: tl.constexpr,
                   BLOCK_S: tl.constexpr):
    """One tile of ``q'`` (tiles ``< query_tiles``) or of ``k'``; with
    ``CHECK`` its largest norm of the centred points joins ``NORMS``."""
    bh, tile, b, h, lanes, dmask = _program(H, D, BLOCK_W)
    key_dtype = K.dtype.element_ty
    centre, shift = _centre(PART, bh, n_splits, D, LK, lanes, tiny, eps, key_dtype,
                            ROUND, ACC, BLOCK_S)
    if tile < query_tiles:
        rows = tile * BLOCK_L + tl.arange(0, BLOCK_L)
        q, rmask = _load_rows(Q, b, h, rows, lanes, dmask, LQ, stride_qb, stride_qh,
                              stride_ql, stride_qd)
        shifted = (q.to(ACC) - centre[None, :]).to(key_dtype).to(ACC)
        extra = tl.where(lanes == D, -0.5, 0.0).to(ACC)
        _store_rows(QA, tl.where(dmask[None, :], shifted, extra[None, :]), bh, rows,
                    rmask, lanes, LQ, W)
        if CHECK:
            _largest_norm(NORMS + 2 * bh, tl.sum(shifted * shifted, 1), rmask)
    else:
        rows = (tile - query_tiles) * BLOCK_L + tl.arange(0, BLOCK_L)
        k, rmask = _load_rows(K, b, h, rows, lanes, dmask, LK, stride_kb, stride_kh,
                              stride_kl, stride_kd)
        attended = _attended(ATT, b, h, rows, rmask, stride_ab, stride_ah,
                             stride_al, HAS_MASK)
        shifted = (k.to(ACC) - centre[None, :]).to(key_dtype).to(ACC)
        shifted = tl.where(attended[:, None] & dmask[None, :], shifted, 0.0)
        squares = tl.sum(shifted * shifted, 1)
        norm = squares - shift
        _store_rows(KA, tl.where(dmask[None, :], shifted,
                                 tl.where(lanes[None, :] == D, norm[:, None], 0.0)),
                    bh, rows, rmask, lanes, LK, W)
        if CHECK:
            _largest_norm(NORMS + 2 * bh + 1, squares, rmask)


@triton.jit
def _largest_norm(NORM, squares, rmask):
    """``NORM = max(NORM, the largest norm of the rows)`` (float32, atomic),
    from the rows' squared norms: NaN rows count as 0."""
    norms = tl.sqrt(squares.to(tl.float32))
    norms = tl.where(rmask & (norms == norms), norms, 0.0)
    tl.atomic_max(NORM, tl.max(norms, 0))


@triton.jit
def decide_kernel(NORMS, TS, FLAGS, QA, KA, stride_tb, stride_th, H, LQ, LK, W,
                  error_scale, tolerance, BLOCK_L: tl.constexpr,
                  BLOCK_W: tl.constexpr):
    r"""The flag of softmax ``(b, h)`` (:obj:`True` where the fused logits
    would round by more than ``tolerance``: ``error_scale`` is the unit
    roundoff times :math:`\sqrt{D}`), and where it is set, its ``q'`` and
    ``k'`` zeroed."""
    bh = tl.program_id(0)
    b = bh // H
    h = bh % H
    largest = (tl.load(NORMS + 2 * bh).to(tl.float64)
               + tl.load(NORMS + 2 * bh + 1).to(tl.float64))
    t = tl.load(TS + b.to(tl.int64) * stride_tb + h.to(tl.int64) * stride_th)
    error = error_scale * largest * largest / tl.abs(t.to(tl.float64))
    flagged = ~(error <= tolerance)  # NaN: flagged
    tl.store(FLAGS + bh, flagged.to(tl.uint8))
    if flagged:
        lanes = tl.arange(0, BLOCK_W)
        for start in range(0, LQ, BLOCK_L):
            rows = start + tl.arange(0, BLOCK_L)
            _store_rows(QA, tl.zeros([BLOCK_L, BLOCK_W], tl.float32), bh, rows,
                        rows < LQ, lanes, LQ, W)
        for start in range(0, LK, BLOCK_L):
            rows = start + tl.arange(0, BLOCK_L)
            _store_rows(KA, tl.zeros([BLOCK_L, BLOCK_W], tl.float32), bh, rows,
                        rows < LK, lanes, LK, W)


@triton.jit
def augment_backward_kernel(GQA, GKA, KA, ATT, DQ, DK, stride_gqb, stride_gqh,
                            stride_gql, stride_gqw, stride_gkb, stride_gkh,
                            stride_gkl, stride_gkw, stride_kb, stride_kh,
                            stride_kl, stride_kw, stride_ab, stride_ah,
                            stride_al, H, LQ, LK, D, query_tiles,
                            HAS_MASK: tl.constexpr, ACC: tl.constexpr,
                            BLOCK_L: tl.constexpr, BLOCK_W: tl.constexpr):
    """One tile of ``dq`` (tiles ``< query_tiles``) or of ``dk``, written
    contiguous ``[B H, L, D]``."""
    bh, tile, b, h, lanes, dmask = _program(H, D, BLOCK_W)
    if tile < query_tiles:
        rows = tile * BLOCK_L + tl.arange(0, BLOCK_L)
        grad_query, rmask = _load_rows(GQA, b, h, rows, lanes, dmask, LQ,
                                       stride_gqb, stride_gqh, stride_gql,
                                       stride_gqw)
        _store_rows(DQ, grad_query, bh, rows, rmask, lanes, LQ, D)
    else:
        rows = (tile - query_tiles) * BLOCK_L + tl.arange(0, BLOCK_L)
        grad, rmask = _load_rows(GKA, b, h, rows, lanes, lanes <= D, LK, stride_gkb,
                                 stride_gkh, stride_gkl, stride_gkw)
        shifted, _ = _load_rows(KA, b, h, rows, lanes, dmask, LK, stride_kb,
                                stride_kh, stride_kl, stride_kw)
        grad_norm = tl.sum(tl.where(lanes[None, :] == D, grad.to(ACC), 0.0), 1)
        grad = grad.to(ACC) + 2.0 * shifted.to(ACC) * grad_norm[:, None]
        attended = _attended(ATT, b, h, rows, rmask, stride_ab, stride_ah,
                             stride_al, HAS_MASK)
        _store_rows(DK, tl.where(attended[:, None], grad, 0.0), bh, rows, rmask,
                    lanes, LK, D)


#: Every kernel, by name (the launcher reads them here: a launch counter may
#: wrap them in place).
KERNELS = {
    'augment_statistics': statistics_kernel, 'augment': augment_kernel,
    'augment_decide': decide_kernel, 'augment_backward': augment_backward_kernel,
}
