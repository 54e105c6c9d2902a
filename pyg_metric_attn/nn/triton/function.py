r"""The kernels as two custom operators with autograd, one graph to
:func:`torch.compile`.

``pyg_metric_attn::triton_attention`` runs the forward kernels and
``pyg_metric_attn::triton_attention_backward`` the backward ones (recomputing
from the saved row state); :func:`torch.library.register_autograd` ties them.
Both have fake implementations, so :func:`torch.compile` traces through them
(``fullgraph=True``) and calls them as opaque operators; outside compilation
:func:`run_attention` runs the same code without the dispatcher
(:mod:`~pyg_metric_attn.nn.eager_operator`). The operators take
tensors and scalars only: the prepared graph travels as
:meth:`TritonGraph.tensors() <.schedule.TritonGraph.tensors>`.

Launch parameters: ``BLOCK_D``, ``BLOCK_C`` are ``D``, ``C`` rounded up to a
power of two (>= 16; masked). ``BLOCK_E`` is the mean degree ``E / N_dst``
rounded up to a power of two, clamped to ``[16, 64]`` and to
``4096 / max(BLOCK_D, BLOCK_C)`` so a ``[BLOCK_E, BLOCK_D]`` tile stays in
registers; ``num_warps`` is 4 for tiles of >= 2048 elements, else 2. These
are design choices, untuned on a GPU (``BLOCK_E`` and ``NUM_WARPS`` below
override them).

Memory: forward keeps ``out`` and the row state (float32 ``[N_dst, H, 2]``)
plus scratch of :math:`O(E / \mathrm{chunk})` rows; ``need_weights`` adds the
``[E, H]`` weights. Backward adds the gradients, :math:`D_i` ``[N_dst, H]``,
scratch, or, without the transpose, float32 atomic buffers ``[N_src, H, D +
C]``. No double backward.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from pyg_metric_attn.nn.eager_operator import eager_autograd, operator_or_eager
from pyg_metric_attn.nn.triton.schedule import TritonGraph, scratch_slots

#: Edges per inner iteration; ``None``: from the mean degree (module notes).
BLOCK_E: int | None = None
#: Warps per program; ``None``: 4 for tiles of >= 2048 elements, else 2.
NUM_WARPS: int | None = None

#: Every kernel launch goes through here (tests count launches by wrapping it).
_kernels: dict | None = None


def kernels() -> dict:
    """The jit kernels, imported on first use (the import reads
    ``TRITON_INTERPRET``)."""
    global _kernels
    if _kernels is None:
        from pyg_metric_attn.nn.triton.kernels import KERNELS
        _kernels = dict(KERNELS)
    return _kernels


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    return max(16, 1 << (max(n, 1) - 1).bit_length())


@dataclass(frozen=True)
class LaunchConfig:
    """What the kernels are specialised on, from shapes and flags alone."""
    dot: bool
    dropout_p: float
    wide: bool       # E H >= 2^31: 64-bit dropout counters
    block_e: int
    block_d: int
    block_c: int
    num_warps: int

    @staticmethod
    def of(metric: str, dropout_p: float, num_dst: int, num_edges: int, heads: int,
           dim: int, channels: int) -> LaunchConfig:
        block_d, block_c = _pow2(dim), _pow2(channels)
        width = max(block_d, block_c)
        mean_degree = math.ceil(num_edges / max(num_dst, 1))
        block_e = BLOCK_E or max(16, min(64, 4096 // width, _pow2(mean_degree)))
        num_warps = NUM_WARPS or (4 if block_e * width >= 2048 else 2)
        return LaunchConfig(metric == 'dot', dropout_p, num_edges * heads >= 2**31,
                            block_e, block_d, block_c, num_warps)

    @property
    def drop_scale(self) -> float:
        return 0.0 if self.dropout_p >= 1.0 else 1.0 / (1.0 - self.dropout_p)

    def flags(self) -> dict:
        return dict(DOT=self.dot, DROPOUT=self.dropout_p > 0, WIDE=self.wide)


# ---------------------------------------------------------------- forward

def _forward(query: Tensor, key: Tensor, value: Tensor, time_scale: Tensor,
             edge_bias: Tensor | None, seed: Tensor | None, graph: list[Tensor],
             chunk: int, metric: str, dropout_p: float, need_weights: bool,
             need_mean: bool) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(out, stats, mean, weights, ranges)``: ``out`` ``[N_dst,
    H, C]``; ``stats`` the row state float32 ``[N_dst, H, 2]`` (largest
    logit in range units, ``-inf`` without edges, and the log of the
    normaliser); ``mean`` the mean logit ``[N_dst, H]`` (empty unless
    ``need_mean``); ``weights`` ``[E, H]`` (``[0, H]`` unless
    ``need_weights``); the float32 range constants ``[8]`` (``RANGE`` in
    :mod:`.kernels`; the logit unit is ``R = ranges[3] ranges[4]``)."""
    g = TritonGraph.from_tensors(graph, key.size(0), chunk)
    n_dst, heads, dim = query.shape
    channels = value.size(-1)
    cfg = LaunchConfig.of(metric, dropout_p, n_dst, g.num_edges, heads, dim, channels)
    f32 = dict(device=query.device, dtype=torch.float32)
    ranges = torch.empty(8, **f32)
    out = value.new_empty(n_dst, heads, channels)
    stats = torch.empty(n_dst, heads, 2, **f32)
    mean = torch.empty(n_dst if need_mean else 0, heads, **f32)
    weights = value.new_empty(g.num_edges if need_weights else 0, heads)
    if n_dst == 0:
        return out, stats, mean, weights, ranges
    kern = kernels()
    absmax = torch.zeros(3, **f32)  # the largest finite |q|, |k|, |b|
    for slot, x in enumerate((query, key, edge_bias)):
        if x is not None and x.numel() > 0:
            kern['finite_abs_max'][(_cdiv(x.numel(), 1024),)](
                x, x.numel(), absmax[slot:], BLOCK=1024)
    n_slots = scratch_slots(g.num_edges, chunk)
    part_ml = torch.empty(n_slots, heads, 3, **f32)
    part_acc = torch.empty(n_slots, heads, channels, **f32)
    bias = edge_bias if edge_bias is not None else ranges  # dummy pointers
    seed = seed if seed is not None else ranges
    kern['forward'][(g.rows.n_items, heads)](
        query, key, value, bias, absmax, time_scale, ranges, seed, g.col,
        g.rows.items, g.rows.n_items, part_ml, part_acc, out, stats, mean, heads,
        dim, channels, cfg.dropout_p, cfg.drop_scale,
        HAS_BIAS=edge_bias is not None, NEED_MEAN=need_mean,
        BLOCK_E=cfg.block_e, BLOCK_D=cfg.block_d, BLOCK_C=cfg.block_c,
        num_warps=cfg.num_warps, **cfg.flags())
    if g.rows.n_split > 0:
        kern['combine_forward'][(g.rows.n_split, heads)](
            g.rows.split, g.rows.n_split, part_ml, part_acc, out, stats, mean, ranges,
            heads, channels, NEED_MEAN=need_mean, BLOCK_C=cfg.block_c,
            num_warps=cfg.num_warps)
    if need_weights and g.num_edges > 0:
        kern['weights'][(_cdiv(g.num_edges, cfg.block_e), heads)](
            query, key, bias, ranges, seed, g.row, g.col, stats, weights, g.num_edges,
            heads, dim, cfg.dropout_p, cfg.drop_scale, HAS_BIAS=edge_bias is not None,
            BLOCK_E=cfg.block_e, BLOCK_D=cfg.block_d, num_warps=cfg.num_warps,
            **cfg.flags())
    return out, stats, mean, weights, ranges


