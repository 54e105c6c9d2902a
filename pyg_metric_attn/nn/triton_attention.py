r"""Fused sparse metric-attention in Triton: one pass per direction over a CSR graph.

:func:`triton_metric_attention` computes, for every destination row :math:`i`
of a destination-sorted CSR graph and every head,

.. math::
    s_{ij} = -\|q_i - k_j\|^2 / t + b_{ij} \quad(\texttt{'metric'},
    \texttt{'l2'}), \qquad
    s_{ij} = q_i \cdot k_j / (\sqrt{D}\, t) + b_{ij} \quad(\texttt{'dot'}),

    \alpha_{ij} = \mathrm{softmax}_{j \in N(i)}(s_{ij}), \qquad
    \mathrm{out}_i = \sum_j \alpha_{ij}\, z_{ij}\, v_j,

with :math:`z_{ij} = \mathrm{keep}_{ij} / (1 - p)` under attention dropout
(:math:`z = 1` without). No per-edge tensor is stored (unless the weights are
asked for): the kernels gather :math:`k_j, v_j` (or :math:`q_i`, upstream
gradients) by index and keep everything per edge in registers.

**Algorithm (forward).** FlashAttention-style online softmax over a sparse row.
A program owns one *work item* (a destination row, or a chunk of a long row)
and one head (grid ``(items, H)``). It loads :math:`q_i` once and streams the
row's neighbours ``BLOCK_E`` at a time: gathers the ``[BLOCK_E, D]`` key tile,
forms the logits from the *direct* differences :math:`q_i - k_j` in float32
registers (never the expanded :math:`|q|^2 - 2 q\cdot k + |k|^2`, whose
cancellation loses every digit once points sit ~1e4 from the origin), and
keeps a running max :math:`m`, a running sum :math:`l` (of the *undropped*
probabilities: dropout does not change the normaliser) and a float32
accumulator :math:`\sum_j e^{s_{ij}-m} z_{ij} v_j`. It writes ``out``
(input dtype) and the row state ``(m, log l)`` (float32 ``[N_dst, H, 2]``;
the log-sum-exp is ``m + log l``, see **Range**), the only per-row state the
backward needs. Rows without
edges give ``out = 0`` and ``lse = -inf``; a row whose logits are all ``-inf``
(e.g. an edge bias of ``-inf``) also gives 0, never NaN.

**Grid and block sizes.** Forward, CSR backward: grid ``(work items, H)``;
CSC backward: the same over source columns; weights: ``(cdiv(E, BLOCK_E),
H)``; combines: ``(split rows, H)``. ``BLOCK_D``, ``BLOCK_C``: ``D``, ``C``
rounded up to a power of two (>= 16; masked). ``BLOCK_E``: the mean degree
``E / N_dst`` (known on the host) rounded up to a power of two, clamped to
``[16, 64]`` and to ``4096 / max(BLOCK_D, BLOCK_C)`` so a ``[BLOCK_E, BLOCK_D]``
tile stays in registers; ``num_warps`` 4 for tiles of >= 2048 elements, else 2.
These are design choices, untuned on a GPU (module constants ``BLOCK_E``,
``ROW_CHUNK``, ``NUM_WARPS`` override them).

**Long rows (skewed degrees).** A row is cut into chunks of at most
``ROW_CHUNK`` edges (default 1024); each chunk is its own work item, so a
hub of degree :math:`10^6` runs on ~1000 programs instead of serialising one.
Chunks of a split row write partial ``(m, l, acc)`` to a small float32
scratch (at most :math:`2E/\mathrm{ROW\_CHUNK}` slots); a second kernel
(flash-decoding combine) merges a row's chunks *in chunk order*
(:math:`M = \max m_c`, :math:`L = \sum l_c e^{m_c - M}`, the same for acc),
so the result does not depend on scheduling. Rows that fit one chunk are
written directly. The schedule (item -> row, edge range, scratch slot) is
built with a few vectorised torch ops from ``rowptr`` and sized by the upper
bound ``N + E // ROW_CHUNK`` known on the host (idle items exit at once), so
no device-to-host synchronisation happens anywhere in forward or backward
(only a seed is drawn on the CPU generator when dropout is on and no seed is
given).

**Range.** Logits live in float32 registers, yet they may lie far beyond
float32's range (points near 1e20 give :math:`|q|^2 \sim 10^{40}`), where a
row would turn to NaN (``'dot'``) or all its weights underflow to zero (a
distance row without a self-loop), although the softmax of such a row is
perfectly defined. So the points are loaded times powers of two
:math:`1/c_q, 1/c_k` (exact) that keep their products finite, and the
logits and the bias are carried in units of a power of two :math:`R`, with
:math:`p = e^{(s' - m') R}`: ``(s' - m') R`` only ever overflows towards
``-inf`` (a zero weight). ``R``, ``c_q``, ``c_k`` come from the largest
finite entries of ``q``, ``k`` and the bias (torch reductions on the device,
no synchronisation) and are 1 unless a logit could exceed :math:`2^{100}`,
so ordinary inputs see the plain computation. The row state the backward
needs is therefore ``(m', log l)`` (float32 ``[N_dst, H, 2]``), and the
returned ``lse = R m' + log l`` may overflow float32 where the logits do.

**Backward.** Recompute, do not store: with the saved row state,
:math:`p_{ij} = e^{s_{ij} - m_i - \log l_i}` is exact per edge even for split
rows. With :math:`D_i = \sum_c \mathrm{dout}_{ic}\mathrm{out}_{ic}` (torch op)
and :math:`dp_{ij} = z_{ij}(\mathrm{dout}_i \cdot v_j + g^w_{ij})`
(:math:`g^w` the gradient reaching the returned weights, if any),
:math:`ds_{ij} = p_{ij}(dp_{ij} - D_i)` (plus :math:`\sum_j g^w_{ij} w_{ij}`
in :math:`D_i`). Then :math:`db_{ij} = ds_{ij}`, :math:`dq_i = \sum_j ds_{ij}
\partial s_{ij}/\partial q_i`, :math:`dk_j = \sum_i ds_{ij}
\partial s_{ij}/\partial k_j`, :math:`dv_j = \sum_i p_{ij} z_{ij}
\mathrm{dout}_i`, :math:`dt = -\sum_{ij} ds_{ij}\, s^0_{ij} / t` (:math:`s^0`
the logit without bias). The CSR pass (same chunked schedule as forward)
writes ``dq`` (split rows through scratch + an ordered sum kernel), ``db``
(each edge owned by exactly one program) and per-item partials of ``dt``
(summed by ``torch.sum``).

**Determinism.** Source-side gradients ``dk``, ``dv`` come from one of two
paths. ``deterministic=True`` (the default): a transposed (CSC) pass. Edges
are sorted stably by source with ``torch.sort``; ``colptr`` comes from
``searchsorted``; the kernel gets, per CSC entry, the destination row (for
:math:`q_i`, ``dout_i``, ``lse_i``, :math:`D_i`) and the CSR edge position
(for the edge bias, the weight gradient and the dropout counter). Long
columns (hub *sources*) are chunked and combined in order exactly as long
rows are. Every floating-point sum thus runs in a fixed order: bitwise
reproducible results. ``deterministic=False``: the CSR pass adds ``dk``,
``dv`` with float32 atomics (order depends on scheduling). Why the
deterministic path is the default, by design (the interpreter says nothing
about speed, and no GPU timing was available): both paths move about the
same bytes per edge (CSC: a second gather of :math:`D + C` values per edge;
atomics: a read-modify-write of :math:`D + C` values per edge), the CSC pass
recomputes :math:`D` flops of logits per edge (negligible in a memory-bound
kernel) and costs one stable sort of the :math:`E` column indices per
backward, while atomics serialise on hub sources (every edge of a
degree-:math:`10^4` source hits the same :math:`D + C` addresses) and need
float32 ``[N_src, H, D + C]`` buffers. Use ``deterministic=False`` when the
sort shows up in a profile.

**Attention dropout.** ``keep_e,h = tl.rand(seed, e * H + h) >= p``: a
counter-based Philox stream keyed by ``seed`` and indexed by the CSR edge
position and head (int32 counters while :math:`E H < 2^{31}`, int64 above),
drawn in the kernel and redrawn bit-identically in backward (both passes use
the CSR position, so the CSC pass reproduces it too). No ``[E, H]`` mask is
ever stored. Weights after dropout are :math:`\alpha z`. ``seed=None`` draws
one from torch's CPU generator (so ``torch.manual_seed`` reproduces it).

**Memory.** Forward: ``out`` + the row state (float32 ``[N_dst, H, 2]``) + scratch of
:math:`O(E / \mathrm{ROW\_CHUNK})` rows; saved for backward: the inputs,
``out`` and the row state. Backward: the gradients, :math:`D_i` (``[N_dst, H]``), the
CSC permutation (two int64 ``[E]``) or the float32 atomic buffers, scratch
as above. ``need_weights`` adds the ``[E, H]`` weights (one extra edge-parallel
kernel, and saved for backward).

**Dtypes.** float32, float16, bfloat16 inputs (``query``, ``key``, ``value``
one dtype); loads are converted to float32, all sums are float32; ``out``,
the weights and gradients come back in the input dtype (``dt`` in the dtype
of ``time_scale``, ``db`` in that of ``edge_bias``); ``lse`` float32.

**Limits.** One program handles one row (chunk) and one head: rows of
degree far below ``BLOCK_E`` leave lanes idle (a multi-row tile would fill
them; not done). ``D`` and ``C`` are padded to powers of two (>= 16) and held
in registers, so very wide heads (> 256) spill. Everything else is gathered
with no tensor-core use (sparse rows give no dense tile). ``time_scale`` is
read from device memory, never synchronised. Kernels are built on first use:
``TRITON_INTERPRET=1`` must be set before the first call (not necessarily
before importing triton) to run on CPU tensors in Triton's interpreter.
Only long-standing Triton language features are used (``tl.rand``,
``tl.atomic_add``, runtime loop bounds, ``if`` on scalars): every kernel
compiles to an sm_90 cubin with triton 3.6.0 and 3.9.0
(:func:`_compile_check`, no GPU needed). The *interpreter* of triton 3.6
cannot run them under numpy >= 2.4 (a loaded loop bound becomes
``int(1-element array)``); triton 3.9's can. Not checked, to avoid a
device-to-host sync: that ``col`` lies in ``[0, N_src)`` and that
``rowptr`` is non-decreasing from 0 to ``E``. No autocast handling: pass
``query``, ``key``, ``value`` in one dtype. No double backward.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

try:  # triton is an optional dependency: pip install pyg-metric-attn[gpu]
    import triton
    import triton.language as tl
    HAVE_TRITON = True
except ImportError:  # pragma: no cover - exercised where triton is absent
    triton = None
    tl = None
    HAVE_TRITON = False

__all__ = ['triton_metric_attention', 'HAVE_TRITON']

METRICS = ('metric', 'l2', 'dot')
DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: Edges per inner iteration; ``None``: the mean degree rounded up to a power
#: of two, clamped to [16, 64] and to 4096 / max(BLOCK_D, BLOCK_C).
BLOCK_E: int | None = None
#: Longest run of edges one program handles; longer rows and columns are split.
ROW_CHUNK: int = 1024
#: Warps per program; ``None``: 4 for tiles of >= 2048 elements, else 2.
NUM_WARPS: int | None = None


def _interpret() -> bool:
    return os.environ.get('TRITON_INTERPRET', '0') == '1'


def _require_triton() -> None:
    if not HAVE_TRITON:
        raise ImportError(
            'triton_metric_attention needs Triton, which is not installed; '
            'install it with `pip install pyg-metric-attn[gpu]` (or `pip install '
            'triton`).')


# --------------------------------------------------------------------------
# Kernels. Plain functions here, wrapped by ``triton.jit`` on first use (so
# TRITON_INTERPRET is read at the first call, not at import). They call no
# other jit function of this module (only triton's own ``tl.rand``).
# --------------------------------------------------------------------------

def _fwd_kernel(Q, K, V, BIAS, RANGE, COL, SCHED, n_items, PART_ML, PART_ACC,
                OUT, STATS, MEAN, H, D, C, seed, p_drop, drop_scale,
                DOT: tl.constexpr, HAS_BIAS: tl.constexpr, DROPOUT: tl.constexpr,
                WIDE: tl.constexpr, NEED_MEAN: tl.constexpr, BLOCK_E: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr):
    it = tl.program_id(0)
    h = tl.program_id(1)
    row = tl.load(SCHED + it)
    if row >= 0:
        lo = tl.load(SCHED + n_items + it)
        hi = tl.load(SCHED + 2 * n_items + it)
        slot = tl.load(SCHED + 3 * n_items + it)
        offs_d = tl.arange(0, BLOCK_D)
        offs_c = tl.arange(0, BLOCK_C)
        dmask = offs_d < D
        cmask = offs_c < C
        inv_cq = tl.load(RANGE)
        inv_ck = tl.load(RANGE + 1)
        scale = tl.load(RANGE + 2)
        r_a = tl.load(RANGE + 3)
        r_b = tl.load(RANGE + 4)
        inv_r = tl.load(RANGE + 5)
        q = tl.load(Q + (row * H + h) * D + offs_d, mask=dmask, other=0.0)
        q = q.to(tl.float32) * inv_cq
        m_i = tl.full([], float('-inf'), tl.float32)
        l_i = tl.full([], 0.0, tl.float32)
        ms_i = tl.full([], 0.0, tl.float32)
        acc = tl.zeros([BLOCK_C], tl.float32)
        for e0 in range(lo, hi, BLOCK_E):
            e = e0 + tl.arange(0, BLOCK_E)
            emask = e < hi
            j = tl.load(COL + e, mask=emask, other=0).to(tl.int64)
            kv = tl.load(K + (j * H + h)[:, None] * D + offs_d[None, :],
                         mask=emask[:, None] & dmask[None, :], other=0.0)
            kv = kv.to(tl.float32) * inv_ck
            if DOT:
                s0 = tl.sum(q[None, :] * kv, 1) * scale
            else:
                diff = q[None, :] - kv
                s0 = -tl.sum(diff * diff, 1) * scale
            s = s0
            if HAS_BIAS:
                s += tl.load(BIAS + e * H + h, mask=emask,
                             other=0.0).to(tl.float32) * inv_r
            s = tl.where(emask, s, float('-inf'))
            m_new = tl.maximum(m_i, tl.max(s, 0))
            m_use = tl.where(m_new == float('-inf'), 0.0, m_new)
            p = tl.exp((s - m_use) * r_a * r_b)
            corr = tl.exp((m_i - m_use) * r_a * r_b)
            l_i = l_i * corr + tl.sum(p, 0)
            if NEED_MEAN:
                ms_i = ms_i * corr + tl.sum(p * s0, 0)
            if DROPOUT:
                off = e.to(tl.int64) * H + h
                if not WIDE:
                    off = off.to(tl.int32)
                keep = tl.rand(seed, off) >= p_drop
                p = tl.where(keep, p * drop_scale, 0.0)
            vv = tl.load(V + (j * H + h)[:, None] * C + offs_c[None, :],
                         mask=emask[:, None] & cmask[None, :], other=0.0)
            acc = acc * corr + tl.sum(p[:, None] * vv.to(tl.float32), 0)
            m_i = m_new
        if slot < 0:
            l_safe = tl.where(l_i > 0.0, l_i, 1.0)
            inv_l = tl.where(l_i > 0.0, 1.0 / l_safe, 0.0)
            tl.store(OUT + (row * H + h) * C + offs_c,
                     (acc * inv_l).to(OUT.dtype.element_ty), mask=cmask)
            tl.store(STATS + (row * H + h) * 2, m_i)
            tl.store(STATS + (row * H + h) * 2 + 1, tl.log(l_safe))
            if NEED_MEAN:
                tl.store(MEAN + row * H + h, ms_i * inv_l)
        else:
            tl.store(PART_ML + (slot * H + h) * 3, m_i)
            tl.store(PART_ML + (slot * H + h) * 3 + 1, l_i)
            tl.store(PART_ML + (slot * H + h) * 3 + 2, ms_i)
            tl.store(PART_ACC + (slot * H + h) * C + offs_c, acc, mask=cmask)


def _combine_fwd_kernel(SPLIT, n_split, PART_ML, PART_ACC, OUT, STATS, MEAN,
                        RANGE, H, C, NEED_MEAN: tl.constexpr,
                        BLOCK_C: tl.constexpr):
    sid = tl.program_id(0)
    h = tl.program_id(1)
    row = tl.load(SPLIT + sid)
    if row >= 0:
        lo = tl.load(SPLIT + n_split + sid)
        hi = tl.load(SPLIT + 2 * n_split + sid)
        offs_c = tl.arange(0, BLOCK_C)
        cmask = offs_c < C
        r_a = tl.load(RANGE + 3)
        r_b = tl.load(RANGE + 4)
        m_i = tl.full([], float('-inf'), tl.float32)
        l_i = tl.full([], 0.0, tl.float32)
        ms_i = tl.full([], 0.0, tl.float32)
        acc = tl.zeros([BLOCK_C], tl.float32)
        for slot in range(lo, hi):
            m_c = tl.load(PART_ML + (slot * H + h) * 3)
            l_c = tl.load(PART_ML + (slot * H + h) * 3 + 1)
            ms_c = tl.load(PART_ML + (slot * H + h) * 3 + 2)
            a_c = tl.load(PART_ACC + (slot * H + h) * C + offs_c, mask=cmask,
                          other=0.0)
            m_new = tl.maximum(m_i, m_c)
            m_use = tl.where(m_new == float('-inf'), 0.0, m_new)
            f_old = tl.exp((m_i - m_use) * r_a * r_b)
            f_new = tl.exp((m_c - m_use) * r_a * r_b)
            l_i = l_i * f_old + l_c * f_new
            ms_i = ms_i * f_old + ms_c * f_new
            acc = acc * f_old + a_c * f_new
            m_i = m_new
        l_safe = tl.where(l_i > 0.0, l_i, 1.0)
        inv_l = tl.where(l_i > 0.0, 1.0 / l_safe, 0.0)
        tl.store(OUT + (row * H + h) * C + offs_c,
                 (acc * inv_l).to(OUT.dtype.element_ty), mask=cmask)
        tl.store(STATS + (row * H + h) * 2, m_i)
        tl.store(STATS + (row * H + h) * 2 + 1, tl.log(l_safe))
        if NEED_MEAN:
            tl.store(MEAN + row * H + h, ms_i * inv_l)


def _sum_kernel(SPLIT, n_split, PART, OUT, H, W, BLOCK_W: tl.constexpr):
    """OUT[seg, h, :] = sum of PART[slot, h, :] over the segment's slots, in order."""
    sid = tl.program_id(0)
    h = tl.program_id(1)
    seg = tl.load(SPLIT + sid)
    if seg >= 0:
        lo = tl.load(SPLIT + n_split + sid)
        hi = tl.load(SPLIT + 2 * n_split + sid)
        offs = tl.arange(0, BLOCK_W)
        wmask = offs < W
        acc = tl.zeros([BLOCK_W], tl.float32)
        for slot in range(lo, hi):
            acc += tl.load(PART + (slot * H + h) * W + offs, mask=wmask, other=0.0)
        tl.store(OUT + (seg * H + h) * W + offs, acc.to(OUT.dtype.element_ty),
                 mask=wmask)


