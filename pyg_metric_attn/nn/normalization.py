r"""Normalisations of attention similarities (Ruan & Zhang, arXiv 2412.18288,
Definitions 7-10), on per-edge logits of a graph and on dense score matrices.

Given logits :math:`s_{ij}` on the edges :math:`j \to i` (the similarity
:math:`K_{ij} = \exp(s_{ij})` after exponential inflation), the weights are

* ``'row'``: :math:`\alpha_{ij} = K_{ij} / \sum_{k} K_{ik}`, the softmax over
  each destination's in-edges (attention as usual: rows sum to 1),
* ``'column'``: :math:`\alpha_{ij} = K_{ij} / \sum_{k} K_{kj}`, over each
  source's out-edges (columns sum to 1),
* ``'sinkhorn'``: two-side normalisation by Sinkhorn's iterations (Sinkformers,
  Sander et al. 2022): ``n`` times a column step then a row step, so the rows
  sum to 1 exactly and the columns approach 1 geometrically where the graph
  admits a doubly stochastic scaling (e.g. connected with self-loops),
* ``'global'``: :math:`\alpha_{ij} = K_{ij} / \sum_{(k, l) \in G} K_{kl}`, over
  all edges of the graph :math:`G` the edge is in (a graph's weights sum to
  1).

Everything runs in log space (:math:`\log \alpha = s - \mathrm{logsumexp}`
per segment with a detached per-segment maximum), so large logits neither
overflow nor underflow. A segment whose logits are all :math:`-\infty` (every
entry masked) gets weights 0, never NaN; a NaN or infinite logit affects only
its own segments (``'sinkhorn'``: the edges connected to it through rows and
columns, i.e. its connected component, after enough iterations). Gradients
flow through every step, Sinkhorn's iterations included.

``'row'`` is computed exactly as before this module existed (PyG's
:func:`~torch_geometric.utils.softmax` on edges, :func:`torch.softmax` on
dense scores), so its outputs and gradients are unchanged.
"""
from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor
from torch_geometric.utils import scatter, softmax

Normalization = Literal['row', 'column', 'sinkhorn', 'global']
NORMALIZATIONS: tuple[str, ...] = ('row', 'column', 'sinkhorn', 'global')


def check_normalization(normalization: str, sinkhorn_iterations: int) -> str:
    """Return ``normalization`` if it is known and ``sinkhorn_iterations`` is
    a positive integer, else raise :class:`ValueError`."""
    if normalization not in NORMALIZATIONS:
        raise ValueError(f"Unknown normalization {normalization!r}; expected "
                         f"one of {NORMALIZATIONS}")
    if (isinstance(sinkhorn_iterations, bool)
            or not isinstance(sinkhorn_iterations, int)
            or sinkhorn_iterations < 1):
        raise ValueError(f"'sinkhorn_iterations' must be a positive integer, "
                         f"got {sinkhorn_iterations!r}")
    return normalization


def _log_total(total: Tensor, shift: Tensor) -> Tensor:
    """``log(total) + shift`` with ``-inf`` where ``total`` is 0 (a segment
    of only ``-inf``), without a NaN gradient there."""
    empty = total == 0
    return torch.where(empty, float('-inf'),
                       torch.where(empty, 1.0, total).log() + shift)


def _finite_shift(maximum: Tensor) -> Tensor:
    """The per-segment shift of a logsumexp: the maximum where finite, else 0."""
    return torch.where(maximum.isfinite(), maximum, 0.0)


def segment_logsumexp(logits: Tensor, index: Tensor,
                      num_segments: int) -> Tensor:
    r"""``[E, ...] -> [num_segments, ...]``: :math:`\log \sum_{e: index_e = s}
    \exp(\mathrm{logits}_e)`; empty and all-:math:`-\infty` segments give
    :math:`-\infty`."""
    shift = _finite_shift(scatter(logits.detach(), index, 0, num_segments,
                                  reduce='max'))
    total = scatter((logits - shift[index]).exp(), index, 0, num_segments,
                    reduce='sum')
    return _log_total(total, shift)


def _subtract_total(log_weights: Tensor, total: Tensor) -> Tensor:
    """``log_weights - total``, ``-inf`` where the total is ``-inf`` (an
    all-masked segment: weights 0, no NaN)."""
    return torch.where(total == float('-inf'), float('-inf'),
                       log_weights - total)


def _normalize_segments(log_weights: Tensor, index: Tensor,
                        num_segments: int) -> Tensor:
    """Log-weights minus their segment's logsumexp (so each segment sums to
    1)."""
    return _subtract_total(
        log_weights, segment_logsumexp(log_weights, index, num_segments)[index])


def row_normalized(logits: Tensor, dst: Tensor, num_dst: int,
                   ptr: Tensor | None = None) -> Tensor:
    """``'row'``: the softmax over each destination's in-edges (PyG's
    :func:`~torch_geometric.utils.softmax`; ``ptr``: the CSR pointer of
    ``dst`` where the edges are sorted by it)."""
    return softmax(logits, dst, ptr, num_dst)


def column_normalized(logits: Tensor, src: Tensor, num_src: int) -> Tensor:
    """``'column'``: the softmax over each source's out-edges."""
    return _normalize_segments(logits, src, num_src).exp()


