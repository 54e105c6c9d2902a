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

Launches: a step launches the forward kernel and the two backward passes
(the rows' pass alone without the transpose), plus the merges of split rows
and columns where the prepared graph has any, and the weights' kernel where
they are asked for. What the launches need besides the tensors (the
work-item counts, grids, compile-time constants) is worked out once per
graph, dtype, shape and set of flags (:class:`ForwardPlan`,
:class:`BackwardPlan`) and kept on the graph's
:class:`~.schedule.GraphTensors`, with, on a GPU, the compiled kernels
Triton chose (:class:`Launch`), so that a repeated step goes straight to
them.

Memory: forward keeps ``out`` and the row state (float32 ``[N_dst, H, 4]``)
plus, where rows are split, scratch of :math:`O(E / \mathrm{chunk})` rows;
``need_weights`` adds the ``[E, H]`` weights. Backward adds the gradients,
:math:`D_i` ``[N_dst, H]``, scratch where rows or columns are split, or,
without the transpose, float32 atomic buffers ``[N_src, H, D + C]``. No
double backward.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from pyg_metric_attn.nn.eager_operator import eager_autograd, operator_or_eager
from pyg_metric_attn.nn.triton.schedule import (
    GraphTensors,
    TritonGraph,
    scratch_slots,
)

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


# ---------------------------------------------------------------- launches

#: Floats per row of the row state, and per chunk of a split row in the
#: forward's scratch (the layouts are :mod:`.kernels`').
ROW_STATE = 4
CHUNK_STATE = 5


class Launch:
    """One kernel as launched over one graph with one dtype, shape and set of
    flags: its grid and compile-time constants, worked out once. On a GPU the
    first launch keeps the compiled kernel Triton chose, and the next ones
    enter it directly, without Triton's argument binding and specialisation,
    as long as the tensors' alignments (what Triton specialises on besides
    the constants, the dtypes and the integers, all fixed here) are the
    same. A kernel that is no :class:`triton.runtime.JITFunction` (the
    interpreter's, a launch counter, a stub) is always launched through its
    ``[grid]``."""
    def __init__(self, name: str, grid: tuple[int, ...], **constants):
        self.name = name
        self.grid = (*grid, *(1,) * (3 - len(grid)))
        self.constants = constants
        self._compiled: dict[tuple[bool, ...], object] = {}
        self._trailing: tuple | None = None

    def __call__(self, *args) -> None:
        kernel = kernels()[self.name]
        if not _is_jit_function(kernel):
            kernel[self.grid](*args, **self.constants)
            return
        aligned = tuple(arg.data_ptr() % 16 == 0 for arg in args
                        if isinstance(arg, Tensor))
        compiled = self._compiled.get(aligned)
        if compiled is None:
            self._compiled[aligned] = kernel[self.grid](*args, **self.constants)
            self._trailing = tuple(self.constants[name]
                                   for name in kernel.arg_names[len(args):])
        else:  # every parameter, the constants included, in signature order
            compiled[self.grid](*args, *self._trailing)


def _is_jit_function(kernel) -> bool:
    from triton.runtime import JITFunction
    return isinstance(kernel, JITFunction)


def _plan(graph: list[Tensor], key: tuple, build):
    """The plan of ``key`` for ``graph``: kept on a
    :class:`~.schedule.GraphTensors` (the eager path), built afresh for a
    plain list (the operators under :func:`torch.compile`)."""
    plans = getattr(graph, 'plans', None)
    if plans is None:
        return build()
    plan = plans.get(key)
    if plan is None:
        plan = plans[key] = build()
    return plan


@dataclass(frozen=True)
class ForwardPlan:
    """The launches of a forward: the forward kernel, the merge of split
    rows where the graph has any, the weights where asked for."""
    graph: TritonGraph
    cfg: LaunchConfig
    forward: Launch
    combine: Launch | None
    weights: Launch | None

    @staticmethod
    def of(graph: list[Tensor], num_src: int, chunk: int, heads: int, dim: int,
           channels: int, metric: str, dropout_p: float, need_weights: bool,
           need_mean: bool, has_bias: bool) -> ForwardPlan:
        g = TritonGraph.from_tensors(graph, num_src, chunk)
        cfg = LaunchConfig.of(metric, dropout_p, g.num_dst, g.num_edges, heads,
                              dim, channels)
        warps = dict(num_warps=cfg.num_warps)
        forward = Launch('forward', (g.rows.n_items, heads), HAS_BIAS=has_bias,
                         NEED_MEAN=need_mean, BLOCK_E=cfg.block_e,
                         BLOCK_D=cfg.block_d, BLOCK_C=cfg.block_c, **warps,
                         **cfg.flags())
        combine = weights = None
        if g.rows.n_split > 0:
            combine = Launch('combine_forward', (g.rows.n_split, heads),
                             NEED_MEAN=need_mean, BLOCK_C=cfg.block_c, **warps)
        if need_weights and g.num_edges > 0:
            weights = Launch('weights', (_cdiv(g.num_edges, cfg.block_e), heads),
                             HAS_BIAS=has_bias, BLOCK_E=cfg.block_e,
                             BLOCK_D=cfg.block_d, **warps, **cfg.flags())
        return ForwardPlan(g, cfg, forward, combine, weights)


@dataclass(frozen=True)
class BackwardPlan:
    """The launches of a backward: the rows pass (and the merge of split
    rows' ``dq``), and over the transpose the columns pass (and the merges
    of split columns' ``dk``, ``dv``); without the transpose the rows pass
    adds ``dk``, ``dv`` by atomics."""
    graph: TritonGraph
    cfg: LaunchConfig
    atomic: bool
    rows: Launch
    dq_merge: Launch | None
    columns: Launch | None
    dk_merge: Launch | None
    dv_merge: Launch | None

    @staticmethod
    def of(graph: list[Tensor], num_src: int, chunk: int, heads: int, dim: int,
           channels: int, metric: str, dropout_p: float, need: tuple[bool, ...],
           has_bias: bool, has_gw: bool) -> BackwardPlan:
        need_q, need_k, need_v, need_t, need_b = need
        g = TritonGraph.from_tensors(graph, num_src, chunk)
        cfg = LaunchConfig.of(metric, dropout_p, g.num_dst, g.num_edges, heads,
                              dim, channels)
        atomic = not g.has_transpose and (need_k or need_v)
        flags = dict(HAS_BIAS=has_bias, HAS_GW=has_gw, **cfg.flags())
        blocks = dict(BLOCK_E=cfg.block_e, BLOCK_D=cfg.block_d,
                      BLOCK_C=cfg.block_c, num_warps=cfg.num_warps)

        def merge(schedule, width: int) -> Launch | None:
            if schedule.n_split == 0:
                return None
            return Launch('segment_sum', (schedule.n_split, heads), BLOCK_W=width,
                          num_warps=cfg.num_warps)

        rows = Launch('backward_rows', (g.rows.n_items, heads), NEED_DB=need_b,
                      NEED_DT=need_t, ATOMIC_KV=atomic, **flags, **blocks)
        columns = dk_merge = dv_merge = None
        if g.has_transpose and (need_k or need_v):
            columns = Launch('backward_columns', (g.cols.n_items, heads), **flags,
                             **blocks)
            dk_merge = merge(g.cols, cfg.block_d)
            dv_merge = merge(g.cols, cfg.block_c)
        return BackwardPlan(g, cfg, atomic, rows,
                            merge(g.rows, cfg.block_d) if need_q else None,
                            columns, dk_merge, dv_merge)


# ---------------------------------------------------------------- forward

def _forward(query: Tensor, key: Tensor, value: Tensor, time_scale: Tensor,
             edge_bias: Tensor | None, seed: Tensor | None, graph: list[Tensor],
             chunk: int, metric: str, dropout_p: float, need_weights: bool,
             need_mean: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(out, stats, mean, weights)``: ``out`` ``[N_dst, H, C]``; ``stats``
    the row state float32 ``[N_dst, H, 4]`` (largest logit in the row's
    units, ``-inf`` without edges; the log of the normaliser; the row's range
    exponents ``e_q + 128 e_k`` and ``e_r``: the unit is ``R = 2^e_r``, see
    :mod:`.kernels`); ``mean`` the mean logit ``[N_dst, H]`` in the row's
    units (empty unless ``need_mean``); ``weights`` ``[E, H]`` (``[0, H]``
    unless ``need_weights``)."""
    n_dst, heads, dim = query.shape
    channels = value.size(-1)
    f32 = dict(device=query.device, dtype=torch.float32)
    out = value.new_empty(n_dst, heads, channels)
    stats = torch.empty(n_dst, heads, ROW_STATE, **f32)
    mean = torch.empty(n_dst if need_mean else 0, heads, **f32)
    weights = value.new_empty(graph[1].numel() if need_weights else 0, heads)
    if n_dst == 0:
        return out, stats, mean, weights
    has_bias = edge_bias is not None
    plan = _plan(graph, ('forward', query.dtype, key.size(0), heads, dim, channels,
                         metric, dropout_p, need_weights, need_mean, has_bias,
                         BLOCK_E, NUM_WARPS),
                 lambda: ForwardPlan.of(graph, key.size(0), chunk, heads, dim,
                                        channels, metric, dropout_p, need_weights,
                                        need_mean, has_bias))
    g, cfg = plan.graph, plan.cfg
    part_ml = part_acc = stats  # scratch of split rows; else dummy pointers
    if plan.combine is not None:
        n_slots = scratch_slots(g.num_edges, chunk)
        part_ml = torch.empty(n_slots, heads, CHUNK_STATE, **f32)
        part_acc = torch.empty(n_slots, heads, channels, **f32)
    bias = edge_bias if has_bias else stats  # dummy pointers
    seed = seed if seed is not None else stats
    plan.forward(query, key, value, bias, time_scale, seed, g.col, g.rows.items,
                 g.rows.n_items, part_ml, part_acc, out, stats, mean, heads, dim,
                 channels, cfg.dropout_p, cfg.drop_scale)
    if plan.combine is not None:
        plan.combine(g.rows.split, g.rows.n_split, part_ml, part_acc, out, stats,
                     mean, heads, channels)
    if plan.weights is not None:
        plan.weights(query, key, bias, time_scale, seed, g.row, g.col, stats,
                     weights, g.num_edges, heads, dim, cfg.dropout_p,
                     cfg.drop_scale)
    return out, stats, mean, weights


attention = torch.library.custom_op('pyg_metric_attn::triton_attention', _forward,
                                    mutates_args=())


@attention.register_fake
def _(query, key, value, time_scale, edge_bias, seed, graph, chunk, metric,
      dropout_p, need_weights, need_mean):
    n_dst, heads, _ = query.shape
    f32 = dict(device=query.device, dtype=torch.float32)
    return (value.new_empty(n_dst, heads, value.size(-1)),
            torch.empty(n_dst, heads, ROW_STATE, **f32),
            torch.empty(n_dst if need_mean else 0, heads, **f32),
            value.new_empty(graph[1].numel() if need_weights else 0, heads))


# ---------------------------------------------------------------- backward

def _backward_kernels(dout: Tensor, grad_weights: Tensor | None, query: Tensor,
                      key: Tensor, value: Tensor, time_scale: Tensor,
                      edge_bias: Tensor | None, seed: Tensor | None, out: Tensor,
                      stats: Tensor, mean: Tensor, weights: Tensor,
                      graph: list[Tensor], chunk: int, metric: str,
                      dropout_p: float, need: list[bool]
                      ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(dq, dk, dv, dt, db)``; a gradient not in ``need`` (query, key, value,
    time scale, bias) comes back empty. ``dk``, ``dv`` by the transpose when
    the graph has one, else by float32 atomics."""
    need_q, need_k, need_v, need_t, need_b = need
    need_t = need_t and mean.numel() > 0
    n_dst, heads, dim = query.shape
    n_src, channels = key.size(0), value.size(-1)
    f32 = dict(device=query.device, dtype=torch.float32)
    trivial = n_dst == 0 or graph[1].numel() == 0  # every gradient is zero
    atomic = len(graph) == 5 and (need_k or need_v)  # no transpose

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
    has_bias, has_gw = edge_bias is not None, grad_weights is not None
    plan = _plan(graph, ('backward', query.dtype, n_src, heads, dim, channels,
                         metric, dropout_p, need_q, need_k, need_v, need_t,
                         need_b, has_bias, has_gw, BLOCK_E, NUM_WARPS),
                 lambda: BackwardPlan.of(graph, n_src, chunk, heads, dim, channels,
                                         metric, dropout_p, (need_q, need_k,
                                                             need_v, need_t, need_b),
                                         has_bias, has_gw))
    g, cfg = plan.graph, plan.cfg
    n_slots = scratch_slots(g.num_edges, chunk)
    bias = edge_bias if has_bias else stats  # dummy pointers
    seed = seed if seed is not None else stats
    gw = grad_weights if has_gw else stats
    gw_delta = stats
    if has_gw:  # the weights' gradient enters D_i through sum_j g_ij w_ij
        gw_delta = torch.segment_reduce(
            grad_weights.float() * weights.float(), 'sum', offsets=g.rowptr, axis=0,
            unsafe=True)
    delta = torch.empty(n_dst, heads, **f32)
    dq_out = dq if need_q else torch.empty_like(query)  # the kernel writes it
    part_dq = (torch.empty(n_slots, heads, dim, **f32) if g.rows.n_split > 0
               else stats)
    dt_part = (torch.empty(g.rows.n_items, heads, device=query.device,
                           dtype=torch.float64) if need_t else stats)
    dk32 = dv32 = stats
    if plan.atomic:
        dk32 = torch.zeros(n_src, heads, dim, **f32)
        dv32 = torch.zeros(n_src, heads, channels, **f32)
    plan.rows(query, key, value, bias, time_scale, seed, g.col, g.rows.items,
              g.rows.n_items, stats, mean if need_t else stats, out, dout, gw,
              gw_delta, delta, dq_out, part_dq, db if need_b else stats, dt_part,
              dk32, dv32, heads, dim, channels, cfg.dropout_p, cfg.drop_scale)
    if plan.dq_merge is not None:  # the split rows' dq, in chunk order
        plan.dq_merge(g.rows.split, g.rows.n_split, part_dq, dq, heads, dim)
    if need_t:  # the items' partials are -ds (s0 - mean) / t, in float64
        dt = dt_part.sum().to(time_scale.dtype).reshape(time_scale.shape)
    if plan.atomic:
        dk = dk32.to(key.dtype) if need_k else dk
        dv = dv32.to(value.dtype) if need_v else dv
    elif plan.columns is not None:
        dk_out = dk if need_k else torch.empty_like(key)  # the kernel writes both
        dv_out = dv if need_v else torch.empty_like(value)
        part_dk = part_dv = stats
        if g.cols.n_split > 0:
            part_dk = torch.empty(n_slots, heads, dim, **f32)
            part_dv = torch.empty(n_slots, heads, channels, **f32)
        plan.columns(query, key, value, bias, time_scale, seed, g.csc_row,
                     g.csc_edge, g.cols.items, g.cols.n_items, stats, delta, dout,
                     gw, dk_out, dv_out, part_dk, part_dv, heads, dim, channels,
                     cfg.dropout_p, cfg.drop_scale)
        if plan.dk_merge is not None:
            plan.dk_merge(g.cols.split, g.cols.n_split, part_dk, dk_out, heads, dim)
            plan.dv_merge(g.cols.split, g.cols.n_split, part_dv, dv_out, heads,
                          channels)
    return dq, dk, dv, dt, db


attention_backward = torch.library.custom_op(
    'pyg_metric_attn::triton_attention_backward', _backward_kernels, mutates_args=())

#: The operators' plain implementations, by operator (an op counter runs them
#: under its dispatch mode to count the ops inside).
IMPLEMENTATIONS = {'pyg_metric_attn.triton_attention': _forward,
                   'pyg_metric_attn.triton_attention_backward': _backward_kernels}


@attention_backward.register_fake
def _(dout, grad_weights, query, key, value, time_scale, edge_bias, seed, out, stats,
      mean, weights, graph, chunk, metric, dropout_p, need):
    return tuple(torch.empty_like(x) if wanted else query.new_empty(0)
                 for x, wanted in zip(
        (query, key, value, time_scale, edge_bias), need, strict=True))


# ---------------------------------------------------------------- autograd

def _setup_context(ctx, inputs, output):
    (query, key, value, time_scale, edge_bias, seed, graph, chunk, metric,
     dropout_p, need_weights, _) = inputs
    out, stats, mean, weights = output
    ctx.mark_non_differentiable(stats, mean)
    if not need_weights:
        ctx.mark_non_differentiable(weights)
    ctx.save_for_backward(query, key, value, time_scale, edge_bias, seed, out, stats,
                          mean, weights, *graph)
    ctx.chunk, ctx.metric, ctx.dropout_p = chunk, metric, dropout_p
    ctx.need_weights, ctx.graph_tensors = need_weights, len(graph)
    # The eager path's graph keeps its launch plans: the backward takes it.
    ctx.graph = graph if isinstance(graph, GraphTensors) else None


def _gradients(ctx, dout: Tensor | None, dweights: Tensor | None,
               run_backward) -> tuple[Tensor | None, ...]:
    """The gradients of query, key, value, time scale and edge bias (``None``
    where not needed) of the call saved in ``ctx``, by ``run_backward``: the
    backward operator, or its implementation."""
    (query, key, value, time_scale, edge_bias, seed, out, stats, mean, weights,
     *graph) = ctx.saved_tensors
    need = list(ctx.needs_input_grad[:5])
    if dout is None:
        dout = torch.zeros_like(out)
    grads = run_backward(
        dout.contiguous(), dweights.contiguous() if ctx.need_weights and
        dweights is not None else None, query, key, value, time_scale, edge_bias,
        seed, out, stats, mean, weights, ctx.graph or graph, ctx.chunk,
        ctx.metric, ctx.dropout_p, need)
    return tuple(grad if wanted else None
                 for grad, wanted in zip(grads, need, strict=True))


def _backward(ctx, dout, _dstats, _dmean, dweights):
    return (*_gradients(ctx, dout, dweights, attention_backward), None,
            [None] * ctx.graph_tensors, None, None, None, None, None)


torch.library.register_autograd('pyg_metric_attn::triton_attention', _backward,
                                 setup_context=_setup_context)


def _eager_backward(ctx, dout, _dstats, _dmean, dweights):
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