def _weights_kernel(Q, K, BIAS, RANGE, ROW, COL, STATS, WEIGHTS, E, H, D,
                    seed, p_drop, drop_scale,
                    DOT: tl.constexpr, HAS_BIAS: tl.constexpr, DROPOUT: tl.constexpr,
                    WIDE: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr):
    """Edge-parallel: weights[e, h] = exp(s_e - lse_row(e)) * z_e."""
    inv_cq = tl.load(RANGE)
    inv_ck = tl.load(RANGE + 1)
    scale = tl.load(RANGE + 2)
    r_a = tl.load(RANGE + 3)
    r_b = tl.load(RANGE + 4)
    inv_r = tl.load(RANGE + 5)
    pid = tl.program_id(0)
    h = tl.program_id(1)
    e = pid.to(tl.int64) * BLOCK_E + tl.arange(0, BLOCK_E)
    emask = e < E
    offs_d = tl.arange(0, BLOCK_D)
    dmask = offs_d < D
    tmask = emask[:, None] & dmask[None, :]
    i = tl.load(ROW + e, mask=emask, other=0).to(tl.int64)
    j = tl.load(COL + e, mask=emask, other=0).to(tl.int64)
    qv = tl.load(Q + (i * H + h)[:, None] * D + offs_d[None, :], mask=tmask,
                 other=0.0).to(tl.float32) * inv_cq
    kv = tl.load(K + (j * H + h)[:, None] * D + offs_d[None, :], mask=tmask,
                 other=0.0).to(tl.float32) * inv_ck
    if DOT:
        s = tl.sum(qv * kv, 1) * scale
    else:
        diff = qv - kv
        s = -tl.sum(diff * diff, 1) * scale
    if HAS_BIAS:
        s += tl.load(BIAS + e * H + h, mask=emask, other=0.0).to(tl.float32) * inv_r
    m = tl.load(STATS + (i * H + h) * 2, mask=emask, other=0.0)
    m = tl.where(m == float('-inf'), 0.0, m)
    log_l = tl.load(STATS + (i * H + h) * 2 + 1, mask=emask, other=0.0)
    p = tl.where(emask, tl.exp((s - m) * r_a * r_b - log_l), 0.0)
    if DROPOUT:
        off = e * H + h
        if not WIDE:
            off = off.to(tl.int32)
        keep = tl.rand(seed, off) >= p_drop
        p = tl.where(keep, p * drop_scale, 0.0)
    tl.store(WEIGHTS + e * H + h, p.to(WEIGHTS.dtype.element_ty), mask=emask)