attention = torch.library.custom_op('pyg_metric_attn::triton_attention', _forward,
                                    mutates_args=())


@attention.register_fake
def _(query, key, value, time_scale, edge_bias, seed, graph, chunk, metric,
      dropout_p, need_weights, need_mean):
    n_dst, heads, _ = query.shape
    f32 = dict(device=query.device, dtype=torch.float32)
    return (value.new_empty(n_dst, heads, value.size(-1)),
            torch.empty(n_dst, heads, 2, **f32),
            torch.empty(n_dst if need_mean else 0, heads, **f32),
            value.new_empty(graph[1].numel() if need_weights else 0, heads),
            torch.empty(8, **f32))


# ---------------------------------------------------------------- backward

def _backward_kernels(dout: Tensor, grad_weights: Tensor | None, query: Tensor,
                      key: Tensor, value: Tensor, time_scale: Tensor,
                      edge_bias: Tensor | None, seed: Tensor | None, out: Tensor,
                      stats: Tensor, mean: Tensor, weights: Tensor, ranges: Tensor,
                      graph: list[Tensor], chunk: int, metric: str,
                      dropout_p: float, need: list[bool]
                      ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(dq, dk, dv, dt, db)``; a gradient not in ``need`` (query, key, value,
    time scale, bias) comes back empty. ``dk``, ``dv`` by the transpose when
    the graph has one, else by float32 atomics."""
    need_q, need_k, need_v, need_t, need_b = need
    need_t = need_t and mean.numel() > 0
    g = TritonGraph.from_tensors(graph, key.size(0), chunk)
    n_dst, heads, dim = query.shape
    n_src, channels = key.size(0), value.size(-1)
    cfg = LaunchConfig.of(metric, dropout_p, n_dst, g.num_edges, heads, dim, channels)
    f32 = dict(device=query.device, dtype=torch.float32)
    trivial = n_dst == 0 or g.num_edges == 0  # every gradient is zero
    atomic = not g.has_transpose and (need_k or need_v)

    def gradient(like: Tensor | None, wanted: bool, zeros: bool) -> Tensor:
        if not wanted:  # a distinct empty tensor (outputs must not alias)
            return query.new_empty(0)
        return torch.zeros_like(like) if zeros else torch.empty_like(like)

    dq = gradient(query, need_q, trivial)
    dk = gradient(key, need_k and not atomic, trivial)
    dv = gradient(value, need_v and not atomic, trivial)
    dt = gradient(time_scale, need[3], True)
    db = gradient(edge_bias, need_b, True)
    if trivial:
        return dq, dk, dv, dt, db
    kern = kernels()
    n_slots = scratch_slots(g.num_edges, chunk)
    delta = (dout.float() * out.float()).sum(-1)
    has_gw = grad_weights is not None
    if has_gw:  # the weights' gradient enters D_i through sum_j g_ij w_ij
        delta = delta + torch.segment_reduce(
            grad_weights.float() * weights.float(), 'sum', offsets=g.rowptr, axis=0,
            unsafe=True)
    bias = edge_bias if edge_bias is not None else ranges  # dummy pointers
    seed = seed if seed is not None else ranges
    gw = grad_weights if has_gw else ranges
    dq_out = dq if need_q else torch.empty_like(query)  # the kernel writes it
    part_dq = torch.empty(n_slots, heads, dim, **f32)
    dt_part = torch.zeros(g.rows.n_items, heads, **f32) if need_t else ranges
    dk32 = dv32 = ranges
    if atomic:
        dk32 = torch.zeros(n_src, heads, dim, **f32)
        dv32 = torch.zeros(n_src, heads, channels, **f32)
    flags = dict(HAS_BIAS=edge_bias is not None, HAS_GW=has_gw, **cfg.flags())
    blocks = dict(BLOCK_E=cfg.block_e, BLOCK_D=cfg.block_d, BLOCK_C=cfg.block_c,
                  num_warps=cfg.num_warps)
    kern['backward_rows'][(g.rows.n_items, heads)](
        query, key, value, bias, ranges, seed, g.col, g.rows.items, g.rows.n_items,
        stats, mean if need_t else stats, delta, dout, gw, dq_out, part_dq,
        db if need_b else ranges, dt_part, dk32, dv32, heads, dim, channels,
        cfg.dropout_p, cfg.drop_scale, NEED_DB=need_b, NEED_DT=need_t,
        ATOMIC_KV=atomic, **flags, **blocks)
    if g.rows.n_split > 0 and need_q:  # the split rows' dq, in chunk order
        kern['segment_sum'][(g.rows.n_split, heads)](
            g.rows.split, g.rows.n_split, part_dq, dq, heads, dim,
            BLOCK_W=cfg.block_d, num_warps=cfg.num_warps)
    if need_t:  # dt_part sums ds (s0' - mean') in range units: s0 = R s0'
        unit = ranges[3].double() * ranges[4].double()
        dt = (-dt_part.double().sum() * unit / time_scale.double()).to(
            time_scale.dtype).reshape(time_scale.shape)
    if atomic:
        dk = dk32.to(key.dtype) if need_k else dk
        dv = dv32.to(value.dtype) if need_v else dv
    elif need_k or need_v:
        dk_out = dk if need_k else torch.empty_like(key)  # the kernel writes both
        dv_out = dv if need_v else torch.empty_like(value)
        part_dk = torch.empty(n_slots, heads, dim, **f32)
        part_dv = torch.empty(n_slots, heads, channels, **f32)
        kern['backward_columns'][(g.cols.n_items, heads)](
            query, key, value, bias, ranges, seed, g.csc_row, g.csc_edge,
            g.cols.items, g.cols.n_items, stats, delta, dout, gw, dk_out, dv_out,
            part_dk, part_dv, heads, dim, channels, cfg.dropout_p, cfg.drop_scale,
            **flags, **blocks)
        if g.cols.n_split > 0:
            kern['segment_sum'][(g.cols.n_split, heads)](
                g.cols.split, g.cols.n_split, part_dk, dk_out, heads, dim,
                BLOCK_W=cfg.block_d, num_warps=cfg.num_warps)
            kern['segment_sum'][(g.cols.n_split, heads)](
                g.cols.split, g.cols.n_split, part_dv, dv_out, heads, channels,
                BLOCK_W=cfg.block_c, num_warps=cfg.num_warps)
    return dq, dk, dv, dt, db


attention_backward = torch.library.custom_op(
    'pyg_metric_attn::triton_attention_backward', _backward_kernels, mutates_args=())

#: The operators' plain implementations, by operator (an op counter runs them
#: under its dispatch mode to count the ops inside).
IMPLEMENTATIONS = {'pyg_metric_attn.triton_attention': _forward,
                   'pyg_metric_attn.triton_attention_backward': _backward_kernels}


@attention_backward.register_fake
def _(dout, grad_weights, query, key, value, time_scale, edge_bias, seed, out, stats,
      mean, weights, ranges, graph, chunk, metric, dropout_p, need):
    return tuple(torch.empty_like(x) if wanted else query.new_empty(0)
                 for x, wanted in zip(
        (query, key, value, time_scale, edge_bias), need, strict=True))


# ---------------------------------------------------------------- autograd

def _setup_context(ctx, inputs, output):
    (query, key, value, time_scale, edge_bias, seed, graph, chunk, metric,
     dropout_p, need_weights, _) = inputs
    out, stats, mean, weights, ranges = output
    ctx.mark_non_differentiable(stats, mean, ranges)
    if not need_weights:
        ctx.mark_non_differentiable(weights)
    ctx.save_for_backward(query, key, value, time_scale, edge_bias, seed, out, stats,
                          mean, weights, ranges, *graph)
    ctx.chunk, ctx.metric, ctx.dropout_p = chunk, metric, dropout_p
    ctx.need_weights, ctx.graph_tensors = need_weights, len(graph)


def _gradients(ctx, dout: Tensor | None, dweights: Tensor | None,
               run_backward) -> tuple[Tensor | None, ...]:
    """The gradients of query, key, value, time scale and edge bias (``None``
    where not needed) of the call saved in ``ctx``, by ``run_backward``: the
    backward operator, or its implementation."""
    (query, key, value, time_scale, edge_bias, seed, out, stats, mean, weights,
     ranges, *graph) = ctx.saved_tensors
    need = list(ctx.needs_input_grad[:5])
    if dout is None:
        dout = torch.zeros_like(out)
    grads = run_backward(
        dout.contiguous(), dweights.contiguous() if ctx.need_weights and
        dweights is not None else None, query, key, value, time_scale, edge_bias,
        seed, out, stats, mean, weights, ranges, graph, ctx.chunk, ctx.metric,
        ctx.dropout_p, need)
    return tuple(grad if wanted else None
                 for grad, wanted in zip(grads, need, strict=True))


def _backward(ctx, dout, _dstats, _dmean, dweights, _dranges):
    return (*_gradients(ctx, dout, dweights, attention_backward), None,
            [None] * ctx.graph_tensors, None, None, None, None, None)


torch.library.register_autograd('pyg_metric_attn::triton_attention', _backward,
                                 setup_context=_setup_context)


def _eager_backward(ctx, dout, _dstats, _dmean, dweights, _dranges):
    # As _backward, but a Function's list input (the graph) takes one None.
    return (*_gradients(ctx, dout, dweights, _backward_kernels), None, None,
            None, None, None, None, None)


#: The operators' code outside :func:`torch.compile`, without the dispatcher
#: (:mod:`~pyg_metric_attn.nn.eager_operator`).
TritonAttention = eager_autograd('TritonAttention', _forward, _setup_context,
                                 _eager_backward)
#: ``pyg_metric_attn::triton_attention`` while compiling or tracing, else
#: :class:`TritonAttention`.
run_attention = operator_or_eager(attention, TritonAttention)
