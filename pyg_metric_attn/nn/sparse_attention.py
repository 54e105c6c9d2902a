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
from pyg_metric_attn.utils.csr import HeadBlockCSR, from_blocks, to_blocks


class SampledDot(torch.autograd.Function):
    r"""SDDMM :math:`s_e = \langle a_{\mathrm{row}(e)}, b_{\mathrm{col}(e)}
    \rangle`; gradients :math:`A_g b` and :math:`A_g^\top a` (SpMMs)."""
    @staticmethod
    def forward(ctx, graph: HeadBlockCSR, a: Tensor, b: Tensor) -> Tensor:
        ctx.graph = graph
        ctx.save_for_backward(a, b)
        with torch.autocast(a.device.type, enabled=False):
            return graph.sampled_dot(a, b)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[None, Tensor | None, Tensor | None]:
        a, b = ctx.saved_tensors
        grad = grad.contiguous()
        grad_a = grad_b = None
        if ctx.needs_input_grad[1]:
            grad_a = ctx.graph.aggregate(grad, b)
        if ctx.needs_input_grad[2]:
            grad_b = ctx.graph.aggregate_transposed(grad, a)
        return None, grad_a, grad_b


class SparseAggregate(torch.autograd.Function):
    r"""SpMM :math:`\mathrm{out} = A_w V`; gradients :math:`\mathrm{SDDMM}_A(
    g, V)` for the weights and :math:`A_w^\top g` for :math:`V`."""
    @staticmethod
    def forward(ctx, graph: HeadBlockCSR, weights: Tensor, value: Tensor) -> Tensor:
        ctx.graph = graph
        ctx.save_for_backward(weights, value)
        with torch.autocast(value.device.type, enabled=False):
            return graph.aggregate(weights, value)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[None, Tensor | None, Tensor | None]:
        weights, value = ctx.saved_tensors
        grad = grad.contiguous()
        grad_weights = grad_value = None
        if ctx.needs_input_grad[1]:
            grad_weights = ctx.graph.sampled_dot(grad, value)
        if ctx.needs_input_grad[2]:
            grad_value = ctx.graph.aggregate_transposed(weights, grad)
        return None, grad_weights, grad_value


class SegmentSoftmax(torch.autograd.Function):
    r"""Softmax along each row of ``A``: :math:`\alpha_e = \exp(s_e - m_r) /
    \sum_{e' \in r} \exp(s_{e'} - m_r)` with the row maximum :math:`m_r`;
    gradient :math:`\alpha \odot (g - \sum_{\mathrm{row}} \alpha g)`."""
    @staticmethod
    def forward(ctx, graph: HeadBlockCSR, logits: Tensor) -> Tensor:
        ctx.graph = graph
        row_max = graph.row_reduce(logits, 'max')
        alpha = (logits - graph.broadcast_rows(row_max)).exp_()
        alpha = alpha.div_(graph.broadcast_rows(graph.row_reduce(alpha, 'sum')))
        ctx.save_for_backward(alpha)
        return alpha

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[None, Tensor]:
        alpha, = ctx.saved_tensors
        row_dot = ctx.graph.row_reduce(alpha * grad, 'sum')
        return None, alpha * (grad - ctx.graph.broadcast_rows(row_dot))



def _scaled_query(query: Tensor, metric: str,
                  time_scale: float | Tensor) -> Tensor:
    """The query factor of the logit's bilinear term (see module docstring)."""
    return query * logit_scale(metric, query.size(-1), time_scale)


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
        logits = _expanded_block_logits(query, key, graph, metric, time_scale,
                                        row_term)
    if exact and row_term:  # whole logits may lie beyond float32's range
        return logits
    if exact:  # float64 logits may lie beyond float32's range
        row_max = graph.row_reduce(logits.detach(), 'max')
        logits = (logits - graph.broadcast_rows(row_max)).to(dtype)
    return logits


def _expanded_block_logits(query: Tensor, key: Tensor, graph: HeadBlockCSR,
                           metric: str, time_scale: float | Tensor,
                           row_term: bool) -> Tensor:
    """The expanded form by one SDDMM, ``[H E]`` (see :func:`block_logits`)."""
    row_norms = (to_blocks(query).square().sum(-1, keepdim=True) / -time_scale
                 if row_term and metric != 'dot' else None)  # [H N_dst, 1]
    query = to_blocks(_scaled_query(query, metric, time_scale))
    key = to_blocks(key)  # [H N_src, D]
    if metric != 'dot':
        # The norm terms ride in the SDDMM as extra columns:
        # <[Q_i, 1], [K_j, -|K_j|^2 / t]>, and with the row term also
        # <[.., -|q_i|^2 / t], [.., 1]>.
        query_columns = [query, query.new_ones(query.size(0), 1)]
        key_columns = [key, key.square().sum(-1, keepdim=True) / -time_scale]
        if row_norms is not None:
            query_columns.append(row_norms)
            key_columns.append(key.new_ones(key.size(0), 1))
        query, key = torch.cat(query_columns, 1), torch.cat(key_columns, 1)
    return SampledDot.apply(graph, query, key)


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
    out = SparseAggregate.apply(graph, weights,
                                to_blocks(value.to(weights.dtype)))
    return from_blocks(out, graph.heads), weights