def _bwd_rows_kernel(Q, K, V, BIAS, RANGE, COL, SCHED, n_items, STATS, MEAN,
                     DELTA, DOUT, GW,
                     DQ, PART_DQ, DB, DT_PART, DK, DV,
                     H, D, C, seed, p_drop, drop_scale,
                     DOT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_GW: tl.constexpr,
                     DROPOUT: tl.constexpr, WIDE: tl.constexpr,
                     NEED_DB: tl.constexpr, NEED_DT: tl.constexpr,
                     ATOMIC_KV: tl.constexpr, BLOCK_E: tl.constexpr,
                     BLOCK_D: tl.constexpr, BLOCK_C: tl.constexpr):
    """CSR pass: dq, db, dt partials (and dk, dv by atomics if ATOMIC_KV)."""
    it = tl.program_id(0)
    h = tl.program_id(1)
    row = tl.load(SCHED + it)
    if row >= 0:
        lo = tl.load(SCHED + n_items + it)
        hi = tl.load(SCHED + 2 * n_items + it)
        slot = tl.load(SCHED + 3 * n_items + it)
        offs_d = tl.arange(0, BLOCK_D)
        offs_c = tl.arange(0, BLOCK_C)
        dmask = offs_d < D
        cmask = offs_c < C
        inv_cq = tl.load(RANGE)
        inv_ck = tl.load(RANGE + 1)
        scale = tl.load(RANGE + 2)
        r_a = tl.load(RANGE + 3)
        r_b = tl.load(RANGE + 4)
        inv_r = tl.load(RANGE + 5)
        grad_q = tl.load(RANGE + 6)
        grad_k = tl.load(RANGE + 7)
        q = tl.load(Q + (row * H + h) * D + offs_d, mask=dmask, other=0.0)
        q = q.to(tl.float32) * inv_cq
        do = tl.load(DOUT + (row * H + h) * C + offs_c, mask=cmask, other=0.0)
        do = do.to(tl.float32)
        m = tl.load(STATS + (row * H + h) * 2)
        m = tl.where(m == float('-inf'), 0.0, m)
        log_l = tl.load(STATS + (row * H + h) * 2 + 1)
        delta = tl.load(DELTA + row * H + h)
        if NEED_DT:
            s_mean = tl.load(MEAN + row * H + h)
        dq = tl.zeros([BLOCK_D], tl.float32)
        dt = tl.zeros([BLOCK_E], tl.float32)
        for e0 in range(lo, hi, BLOCK_E):
            e = e0 + tl.arange(0, BLOCK_E)
            emask = e < hi
            j = tl.load(COL + e, mask=emask, other=0).to(tl.int64)
            tmask = emask[:, None] & dmask[None, :]
            kv = tl.load(K + (j * H + h)[:, None] * D + offs_d[None, :],
                         mask=tmask, other=0.0).to(tl.float32) * inv_ck
            if DOT:
                s0 = tl.sum(q[None, :] * kv, 1) * scale
            else:
                diff = q[None, :] - kv
                s0 = -tl.sum(diff * diff, 1) * scale
            s = s0
            if HAS_BIAS:
                s += tl.load(BIAS + e * H + h, mask=emask,
                             other=0.0).to(tl.float32) * inv_r
            p = tl.where(emask, tl.exp((s - m) * r_a * r_b - log_l), 0.0)
            vmask = emask[:, None] & cmask[None, :]
            vv = tl.load(V + (j * H + h)[:, None] * C + offs_c[None, :],
                         mask=vmask, other=0.0).to(tl.float32)
            dp = tl.sum(do[None, :] * vv, 1)
            if HAS_GW:
                dp += tl.load(GW + e * H + h, mask=emask, other=0.0).to(tl.float32)
            pz = p
            if DROPOUT:
                off = e.to(tl.int64) * H + h
                if not WIDE:
                    off = off.to(tl.int32)
                z = tl.where(tl.rand(seed, off) >= p_drop, drop_scale, 0.0)
                dp = dp * z
                pz = p * z
            ds = p * (dp - delta)
            if NEED_DB:
                tl.store(DB + e * H + h, ds.to(DB.dtype.element_ty), mask=emask)
            if NEED_DT:
                dt += ds * (s0 - s_mean)
            if DOT:
                dq += tl.sum(ds[:, None] * kv, 0) * grad_q
            else:
                dq += tl.sum(ds[:, None] * diff, 0) * grad_q
            if ATOMIC_KV:
                if DOT:
                    dk = ds[:, None] * q[None, :] * grad_k
                else:
                    dk = ds[:, None] * diff * grad_k
                tl.atomic_add(DK + (j * H + h)[:, None] * D + offs_d[None, :], dk,
                              mask=tmask)
                tl.atomic_add(DV + (j * H + h)[:, None] * C + offs_c[None, :],
                              pz[:, None] * do[None, :], mask=vmask)
        if NEED_DT:
            tl.store(DT_PART + it * H + h, tl.sum(dt, 0))
        if slot < 0:
            tl.store(DQ + (row * H + h) * D + offs_d, dq.to(DQ.dtype.element_ty),
                     mask=dmask)
        else:
            tl.store(PART_DQ + (slot * H + h) * D + offs_d, dq, mask=dmask)


