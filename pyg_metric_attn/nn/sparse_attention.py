r"""Fused sparse metric-attention: SDDMM, segment softmax and SpMM on a CSR view.

On the CSR pattern :math:`A` that a graph's heads share
(:class:`~pyg_metric_attn.utils.csr.HeadBlockCSR`) one layer is

.. math::
    s = \mathrm{SDDMM}_A([Q, 1], [K, -\|K\|^2 / t]) + b, \qquad
    \alpha = \mathrm{softmax}_{\mathrm{row}}(s), \qquad
    \mathrm{out} = A_\alpha V,

with :math:`Q = 2 (z_{dst} - c) / t` and :math:`K = z_{src} - c` for the
distance metrics (``'dot'``: :math:`Q = q / (\sqrt{D} t)`, :math:`K = k`, no
norm term). This is the softmax of :math:`-\|z_i - z_j\|^2 / t + b_{ij}`: the
dropped :math:`\|z_i - c\|^2` is constant along a softmax row.

Precision (the ``'checked'`` policy of :mod:`~pyg_metric_attn.nn.logits`).
The centre :math:`c` is the mean of the finite source points per head.
Where the expanded form would round the logits by more than
:data:`~pyg_metric_attn.nn.logits.LOGIT_ROUNDING_TOLERANCE`, they are
computed in float64 and shifted to a row maximum of 0 before they return to
float32 (one host read decides; the common case stays in float32), so the
weights agree with a float64 direct-difference computation and stay finite
for all finite inputs. Where even float64 would round them by more than the
tolerance (a graph of huge points batched with ordinary ones: the one centre
lies far from the ordinary points), the logits are direct differences per
edge, as the scatter path computes them (``E x D`` per head, transient).
Otherwise backward passes are again SDDMMs and SpMMs, so every
per-edge tensor, forward and backward, is :math:`E \times H`: no
:math:`E \times H \times C` message and no :math:`E \times H \times D`
difference is ever formed. All kernels are device-agnostic torch ops
(:func:`torch.sparse.sampled_addmm`, CSR ``@`` dense,
:func:`torch.segment_reduce`).
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from pyg_metric_attn.nn.logits import (
    centred,
    expanded_logits_are_accurate,
    logit_scale,
)
from pyg_metric_attn.nn.pseudo_metric import check_metric
from pyg_metric_attn.utils.csr import HeadBlockCSR


class ExpandedLogits(torch.autograd.Function):
    r"""The expanded logits by one SDDMM, ``[H E]``: :math:`s_e = \langle
    a_{\mathrm{dst}(e)}, b_{\mathrm{src}(e)} \rangle` with, for the distance
    metrics, :math:`a_i = [c\, q_i, 1]`, :math:`b_j = [k_j, -\|k_j\|^2 / t]`
    (:math:`c = 2/t`; with the row term also :math:`-\|q_i\|^2 / t` and
    :math:`1`), and for ``'dot'`` :math:`a_i = c\, q_i`, :math:`b_j = k_j`
    (:math:`c = 1 / (\sqrt{D} t)`), written head-major ``[H, N, W]`` straight
    from the node-major ``[N, H, D]`` points. Only :math:`a` and :math:`b` are
    kept (they hold the points; for one set of points on both ends, as a
    tied map gives, only :math:`b`, from which the backward writes
    :math:`a` again). Backward, with :math:`G_a = A_g b` and
    :math:`G_b = A_g^\top a` (SpMMs): :math:`dq = c\, (G_a)_{:D}` (and
    :math:`- 2 q / t\, (G_a)_{D+1}` with the row term), :math:`dk =
    (G_b)_{:D} - 2 k / t\, (G_b)_D` and, every logit being :math:`1/t` times
    something free of :math:`t`, :math:`dt = -\sum_e g_e s_e / t =
    -\langle a, G_a \rangle / t` (no logit stored or recomputed)."""
    @staticmethod
    def forward(ctx, graph: HeadBlockCSR, query: Tensor, key: Tensor,
                metric: str, time_scale: float | Tensor,
                row_term: bool) -> Tensor:
        dim = query.size(-1)
        extra = 0 if metric == 'dot' else 1 + row_term  # the norm columns
        scale = logit_scale(metric, dim, time_scale)
        with torch.autocast(query.device.type, enabled=False):
            b = _blocks(key, extra)
            if extra:
                b[..., dim] = _norms(key, time_scale)
            if extra == 2:
                b[..., dim + 1] = 1
            a = _query_blocks(b[..., :dim] if query is key
                              else query.transpose(0, 1), extra, scale)
            if extra == 2:
                a[..., dim + 1] = _norms(query, time_scale)
            logits = graph.sampled_dot(a, b)
        ctx.graph, ctx.dim, ctx.extra, ctx.scale = graph, dim, extra, scale
        ctx.tied = query is key and extra < 2  # a is b's points, scaled
        learned = isinstance(time_scale, Tensor)
        ctx.time_scale = None if learned else time_scale
        ctx.save_for_backward(b, *(() if ctx.tied else (a,)),
                              *((time_scale,) if learned else ()))
        return logits

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        b, *saved = ctx.saved_tensors
        graph, dim = ctx.graph, ctx.dim
        a = (_query_blocks(b[..., :dim], ctx.extra, ctx.scale) if ctx.tied
             else saved.pop(0))
        t = saved[0] if saved else ctx.time_scale
        grad = grad.contiguous()
        grad_query = grad_key = grad_time = None
        _, need_query, need_key, _, need_time, _ = ctx.needs_input_grad
        if need_key:  # (G_b)_{:D} - 2 k / t (G_b)_D, written node-major
            grad_b = graph.aggregate_transposed(grad, a)
            grad_key = _node_major(grad_b[..., :dim])
            if ctx.extra:  # the key term -|k|^2 / t
                grad_key.transpose(0, 1).addcmul_(
                    b[..., :dim], grad_b[..., dim:dim + 1] * (-2.0 / t))
            del grad_b
        if need_query or need_time:
            grad_a = graph.aggregate(grad, b)
            if need_time:
                grad_time = -torch.dot(a.view(-1), grad_a.view(-1)) / t
            if need_query and ctx.tied and grad_key is not None:
                # One tensor at both ends: its gradient in one buffer.
                _add_scaled(grad_key.transpose(0, 1), grad_a[..., :dim], ctx.scale)
            elif need_query:
                grad_query = _node_major(grad_a[..., :dim]).mul_(ctx.scale)
                if ctx.extra == 2:  # the row term -|q|^2 / t
                    grad_query.transpose(0, 1).addcmul_(
                        a[..., :dim], grad_a[..., dim + 1:] * (-2.0 / (ctx.scale * t)))
        return None, grad_query, grad_key, None, grad_time, None


def _node_major(blocks: Tensor) -> Tensor:
    """Head-major ``[H, N, D]`` values (any strides) copied into a new
    contiguous node-major ``[N, H, D]`` tensor (a gradient the points' view
    takes without another copy)."""
    out = blocks.new_empty(blocks.size(1), blocks.size(0), blocks.size(2))
    out.transpose(0, 1).copy_(blocks)
    return out


def _add_scaled(out: Tensor, values: Tensor, scale: float | Tensor) -> None:
    """``out += scale values`` in place (a float or a 0-dim tensor scale)."""
    if isinstance(scale, Tensor):
        out.addcmul_(values, scale)
    else:
        out.add_(values, alpha=scale)


def _blocks(points: Tensor, extra: int) -> Tensor:
    """Node-major ``[N, H, D]`` points copied into the first ``D`` columns of
    a new head-major ``[H, N, D + extra]`` tensor (the rest unset)."""
    count, heads, dim = points.shape
    blocks = points.new_empty(heads, count, dim + extra)
    blocks[..., :dim].copy_(points.transpose(0, 1))
    return blocks


def _query_blocks(points: Tensor, extra: int, scale: float | Tensor) -> Tensor:
    """:math:`a` of ``[H, N, D]`` points (any strides): a new head-major
    ``[H, N, D + extra]`` tensor of the points times ``scale`` and, where
    ``extra``, the column of ones (the row term's column unset)."""
    heads, count, dim = points.shape
    blocks = points.new_empty(heads, count, dim + extra)
    torch.mul(points, scale, out=blocks[..., :dim])
    if extra:
        blocks[..., dim] = 1
    return blocks


def _norms(points: Tensor, time_scale: float | Tensor) -> Tensor:
    r""":math:`-\|p\|^2 / t` of node-major ``[N, H, D]`` points, ``[H, N]``
    (one batched product per point: no ``[N, H, D]`` temporary)."""
    flat = points.reshape(-1, 1, points.size(-1))
    squares = torch.bmm(flat, flat.transpose(1, 2)).view(points.shape[:2])
    return squares.t() / -time_scale


class SparseAggregate(torch.autograd.Function):
    r"""SpMM :math:`\mathrm{out} = A_w V` on node-major ``[N, H, C]`` values
    (read and written a head at a time through strided views: no head-major
    copy); gradients :math:`\mathrm{SDDMM}_A(g, V)` for the weights and
    :math:`A_w^\top g` for :math:`V`."""
    @staticmethod
    def forward(ctx, graph: HeadBlockCSR, weights: Tensor, value: Tensor) -> Tensor:
        ctx.graph = graph
        ctx.save_for_backward(weights, value)
        out = value.new_empty(graph.num_dst, *value.shape[1:])
        with torch.autocast(value.device.type, enabled=False):
            graph.aggregate(weights, value.transpose(0, 1), out.transpose(0, 1))
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[None, Tensor | None, Tensor | None]:
        weights, value = ctx.saved_tensors
        grad_weights = grad_value = None
        if ctx.needs_input_grad[1]:
            grad_weights = ctx.graph.sampled_dot(grad.transpose(0, 1),
                                                 value.transpose(0, 1))
        if ctx.needs_input_grad[2]:
            grad_value = torch.empty_like(value)
            ctx.graph.aggregate_transposed(weights, grad.transpose(0, 1),
                                           grad_value.transpose(0, 1))
        return None, grad_weights, grad_value


class SegmentSoftmax(torch.autograd.Function):
    r"""Softmax along each row of ``A``: :math:`\alpha_e = \exp(s_e - m_r) /
    \sum_{e' \in r} \exp(s_{e'} - m_r)` with the row maximum :math:`m_r`;
    gradient :math:`\alpha \odot (g - \sum_{\mathrm{row}} \alpha g)`."""
    @staticmethod
    def forward(ctx, graph: HeadBlockCSR, logits: Tensor) -> Tensor:
        ctx.graph = graph
        alpha = graph.rows_apply(torch.sub, logits, graph.row_reduce(logits, 'max'),
                                 torch.empty_like(logits)).exp_()
        graph.rows_apply(torch.div, alpha, graph.row_reduce(alpha, 'sum'), alpha)
        ctx.save_for_backward(alpha)
        return alpha

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[None, Tensor]:
        alpha, = ctx.saved_tensors
        out = alpha * grad  # then alpha (grad - sum_row alpha grad), in place
        return None, ctx.graph.rows_apply(_subtract_product, alpha,
                                          ctx.graph.row_reduce(out, 'sum'), out)


def _subtract_product(alpha: Tensor, row_value: Tensor, out: Tensor) -> Tensor:
    return out.addcmul_(alpha, row_value, value=-1)



def block_logits(query: Tensor, key: Tensor, graph: HeadBlockCSR,
                 metric: str = 'metric',
                 time_scale: float | Tensor = 1.0,
                 row_term: bool = False) -> Tensor:
    r"""Per-edge logits in block order, ``[H E]``, up to a per-row constant
    (computed in float64 and shifted to a row maximum of 0 where float32
    would round them by more than the tolerance: see the module docstring).
    With ``row_term`` the logits are whole (the row constant included, no
    shift; float64 where float32 would round them too much), as
    normalisations other than the row softmax need them.

    Args:
        query (torch.Tensor): Destination points ``[N_dst, H, D]``.
        key (torch.Tensor): Source points ``[N_src, H, D]``.
        graph (HeadBlockCSR): The graph.
        metric (str): ``'metric'``/``'l2'`` (:math:`-\|q_i - k_j\|^2 / t`
            without the row constant :math:`-\|q_i - c\|^2 / t`) or ``'dot'``
            (:math:`q_i^\top k_j / (\sqrt{D} t)`).
        time_scale (float or torch.Tensor): The time scale :math:`t`.
        row_term (bool): Include the row constant. (default: :obj:`False`)
    """
    points = query, key
    if check_metric(metric) != 'dot':
        query, key = centred(query, key, dim=0)
    dtype = query.dtype
    exact = not expanded_logits_are_accurate(query, key, metric, time_scale)
    if exact:
        query, key = query.double(), key.double()
    if exact and metric != 'dot' and not expanded_logits_are_accurate(
            query, key, metric, time_scale):  # even float64 would not do
        # (from the points before centring: centring rounded them)
        logits = _direct_block_logits(*points, graph, time_scale)
    else:
        logits = ExpandedLogits.apply(graph, query, key, metric, time_scale,
                                      row_term)
    if exact and row_term:  # whole logits may lie beyond float32's range
        return logits
    if exact:  # float64 logits may lie beyond float32's range
        row_max = graph.row_reduce(logits.detach(), 'max')
        logits = (logits - graph.broadcast_rows(row_max)).to(dtype)
    return logits


def _direct_block_logits(query: Tensor, key: Tensor, graph: HeadBlockCSR,
                         time_scale: float | Tensor) -> Tensor:
    """Whole distance logits ``-|q_i - k_j|^2 / t`` by direct differences
    per edge, ``[H E]`` in float64 sums, head by head (``E x D`` differences
    per head): for points too spread out for the expanded form even in
    float64."""
    return torch.cat([
        -_squared_norm(query_h.index_select(0, graph.row)
                       - key_h.index_select(0, graph.col)) / time_scale
        for query_h, key_h in zip(query.unbind(1), key.unbind(1), strict=True)])


def gathered_logits(query: Tensor, key: Tensor, edge_index: Tensor,
                    metric: str = 'metric',
                    time_scale: float | Tensor = 1.0) -> Tensor:
    r"""Exact logits in edge order, ``[E, H]`` in float64, by per-edge gathers
    and direct differences (for message passing and compilers, which fuse
    the gathers away): :math:`-\|q_i - k_j\|^2 / t` or :math:`q_i^\top k_j /
    (\sqrt{D} t)`.

    Differences are taken in the input dtype (exact up to its rounding of
    each difference), squared and summed in float64, so the logits are finite
    for all finite points; autograd keeps the ``[E, H, D]`` differences in the
    input dtype. ``'dot'`` multiplies in float64 (exact products) and keeps
    both ``[E, H, D]`` factors in float64."""
    src, dst = edge_index[0], edge_index[1]
    if check_metric(metric) == 'dot':
        products = query.double()[dst] * key.double()[src]
        return products.sum(-1) * logit_scale(metric, query.size(-1),
                                              time_scale)
    return -_squared_norm(query[dst] - key[src]) / time_scale


def _squared_norm(points: Tensor) -> Tensor:
    """``|p|^2`` along the last dimension, summed in float64."""
    return torch.linalg.vector_norm(points, dim=-1,
                                    dtype=torch.float64).square()


def sparse_metric_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    graph: HeadBlockCSR,
    metric: str = 'metric',
    time_scale: float | Tensor = 1.0,
    edge_bias: Tensor | None = None,
    dropout_mask: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Attention of every destination over its in-neighbours, fused.

    .. math::
        \mathrm{out}_i = \sum_{j \to i} \alpha_{ij} m_{ij}\, v_j, \qquad
        \alpha_{ij} = \mathrm{softmax}_{j \to i}(s_{ij} + b_{ij})

    Args:
        query (torch.Tensor): Destination points ``[N_dst, H, D]``.
        key (torch.Tensor): Source points ``[N_src, H, D]``.
        value (torch.Tensor): Source values ``[N_src, H, C]``.
        graph (HeadBlockCSR): The graph (``heads = H``).
        metric (str): ``'metric'``, ``'l2'`` or ``'dot'`` (see
            :func:`block_logits`).
        time_scale (float or torch.Tensor): The time scale :math:`t`.
        edge_bias (torch.Tensor, optional): Logit bias :math:`b` ``[E, H]`` in
            the graph's edge order.
        dropout_mask (torch.Tensor, optional): Factor :math:`m` on the
            weights ``[E, H]`` in edge order (attention dropout).

    Returns:
        ``(out [N_dst, H, C], weights [H E])``: the weights
        :math:`\alpha \odot m` in block order
        (:meth:`HeadBlockCSR.to_edges` gives ``[E, H]``).
    """
    logits = block_logits(query, key, graph, metric, time_scale)
    if edge_bias is not None:
        logits = logits + graph.from_edges(edge_bias.to(logits.dtype))
    weights = SegmentSoftmax.apply(graph, logits)
    if dropout_mask is not None:
        weights = weights * graph.from_edges(dropout_mask.to(weights.dtype))
    return SparseAggregate.apply(graph, weights, value.to(weights.dtype)), weights