def sinkhorn_normalized(logits: Tensor, dst: Tensor, src: Tensor,
                        num_dst: int, num_src: int,
                        iterations: int = 3) -> Tensor:
    """``'sinkhorn'``: ``iterations`` times a column then a row normalisation,
    in log space (rows sum to 1 exactly)."""
    log_weights = logits
    for _ in range(iterations):
        log_weights = _normalize_segments(log_weights, src, num_src)
        log_weights = _normalize_segments(log_weights, dst, num_dst)
    return log_weights.exp()


def global_normalized(logits: Tensor, edge_graph: Tensor | None = None,
                      num_graphs: int | None = None) -> Tensor:
    """``'global'``: the softmax over all edges of each graph (``edge_graph``:
    the graph of each edge, :obj:`None` for one graph; ``num_graphs``: by
    default the largest graph index plus one)."""
    if edge_graph is None:
        edge_graph = logits.new_zeros(logits.size(0), dtype=torch.long)
        num_graphs = 1
    elif num_graphs is None:
        num_graphs = int(edge_graph.max()) + 1 if edge_graph.numel() else 0
    return _normalize_segments(logits, edge_graph, num_graphs).exp()


def normalize_edge_logits(
    logits: Tensor,
    normalization: str,
    dst: Tensor,
    src: Tensor,
    num_dst: int,
    num_src: int,
    edge_graph: Tensor | None = None,
    num_graphs: int | None = None,
    sinkhorn_iterations: int = 3,
    ptr: Tensor | None = None,
) -> Tensor:
    r"""Attention weights ``[E, H]`` from per-edge logits ``[E, H]`` by the
    named normalisation (one of the functions above).

    Args:
        logits (torch.Tensor): Logits :math:`s` of the edges ``[E, H]``.
        normalization (str): ``'row'``, ``'column'``, ``'sinkhorn'`` or
            ``'global'`` (see the module docstring).
        dst (torch.Tensor): Destination of each edge ``[E]``.
        src (torch.Tensor): Source of each edge ``[E]``.
        num_dst (int): Number of destination nodes.
        num_src (int): Number of source nodes.
        edge_graph (torch.Tensor, optional): Graph of each edge ``[E]`` for
            ``'global'`` (:obj:`None`: one graph).
        num_graphs (int, optional): Number of graphs (default: the largest
            index in ``edge_graph`` plus one).
        sinkhorn_iterations (int, optional): Column-then-row steps of
            ``'sinkhorn'``. (default: :obj:`3`)
        ptr (torch.Tensor, optional): CSR pointer of ``dst`` when the edges
            are sorted by destination (``'row'`` only, as PyG's softmax).
    """
    if normalization == 'row':
        return row_normalized(logits, dst, num_dst, ptr)
    if normalization == 'column':
        return column_normalized(logits, src, num_src)
    if normalization == 'sinkhorn':
        return sinkhorn_normalized(logits, dst, src, num_dst, num_src,
                                   sinkhorn_iterations)
    if normalization == 'global':
        return global_normalized(logits, edge_graph, num_graphs)
    check_normalization(normalization, sinkhorn_iterations)
    raise AssertionError  # unreachable: check_normalization raised


def attention_weights(logits: Tensor, edge_bias: Tensor | None,
                      dropout_mask: Tensor | None, normalization: str,
                      dst: Tensor, src: Tensor, num_dst: int, num_src: int,
                      edge_graph: Tensor | None = None,
                      sinkhorn_iterations: int = 3,
                      ptr: Tensor | None = None) -> Tensor:
    r"""Attention weights ``[E, H]`` of a graph layer: the logits plus
    ``edge_bias`` (``[E, H]``), normalised by :func:`normalize_edge_logits`,
    times ``dropout_mask`` (``[E, H]``, attention dropout). Other arguments
    as :func:`normalize_edge_logits`."""
    if edge_bias is not None:
        logits = logits + edge_bias.to(logits.dtype)
    alpha = normalize_edge_logits(
        logits, normalization, dst, src, num_dst, num_src, edge_graph,
        sinkhorn_iterations=sinkhorn_iterations, ptr=ptr)
    return alpha if dropout_mask is None else alpha * dropout_mask


def _normalize_dense_dims(log_weights: Tensor, dims: tuple[int, ...]) -> Tensor:
    """Dense counterpart of :func:`_normalize_segments` along ``dims``."""
    shift = _finite_shift(log_weights.detach().amax(dims, keepdim=True))
    total = (log_weights - shift).exp().sum(dims, keepdim=True)
    return _subtract_total(log_weights, _log_total(total, shift))


def normalize_dense_logits(logits: Tensor, normalization: str,
                           sinkhorn_iterations: int = 3) -> Tensor:
    r"""Attention weights ``[..., L, S]`` from a score matrix ``[..., L, S]``
    (queries along ``L``, keys along ``S``; masked entries :math:`-\infty`,
    which every normalisation leaves out). ``'global'`` normalises each
    ``[L, S]`` matrix (each batch element and head) to a total of 1."""
    if normalization == 'row':
        return torch.softmax(logits, dim=-1)
    if normalization == 'column':
        return _normalize_dense_dims(logits, (-2, )).exp()
    if normalization == 'global':
        return _normalize_dense_dims(logits, (-2, -1)).exp()
    if normalization == 'sinkhorn':
        log_weights = logits
        for _ in range(sinkhorn_iterations):
            log_weights = _normalize_dense_dims(log_weights, (-2, ))
            log_weights = _normalize_dense_dims(log_weights, (-1, ))
        return log_weights.exp()
    check_normalization(normalization, sinkhorn_iterations)
    raise AssertionError  # unreachable: check_normalization raised