def _bwd_cols_kernel(Q, K, V, BIAS, RANGE, CSC_ROW, CSC_EDGE, SCHED, n_items,
                     STATS, DELTA, DOUT, GW, DK, DV, PART_DK, PART_DV,
                     H, D, C, seed, p_drop, drop_scale,
                     DOT: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_GW: tl.constexpr,
                     DROPOUT: tl.constexpr, WIDE: tl.constexpr,
                     BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr,
                     BLOCK_C: tl.constexpr):
    """CSC pass (deterministic): dk, dv of one source (chunk) and head."""
    it = tl.program_id(0)
    h = tl.program_id(1)
    col = tl.load(SCHED + it)
    if col >= 0:
        lo = tl.load(SCHED + n_items + it)
        hi = tl.load(SCHED + 2 * n_items + it)
        slot = tl.load(SCHED + 3 * n_items + it)
        offs_d = tl.arange(0, BLOCK_D)
        offs_c = tl.arange(0, BLOCK_C)
        dmask = offs_d < D
        cmask = offs_c < C
        inv_cq = tl.load(RANGE)
        inv_ck = tl.load(RANGE + 1)
        scale = tl.load(RANGE + 2)
        r_a = tl.load(RANGE + 3)
        r_b = tl.load(RANGE + 4)
        inv_r = tl.load(RANGE + 5)
        grad_k = tl.load(RANGE + 7)
        k = tl.load(K + (col * H + h) * D + offs_d, mask=dmask, other=0.0)
        k = k.to(tl.float32) * inv_ck
        v = tl.load(V + (col * H + h) * C + offs_c, mask=cmask, other=0.0)
        v = v.to(tl.float32)
        dk = tl.zeros([BLOCK_D], tl.float32)
        dv = tl.zeros([BLOCK_C], tl.float32)
        for c0 in range(lo, hi, BLOCK_E):
            ce = c0 + tl.arange(0, BLOCK_E)
            emask = ce < hi
            e = tl.load(CSC_EDGE + ce, mask=emask, other=0)
            i = tl.load(CSC_ROW + ce, mask=emask, other=0)
            tmask = emask[:, None] & dmask[None, :]
            qv = tl.load(Q + (i * H + h)[:, None] * D + offs_d[None, :],
                         mask=tmask, other=0.0).to(tl.float32) * inv_cq
            if DOT:
                s = tl.sum(qv * k[None, :], 1) * scale
            else:
                diff = qv - k[None, :]
                s = -tl.sum(diff * diff, 1) * scale
            if HAS_BIAS:
                s += tl.load(BIAS + e * H + h, mask=emask,
                             other=0.0).to(tl.float32) * inv_r
            m = tl.load(STATS + (i * H + h) * 2, mask=emask, other=0.0)
            m = tl.where(m == float('-inf'), 0.0, m)
            log_l = tl.load(STATS + (i * H + h) * 2 + 1, mask=emask, other=0.0)
            p = tl.where(emask, tl.exp((s - m) * r_a * r_b - log_l), 0.0)
            vmask = emask[:, None] & cmask[None, :]
            do = tl.load(DOUT + (i * H + h)[:, None] * C + offs_c[None, :],
                         mask=vmask, other=0.0).to(tl.float32)
            dp = tl.sum(do * v[None, :], 1)
            if HAS_GW:
                dp += tl.load(GW + e * H + h, mask=emask, other=0.0).to(tl.float32)
            pz = p
            if DROPOUT:
                off = e * H + h
                if not WIDE:
                    off = off.to(tl.int32)
                z = tl.where(tl.rand(seed, off) >= p_drop, drop_scale, 0.0)
                dp = dp * z
                pz = p * z
            delta = tl.load(DELTA + i * H + h, mask=emask, other=0.0)
            ds = p * (dp - delta)
            dv += tl.sum(pz[:, None] * do, 0)
            if DOT:
                dk += tl.sum(ds[:, None] * qv, 0) * grad_k
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


_KERNEL_FUNCTIONS = {
    'fwd': _fwd_kernel, 'combine_fwd': _combine_fwd_kernel, 'sum': _sum_kernel,
    'weights': _weights_kernel, 'bwd_rows': _bwd_rows_kernel,
    'bwd_cols': _bwd_cols_kernel,
}
_KERNELS: dict[bool, dict] = {}


def _kernels() -> dict:
    """The jit-wrapped kernels, built once per interpreter mode."""
    mode = _interpret()
    if mode not in _KERNELS:
        _KERNELS[mode] = {name: triton.jit(fn)
                          for name, fn in _KERNEL_FUNCTIONS.items()}
    return _KERNELS[mode]


def _compile_check(capability: int = 90, dtype: str = 'bf16') -> int:
    """Compile every kernel (flags all on, then all off) to a cubin for CUDA
    compute capability ``capability`` without a GPU (ptxas ships with triton);
    returns the number of variants compiled. Run with TRITON_INTERPRET unset."""
    import inspect

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    index = {'COL', 'SCHED', 'SPLIT', 'ROW', 'CSC_ROW', 'CSC_EDGE'}
    fp32 = {'STATS', 'MEAN', 'DELTA', 'RANGE', 'PART_ML', 'PART_ACC', 'PART', 'PART_DQ',
            'PART_DK', 'PART_DV', 'DT_PART'}
    scalars = {'H': 'i32', 'D': 'i32', 'C': 'i32', 'W': 'i32', 'E': 'i64',
               'n_items': 'i64', 'n_split': 'i64', 'seed': 'i32', 'p_drop': 'fp32',
               'drop_scale': 'fp32'}
    blocks = {'BLOCK_E': 32, 'BLOCK_D': 16, 'BLOCK_C': 64, 'BLOCK_W': 16}
    target = GPUTarget('cuda', capability, 32)
    count = 0
    for name, fn in _KERNEL_FUNCTIONS.items():
        kernel = triton.jit(fn)
        for flag in (True, False):
            signature, constexprs = {}, {}
            for param, spec in inspect.signature(fn).parameters.items():
                if param in scalars:
                    signature[param] = scalars[param]
                elif 'constexpr' in str(spec.annotation):
                    signature[param] = 'constexpr'
                    constexprs[param] = blocks.get(param, flag)
                elif param in index:
                    signature[param] = '*i64'
                elif param in fp32 or (name == 'bwd_rows' and param in ('DK', 'DV')):
                    signature[param] = '*fp32'
                else:
                    signature[param] = '*' + dtype
            compiled = triton.compile(ASTSource(fn=kernel, signature=signature,
                                                constexprs=constexprs),
                                      target=target)
            assert 'cubin' in compiled.asm
            count += 1
    return count


# --------------------------------------------------------------------------
# Scheduling (torch ops on the graph's device; no host synchronisation)
# --------------------------------------------------------------------------

@dataclass
class _Schedule:
    """Work items over the segments of ``ptr`` (rows for CSR, columns for CSC).

    ``items``: int64 ``[4, n_items]`` = (segment or -1 if idle, first entry,
    end entry, scratch slot or -1 if written directly). ``split``: int64
    ``[3, n_split]`` = (segment or -1, first slot, end slot) for the
    segments cut into several chunks. ``n_slots``: scratch rows to allocate.
    """
    items: Tensor
    split: Tensor
    n_slots: int

    @property
    def n_items(self) -> int:
        return self.items.size(1)

    @property
    def n_split(self) -> int:
        return self.split.size(1)


def _schedule(ptr: Tensor, num_entries: int, chunk: int) -> _Schedule:
    n = ptr.numel() - 1
    device = ptr.device
    deg = ptr[1:] - ptr[:-1]
    nchunk = ((deg + chunk - 1) // chunk).clamp_min(1)
    item_end = nchunk.cumsum(0)
    item_begin = item_end - nchunk
    # sum(nchunk) <= n + E // chunk: launch that many, idle ones exit at once.
    n_items = n + num_entries // chunk
    items = torch.arange(n_items, device=device)
    seg = torch.searchsorted(item_end, items, right=True)
    valid = seg < n
    seg_c = seg.clamp_max(n - 1)
    k = items - item_begin[seg_c]
    lo = ptr[seg_c] + k * chunk
    hi = torch.minimum(lo + chunk, ptr[seg_c + 1])
    is_split = nchunk > 1
    slot_count = torch.where(is_split, nchunk, 0)
    slot_end = slot_count.cumsum(0)
    slot_begin = slot_end - slot_count
    slot = torch.where(is_split[seg_c], slot_begin[seg_c] + k, -1)
    seg = torch.where(valid, seg, -1)
    lo = torch.where(valid, lo, 0)
    hi = torch.where(valid, hi, 0)
    slot = torch.where(valid, slot, -1)
    sched = torch.stack([seg, lo, hi, slot]).contiguous()

    # Split segments have degree > chunk: at most E // chunk of them, and
    # sum(nchunk) over them < 2 E / chunk scratch slots.
    n_split = num_entries // chunk
    split_cum = is_split.long().cumsum(0)
    sids = torch.arange(n_split, device=device)
    sseg = torch.searchsorted(split_cum, sids, right=True)
    svalid = sseg < n
    sseg_c = sseg.clamp_max(n - 1)
    split = torch.stack([torch.where(svalid, sseg, -1),
                         torch.where(svalid, slot_begin[sseg_c], 0),
                         torch.where(svalid, slot_end[sseg_c], 0)]).contiguous()
    n_slots = 2 * (num_entries // chunk) + 1
    return _Schedule(sched, split, n_slots)


@dataclass
class _Graph:
    """The CSR graph and its schedules (the CSC view is built lazily)."""
    rowptr: Tensor      # int64 [N_dst + 1]
    col: Tensor         # int32/int64 [E], contiguous
    num_src: int
    chunk: int
    rows: _Schedule
    _row: Tensor | None = None
    _csc: tuple[Tensor, Tensor, _Schedule] | None = None

    @property
    def num_dst(self) -> int:
        return self.rowptr.numel() - 1

    @property
    def num_edges(self) -> int:
        return self.col.numel()

    def row(self) -> Tensor:
        """The destination row of every CSR entry (int64 ``[E]``)."""
        if self._row is None:
            deg = self.rowptr[1:] - self.rowptr[:-1]
            self._row = torch.repeat_interleave(
                torch.arange(self.num_dst, device=self.col.device), deg,
                output_size=self.num_edges)
        return self._row

    def csc(self) -> tuple[Tensor, Tensor, _Schedule]:
        """(destination row, CSR position) per CSC entry, and the column schedule."""
        if self._csc is None:
            sorted_col, perm = torch.sort(self.col.long(), stable=True)
            colptr = torch.searchsorted(
                sorted_col, torch.arange(self.num_src + 1, device=self.col.device))
            csc_row = self.row()[perm].contiguous()
            self._csc = (csc_row, perm.contiguous(),
                         _schedule(colptr, self.num_edges, self.chunk))
        return self._csc


# --------------------------------------------------------------------------
# Launch helpers
# --------------------------------------------------------------------------

def _pow2(n: int) -> int:
    return max(16, triton.next_power_of_2(max(n, 1)))


@dataclass
class _Config:
    metric: str
    dropout_p: float
    seed: int
    need_weights: bool
    deterministic: bool
    need_mean: bool  # the time scale needs a gradient: keep the mean logit
    num_warps: int
    block_e: int
    block_d: int
    block_c: int
    wide: bool

    @property
    def dot(self) -> bool:
        return self.metric == 'dot'

    @property
    def drop_scale(self) -> float:
        return 0.0 if self.dropout_p >= 1.0 else 1.0 / (1.0 - self.dropout_p)


def _power_of_two_above(x: Tensor) -> Tensor:
    """The smallest power of two >= ``x`` (float64), and at least 1."""
    return torch.exp2(torch.ceil(torch.log2(x))).clamp_min(1.0)


def _finite_abs_max(t: Tensor) -> Tensor:
    """The largest finite ``|t|`` as a float64 scalar (0 if none): a
    non-finite entry must not rescale everyone else's logits."""
    if t.numel() == 0:
        return torch.zeros((), dtype=torch.float64, device=t.device)
    return torch.nan_to_num(t.detach().abs(), nan=0.0, posinf=0.0).amax().double()


def _ranges(query: Tensor, key: Tensor, edge_bias: Tensor | None, ts: Tensor,
            dot: bool) -> tuple[Tensor, Tensor]:
    """The kernels' float32 range constants ``[8]`` and the logit range
    ``R`` (float64 scalar); torch ops on the device, no synchronisation.

    ``(1/c_q, 1/c_k, logit scale, R_a, R_b, 1/R, dq factor, dk factor)``:
    loaded points are multiplied by the powers of two ``1/c_q``, ``1/c_k``
    (exact) so that their products fit float32; logits (and the bias) are
    kept in units of ``R = R_a R_b`` (powers of two, 1 unless
    :math:`|s|` could exceed :math:`2^{100}`), so a logit beyond float32's
    range still has a finite reduced value, and the softmax uses
    ``exp((s' - m') R_a R_b)`` (two factors: ``R`` itself may exceed
    float32). At ordinary scales every constant but the logit scale and
    the gradient factors is 1."""
    dim = query.size(-1)
    big = 2.0 ** 60
    norm_q = _finite_abs_max(query) * math.sqrt(dim)  # >= every |q_i|
    norm_k = _finite_abs_max(key) * math.sqrt(dim)
    t = ts.detach().double().reshape(())
    if dot:
        c_q = _power_of_two_above(norm_q / big)
        c_k = _power_of_two_above(norm_k / big)
        bound = norm_q * norm_k / (math.sqrt(dim) * t.abs())
        scale = c_q * c_k / (math.sqrt(dim) * t)
        grad_q, grad_k = c_k / (math.sqrt(dim) * t), c_q / (math.sqrt(dim) * t)
    else:
        c_q = c_k = _power_of_two_above((norm_q + norm_k) / big)
        bound = (norm_q + norm_k).square() / t.abs()
        scale = c_q * c_k / t
        grad_q, grad_k = -2.0 * c_q / t, 2.0 * c_q / t
    if edge_bias is not None:
        bound = torch.maximum(bound, _finite_abs_max(edge_bias))
    r = _power_of_two_above(bound / 2.0 ** 100)
    r_a = _power_of_two_above(r.sqrt())
    r_b = r / r_a
    constants = torch.stack([1.0 / c_q, 1.0 / c_k, scale / r, r_a, r_b, 1.0 / r,
                             grad_q, grad_k])
    return constants.float().contiguous(), r


def _forward(query: Tensor, key: Tensor, value: Tensor, ranges: Tensor,
             edge_bias: Tensor | None, graph: _Graph, cfg: _Config
             ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """``(out, stats, mean logit or None, weights or None)``; ``stats``
    float32 ``[N_dst, H, 2]``: the row's largest logit in range units (-inf
    without edges) and the log of its softmax normaliser."""
    kern = _kernels()
    n_dst, heads, dim = query.shape
    channels = value.size(-1)
    out = value.new_empty(n_dst, heads, channels)
    stats = query.new_empty(n_dst, heads, 2, dtype=torch.float32)
    weights = None
    if n_dst == 0:
        if cfg.need_weights:
            weights = value.new_empty(0, heads)
        return out, stats, None, weights
    rows = graph.rows
    f32 = dict(device=query.device, dtype=torch.float32)
    part_ml = torch.empty(rows.n_slots, heads, 3, **f32)
    need_mean = cfg.need_mean
    mean = query.new_empty(n_dst, heads, dtype=torch.float32) if need_mean else stats
    part_acc = torch.empty(rows.n_slots, heads, channels, **f32)
    bias = edge_bias if edge_bias is not None else ranges  # dummy pointer
    kern['fwd'][(rows.n_items, heads)](
        query, key, value, bias, ranges, graph.col, rows.items, rows.n_items,
        part_ml, part_acc, out, stats, mean, heads, dim, channels,
        cfg.seed, cfg.dropout_p, cfg.drop_scale,
        DOT=cfg.dot, HAS_BIAS=edge_bias is not None, DROPOUT=cfg.dropout_p > 0,
        WIDE=cfg.wide, NEED_MEAN=need_mean, BLOCK_E=cfg.block_e, BLOCK_D=cfg.block_d,
        BLOCK_C=cfg.block_c, num_warps=cfg.num_warps)
    if rows.n_split > 0:
        kern['combine_fwd'][(rows.n_split, heads)](
            rows.split, rows.n_split, part_ml, part_acc, out, stats, mean, ranges,
            heads, channels, NEED_MEAN=need_mean, BLOCK_C=cfg.block_c,
            num_warps=cfg.num_warps)
    if cfg.need_weights:
        num_edges = graph.num_edges
        weights = value.new_empty(num_edges, heads)
        if num_edges > 0:
            kern['weights'][(triton.cdiv(num_edges, cfg.block_e), heads)](
                query, key, bias, ranges, graph.row(), graph.col, stats, weights,
                num_edges, heads, dim, cfg.seed, cfg.dropout_p, cfg.drop_scale,
                DOT=cfg.dot, HAS_BIAS=edge_bias is not None,
                DROPOUT=cfg.dropout_p > 0, WIDE=cfg.wide, BLOCK_E=cfg.block_e,
                BLOCK_D=cfg.block_d, num_warps=cfg.num_warps)
    return out, stats, mean if need_mean else None, weights


def _row_sums(values: Tensor, rowptr: Tensor) -> Tensor:
    """Deterministic per-row sums of an ``[E, H]`` tensor (float32)."""
    return torch.segment_reduce(values.float(), 'sum', offsets=rowptr, axis=0,
                                unsafe=True)


def _backward(dout: Tensor, grad_weights: Tensor | None, query: Tensor, key: Tensor,
              value: Tensor, ts: Tensor, ranges: Tensor, logit_range: Tensor,
              edge_bias: Tensor | None, out: Tensor, stats: Tensor,
              mean: Tensor | None, weights: Tensor | None,
              graph: _Graph, cfg: _Config,
              need: tuple[bool, bool, bool, bool, bool]):
    need_q, need_k, need_v, need_t, need_b = need
    need_t = need_t and mean is not None
    kern = _kernels()
    n_dst, heads, dim = query.shape
    n_src = key.size(0)
    channels = value.size(-1)
    num_edges = graph.num_edges
    f32 = dict(device=query.device, dtype=torch.float32)
    db = None if edge_bias is None else torch.zeros_like(edge_bias)
    dt = torch.zeros_like(ts)
    if n_dst == 0 or num_edges == 0:
        return (torch.zeros_like(query), torch.zeros_like(key),
                torch.zeros_like(value), dt, db)
    dq = torch.empty_like(query)
    dk = dv = None
    dout = dout.contiguous()
    delta = (dout.float() * out.float()).sum(-1)
    has_gw = grad_weights is not None
    if has_gw:
        grad_weights = grad_weights.contiguous()
        delta = delta + _row_sums(grad_weights.float() * weights.float(), graph.rowptr)
    delta = delta.contiguous()
    bias = edge_bias if edge_bias is not None else ranges  # dummy pointers
    gw = grad_weights if has_gw else ranges
    rows = graph.rows
    part_dq = torch.empty(rows.n_slots, heads, dim, **f32)
    dt_part = torch.zeros(rows.n_items, heads, **f32) if need_t else ranges
    atomic = not cfg.deterministic and (need_k or need_v)
    if atomic:
        dk32 = torch.zeros(n_src, heads, dim, **f32)
        dv32 = torch.zeros(n_src, heads, channels, **f32)
    else:
        dk32 = dv32 = ranges
    flags = dict(DOT=cfg.dot, HAS_BIAS=edge_bias is not None, HAS_GW=has_gw,
                 DROPOUT=cfg.dropout_p > 0, WIDE=cfg.wide)
    blocks = dict(BLOCK_E=cfg.block_e, BLOCK_D=cfg.block_d, BLOCK_C=cfg.block_c,
                  num_warps=cfg.num_warps)
    kern['bwd_rows'][(rows.n_items, heads)](
        query, key, value, bias, ranges, graph.col, rows.items, rows.n_items,
        stats, mean if need_t else stats, delta, dout, gw, dq, part_dq,
        db if need_b else ranges, dt_part, dk32, dv32,
        heads, dim, channels, cfg.seed, cfg.dropout_p, cfg.drop_scale,
        NEED_DB=need_b, NEED_DT=need_t, ATOMIC_KV=atomic, **flags, **blocks)
    if rows.n_split > 0:
        kern['sum'][(rows.n_split, heads)](
            rows.split, rows.n_split, part_dq, dq, heads, dim,
            BLOCK_W=cfg.block_d, num_warps=cfg.num_warps)
    if need_t:
        # dt_part sums ds (s0' - mean') in range units: s0 = R s0'.
        dt = (-dt_part.double().sum() * logit_range / ts.double()).to(ts.dtype)
    if atomic:
        dk = dk32.to(key.dtype)
        dv = dv32.to(value.dtype)
    elif need_k or need_v:
        csc_row, csc_edge, cols = graph.csc()
        dk = torch.empty_like(key)
        dv = torch.empty_like(value)
        part_dk = torch.empty(cols.n_slots, heads, dim, **f32)
        part_dv = torch.empty(cols.n_slots, heads, channels, **f32)
        kern['bwd_cols'][(cols.n_items, heads)](
            query, key, value, bias, ranges, csc_row, csc_edge, cols.items,
            cols.n_items, stats, delta, dout, gw, dk, dv, part_dk, part_dv,
            heads, dim, channels, cfg.seed, cfg.dropout_p, cfg.drop_scale,
            **flags, **blocks)
        if cols.n_split > 0:
            kern['sum'][(cols.n_split, heads)](
                cols.split, cols.n_split, part_dk, dk, heads, dim,
                BLOCK_W=cfg.block_d, num_warps=cfg.num_warps)
            kern['sum'][(cols.n_split, heads)](
                cols.split, cols.n_split, part_dv, dv, heads, channels,
                BLOCK_W=cfg.block_c, num_warps=cfg.num_warps)
    return dq, dk, dv, dt, db


class _TritonMetricAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, query, key, value, ts, edge_bias, graph, cfg):
        ranges, logit_range = _ranges(query, key, edge_bias, ts, cfg.dot)
        out, stats, mean, weights = _forward(query, key, value, ranges, edge_bias,
                                             graph, cfg)
        # The row log-sum-exp R m' + log l (it may overflow float32 where the
        # logits themselves do).
        largest, log_norm = stats.unbind(-1)
        lse = torch.where(largest == float('-inf'), float('-inf'),
                          (largest.double() * logit_range + log_norm).float())
        ctx.graph = graph
        ctx.cfg = cfg
        ctx.save_for_backward(query, key, value, ts, ranges, logit_range,
                              edge_bias, out, stats, mean, weights)
        ctx.mark_non_differentiable(lse)
        if weights is None:
            weights = value.new_empty(0)
            ctx.mark_non_differentiable(weights)
        return out, lse, weights

    @staticmethod
    @once_differentiable
    def backward(ctx, dout, _dlse, dweights):
        (query, key, value, ts, ranges, logit_range, edge_bias, out, stats, mean,
         weights) = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        if not ctx.cfg.need_weights:
            dweights = None
        need = (ctx.needs_input_grad[0], ctx.needs_input_grad[1],
                ctx.needs_input_grad[2], ctx.needs_input_grad[3],
                ctx.needs_input_grad[4])
        dq, dk, dv, dt, db = _backward(dout, dweights, query, key, value, ts,
                                       ranges, logit_range, edge_bias, out, stats,
                                       mean, weights, ctx.graph, ctx.cfg, need)
        return (dq if need[0] else None, dk if need[1] else None,
                dv if need[2] else None, dt if need[3] else None,
                db if need[4] else None, None, None)


# --------------------------------------------------------------------------
# Public entry point
# --------------------------------------------------------------------------

def _check_device(device: torch.device) -> None:
    if device.type == 'cuda':
        return
    if device.type == 'cpu' and _interpret():
        return
    raise RuntimeError(
        f'triton_metric_attention runs on CUDA tensors (got {device.type}); CPU '
        'tensors run only in Triton\'s interpreter, with the environment variable '
        'TRITON_INTERPRET=1 set before the first call.')


def _plain_index(name: str, index: Tensor) -> Tensor:
    """``index`` as a plain tensor the kernels can read: PyG's ``EdgeIndex``
    and ``Index`` hold their data in one (``as_tensor()``); a tensor subclass
    that overrides ``__torch_dispatch__`` otherwise has no storage of its own."""
    if type(index) is Tensor:
        return index
    as_tensor = getattr(index, 'as_tensor', None)
    if callable(as_tensor):
        index = as_tensor()
    if type(index).__torch_dispatch__ is not Tensor.__torch_dispatch__:
        raise TypeError(f'{name} is a {type(index).__name__}, a tensor subclass '
                        'whose data Triton cannot read; pass a plain torch.Tensor')
    return index.as_subclass(Tensor)


def _check_graph(rowptr: Tensor, col: Tensor, num_src: int) -> None:
    """The CSR graph's invariants, without which the kernels would read out of
    bounds: ``rowptr`` non-decreasing from 0 to ``E`` and every ``col`` in
    ``[0, N_src)``. On the CPU a violation raises at once (``IndexError``
    naming the index); on a GPU it is a device-side assert (no host sync)."""
    num_edges = col.numel()
    ok_ptr = ((rowptr[0] == 0) & (rowptr[-1] == num_edges)
              & (rowptr.diff() >= 0).all())
    if num_edges > 0:
        low, high = col.min(), col.max()
        ok_col = (low >= 0) & (high < num_src)
    if col.device.type != 'cpu' or torch.compiler.is_compiling():
        torch._assert_async(ok_ptr, 'rowptr must run non-decreasing from 0 to E')
        if num_edges > 0:
            torch._assert_async(ok_col, f'col must lie in [0, {num_src})')
        return
    if not ok_ptr:
        raise ValueError(f'rowptr must run non-decreasing from 0 to E = {num_edges}, '
                         f'got {rowptr.tolist()[:8]}...')
    if num_edges > 0 and not ok_col:
        bad = int(low) if low < 0 else int(high)
        raise IndexError(f'col holds source index {bad}, outside [0, {num_src})')


def _attention(query: Tensor, key: Tensor, value: Tensor, rowptr: Tensor,
               col: Tensor, metric: str = 'metric',
               time_scale: float | Tensor = 1.0, edge_bias: Tensor | None = None,
               dropout_p: float = 0.0, seed: int | None = None,
               need_weights: bool = False, deterministic: bool = True
               ) -> tuple[Tensor, Tensor, Tensor | None]:
    """:func:`triton_metric_attention` that also returns the float32 ``lse``
    ``[N_dst, H]`` (``-inf`` on rows without edges): ``(out, lse, weights)``."""
    _require_triton()
    if metric not in METRICS:
        raise ValueError(f"Unknown metric '{metric}'; expected one of {METRICS}")
    if query.dim() != 3 or key.dim() != 3 or value.dim() != 3:
        raise ValueError('query, key and value must be [N, H, D], [N, H, D], '
                         f'[N, H, C]; got {tuple(query.shape)}, {tuple(key.shape)}, '
                         f'{tuple(value.shape)}')
    n_dst, heads, dim = query.shape
    n_src = key.size(0)
    if key.shape[1:] != (heads, dim) or value.shape[:2] != (n_src, heads):
        raise ValueError(f'shape mismatch: query {tuple(query.shape)}, key '
                         f'{tuple(key.shape)}, value {tuple(value.shape)}')
    if not (query.dtype == key.dtype == value.dtype) or query.dtype not in DTYPES:
        raise TypeError('query, key and value must share one dtype among float32, '
                        f'float16, bfloat16; got {query.dtype}, {key.dtype}, '
                        f'{value.dtype}')
    device = query.device
    _check_device(device)
    rowptr, col = _plain_index('rowptr', rowptr), _plain_index('col', col)
    for name, t in (('key', key), ('value', value), ('rowptr', rowptr), ('col', col)):
        if t.device != device:
            raise ValueError(f'{name} is on {t.device}, query on {device}')
    if rowptr.dim() != 1 or rowptr.numel() != n_dst + 1:
        raise ValueError(f'rowptr must be [N_dst + 1] = [{n_dst + 1}], got '
                         f'{tuple(rowptr.shape)}')
    if rowptr.dtype not in (torch.int32, torch.int64) or col.dtype not in (
            torch.int32, torch.int64):
        raise TypeError('rowptr and col must be int32 or int64')
    if col.dim() != 1:
        raise ValueError(f'col must be [E], got {tuple(col.shape)}')
    num_edges = col.numel()
    if edge_bias is not None:
        if edge_bias.shape != (num_edges, heads):
            raise ValueError(f'edge_bias must be [E, H] = [{num_edges}, {heads}], '
                             f'got {tuple(edge_bias.shape)}')
        if edge_bias.device != device:
            raise ValueError(f'edge_bias is on {edge_bias.device}, query on {device}')
        edge_bias = edge_bias.contiguous()
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f'dropout_p must lie in [0, 1], got {dropout_p}')
    if isinstance(time_scale, Tensor):
        if time_scale.numel() != 1:
            raise ValueError('time_scale must be a float or a one-element tensor')
        ts = time_scale.to(device=device, dtype=torch.float32).reshape(1)
    else:
        ts = torch.full((1,), float(time_scale), device=device, dtype=torch.float32)
    if dropout_p > 0 and seed is None:
        seed = int(torch.randint(0, 2**31 - 1, (1,)).item())
    seed = 0 if seed is None else int(seed) % (2**31 - 1)

    block_d, block_c = _pow2(dim), _pow2(value.size(-1))
    width = max(block_d, block_c)
    mean_degree = num_edges / max(n_dst, 1)
    block_e = BLOCK_E or max(16, min(64, 4096 // width,
                                     triton.next_power_of_2(math.ceil(mean_degree))))
    num_warps = NUM_WARPS or (4 if block_e * width >= 2048 else 2)
    chunk = max(ROW_CHUNK, block_e)
    rowptr64 = rowptr.long().contiguous()
    _check_graph(rowptr64, col, n_src)
    graph = _Graph(rowptr64, col.contiguous(), n_src, chunk,
                   _schedule(rowptr64, num_edges, chunk) if n_dst > 0 else None)
    need_mean = ts.requires_grad and torch.is_grad_enabled()
    cfg = _Config(metric, float(dropout_p), seed, need_weights, deterministic,
                  need_mean, num_warps, block_e, block_d, block_c,
                  wide=num_edges * heads >= 2**31)
    out, lse, weights = _TritonMetricAttention.apply(
        query.contiguous(), key.contiguous(), value.contiguous(), ts, edge_bias,
        graph, cfg)
    return out, lse, weights if need_weights else None


def triton_metric_attention(query: Tensor, key: Tensor, value: Tensor, rowptr: Tensor,
                            col: Tensor, metric: str = 'metric',
                            time_scale: float | Tensor = 1.0,
                            edge_bias: Tensor | None = None, dropout_p: float = 0.0,
                            seed: int | None = None, need_weights: bool = False,
                            deterministic: bool = True
                            ) -> tuple[Tensor, Tensor | None]:
    r"""Sparse metric-attention over a destination-sorted CSR graph, fused in Triton.

    Args:
        query (Tensor): ``[N_dst, H, D]`` destination points (:math:`\phi(x_i)`
            for ``'metric'``/``'l2'``, the queries for ``'dot'``).
        key (Tensor): ``[N_src, H, D]`` source points / keys.
        value (Tensor): ``[N_src, H, C]``.
        rowptr (Tensor): ``[N_dst + 1]`` int32/int64 CSR row pointer.
        col (Tensor): ``[E]`` source of every edge, in CSR order (duplicates,
            self-loops and unsorted columns within a row are fine).
        metric (str): ``'metric'``, ``'l2'`` (logits :math:`-\|q_i-k_j\|^2/t`)
            or ``'dot'`` (:math:`q_i\cdot k_j/(\sqrt{D}t)`).
        time_scale (float or Tensor): :math:`t`; a one-element tensor gets a
            gradient when it requires one.
        edge_bias (Tensor, optional): ``[E, H]`` logit bias in CSR order.
        dropout_p (float): attention dropout probability (in-kernel RNG).
        seed (int, optional): dropout seed; drawn from torch's CPU generator
            when ``None``.
        need_weights (bool): also return the ``[E, H]`` weights
            :math:`\alpha_{ij} z_{ij}` in CSR order (after dropout).
        deterministic (bool): source-side gradients by a sorted CSC pass
            (bitwise reproducible, default) instead of float atomics.

    Returns:
        ``(out, weights)``: ``out`` ``[N_dst, H, C]`` in the input dtype (0 on
        rows without edges); ``weights`` ``[E, H]`` or ``None``.
    """
    out, _, weights = _attention(query, key, value, rowptr, col, metric, time_scale,
                                 edge_bias, dropout_p, seed, need_weights,
                                 deterministic)
    return out, weights
