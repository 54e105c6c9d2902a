r"""Attention over a graph's edges: the graph a layer runs on, and the choice
and the run of its backend.

:class:`~pyg_metric_attn.nn.MetricAttentionConv` computes one function
three ways: ``'scatter'`` (PyG message passing, in the layer), ``'fused'``
(segment softmax and sparse products on a CSR view,
:mod:`~pyg_metric_attn.nn.sparse_attention`) and ``'triton'`` (one fused GPU
kernel, :mod:`~pyg_metric_attn.nn.triton`). :func:`choose_backend`
picks the one of a call and :func:`fused_attention` and
:func:`triton_attention` run the two kernels.

Everything that depends only on the graph lives in :class:`LayerGraph`, built
once per graph: the index check, the graph with its self-loops replaced, the
destination-sorted CSR and its transpose (or the graph prepared for the
Triton kernels). It is the one owner of the graph
cache's keys (:mod:`~pyg_metric_attn.utils.graph_cache`), so each key says
every transform the structure went through.
"""
from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TypeVar

import torch
from torch import Tensor
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.typing import OptTensor
from torch_geometric.utils import add_self_loops

from pyg_metric_attn.nn.normalization import attention_weights
from pyg_metric_attn.nn.sparse_attention import (
    SparseAggregate,
    block_logits,
    sparse_metric_attention,
)
from pyg_metric_attn.nn.triton import (
    HAVE_TRITON,
    TritonGraph,
    prepare_triton_graph,
    triton_metric_attention,
)
from pyg_metric_attn.utils.checks import check_edge_index
from pyg_metric_attn.utils.csr import HeadBlockCSR, sort_by_segment
from pyg_metric_attn.utils.graph_cache import cached

T = TypeVar('T')

BACKENDS = ('auto', 'fused', 'scatter', 'triton')
#: Aggregations the fused and Triton kernels compute.
FUSED_AGGREGATIONS = ('add', 'sum', 'mean')
#: Dtypes of the Triton kernel's inputs.
TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# MessagePassing's hook registries: any hook needs the per-edge messages.
MESSAGE_PASSING_HOOKS = (
    '_propagate_forward_pre_hooks', '_propagate_forward_hooks',
    '_message_forward_pre_hooks', '_message_forward_hooks',
    '_aggregate_forward_pre_hooks', '_aggregate_forward_hooks',
    '_edge_update_forward_pre_hooks', '_edge_update_forward_hooks')


def check_backend(backend: str, aggr: object, normalization: str) -> None:
    """Raise :class:`ValueError` unless ``backend`` is known and computes
    ``aggr`` and ``normalization`` (``'auto'`` and ``'scatter'`` compute all)."""
    if backend not in BACKENDS:
        raise ValueError(f"Unknown backend '{backend}'; expected one of "
                         f"{BACKENDS}")
    if backend in ('fused', 'triton') and aggr not in FUSED_AGGREGATIONS:
        raise ValueError(f"backend='{backend}' computes aggr 'add', 'sum' "
                         f"or 'mean', got aggr={aggr!r}; use "
                         f"backend='scatter' or 'auto'")
    if backend == 'triton' and normalization != 'row':
        raise ValueError(f"backend='triton' computes normalization='row' "
                         f"only, got normalization={normalization!r}; use "
                         f"backend='fused', 'scatter' or 'auto'")


def choose_backend(backend: str, layer: MessagePassing, values: Tensor,
                   normalization: str) -> str:
    """The backend of one call of ``layer`` (see ``backend`` in
    :class:`~pyg_metric_attn.nn.MetricAttentionConv`): the requested
    one, ``'scatter'`` while hooks or explain mode need the messages, and
    for ``'auto'`` the fastest one that computes the call."""
    if torch.jit.is_tracing():
        if backend in ('fused', 'triton'):
            raise RuntimeError(
                f"backend='{backend}' cannot be traced by torch.jit.trace "
                f"(its sparse kernels are opaque to the tracer); trace "
                f"backend='auto' or 'scatter'")
        return 'scatter'
    if (backend == 'scatter' or layer.explain
            or layer.aggr not in FUSED_AGGREGATIONS
            or any(getattr(layer, name) for name in MESSAGE_PASSING_HOOKS)):
        return 'scatter'
    if backend != 'auto':
        return backend
    if (values.device.type == 'cuda' and HAVE_TRITON
            and values.dtype in TRITON_DTYPES and normalization == 'row'):
        return 'triton'  # custom operators: one graph under torch.compile too
    if torch.compiler.is_compiling():
        return 'scatter'  # the fused kernels are opaque to torch.compile
    if (values.device.type == 'cpu'
            and values.dtype in (torch.float32, torch.float64)):
        return 'fused'
    return 'scatter'


class LayerGraph:
    r"""The caller's graph as a layer runs on it, with what derives from it
    built once per graph.

    Every structure is cached on ``source`` (the caller's ``[2, E]`` tensor,
    see :mod:`~pyg_metric_attn.utils.graph_cache`) under a key made here
    from the node counts, the self-loop policy and the structure's own
    parameters.

    Args:
        source (torch.Tensor): The caller's plain ``edge_index`` ``[2, E]``.
        num_src (int): Number of source nodes.
        num_dst (int): Number of destination nodes.
        self_loops (bool): Replace the self-loops by one per destination
            node among the sources (as :class:`~torch_geometric.nn.conv.GATConv`).
    """
    def __init__(self, source: Tensor, num_src: int, num_dst: int,
                 self_loops: bool):
        self.source = source
        self.num_src, self.num_dst = num_src, num_dst
        self.self_loops = self_loops
        self._with_loops: tuple[Tensor, Tensor] | None = None

    def _cached(self, what: str, build: Callable[[], T], *params: Hashable) -> T:
        return cached(self.source, (what, self.num_src, self.num_dst,
                                    self.self_loops, *params), build)

    def check(self) -> None:
        """Raise unless ``source`` is an integer ``[2, E]`` index in range
        (checked once per graph: a bad index never reaches a kernel)."""
        self._cached('checked', lambda: check_edge_index(
            self.source, self.num_src, self.num_dst))

    @property
    def edge_index(self) -> Tensor:
        """The edges the layer runs on, ``[2, E']`` int64: the caller's, or
        where ``self_loops`` those that are no self-loop followed by one
        self-loop per node."""
        if not self.self_loops:
            return self.source.long()  # (no entry may hold `source` itself)
        return self._loops()[0]

    def edge_attr(self, edge_attr: OptTensor,
                  fill_value: float | Tensor | str) -> OptTensor:
        """The caller's ``[E, D]`` edge features on :attr:`edge_index`
        (added self-loops get ``fill_value``, as in
        :func:`torch_geometric.utils.add_self_loops`)."""
        if edge_attr is None or not self.self_loops:
            return edge_attr
        edge_index, kept = self._loops()
        loop_free = edge_index[:, :kept.numel()]
        return add_self_loops(loop_free, edge_attr.index_select(0, kept),
                              fill_value=fill_value,
                              num_nodes=min(self.num_src, self.num_dst))[1]

    def _loops(self) -> tuple[Tensor, Tensor]:
        """``(edge_index, kept)``: the edges with self-loops replaced, and
        the caller's edges they start with (the added loops follow); kept
        for this call also where nothing is cached (inference mode)."""
        def build() -> tuple[Tensor, Tensor]:
            edge_index = self.source.long()
            kept = (edge_index[0] != edge_index[1]).nonzero().view(-1)
            return static(add_self_loops(edge_index.index_select(1, kept),
                                         num_nodes=min(self.num_src,
                                                       self.num_dst))[0],
                          kept)
        if self._with_loops is None:
            self._with_loops = self._cached('self_loops', build)
        return self._with_loops

    def csr(self, heads: int) -> HeadBlockCSR:
        """:attr:`edge_index` as the CSR pattern of ``heads`` heads and its
        transpose (the fused backend)."""
        return self._cached('csr', lambda: HeadBlockCSR(
            self.edge_index, self.num_src, self.num_dst, heads), heads)

    def triton_graph(self) -> tuple[Tensor, TritonGraph]:
        """``(perm, graph)`` of :attr:`edge_index` (the Triton backend): the
        edges sorted by destination (stably), and that CSR graph prepared for
        the kernels (checked, transposed, scheduled:
        :func:`~pyg_metric_attn.nn.triton.prepare_triton_graph`)."""
        def build() -> tuple[Tensor, TritonGraph]:
            edge_index = self.edge_index
            perm, ptr = sort_by_segment(edge_index[1], self.num_dst)
            prepared = prepare_triton_graph(
                ptr, edge_index[0].index_select(0, perm), self.num_src)
            static(*prepared.tensors())
            return static(perm)[0], prepared
        return self._cached('triton_graph', build)


def static(*tensors: Tensor) -> tuple[Tensor, ...]:
    """``tensors``, marked (outside :func:`torch.compile`) as static inputs
    of a compiled graph: cached structures that CUDA graphs
    (``mode='reduce-overhead'``) read in place instead of copying them in at
    every replay (:mod:`~pyg_metric_attn.utils.graph_cache`)."""
    if not torch.compiler.is_compiling():
        for tensor in tensors:
            torch._dynamo.mark_static_address(tensor)
    return tensors


def mean_over_edges(out: Tensor, ptr: Tensor) -> Tensor:
    """``aggr='mean'``: each node's sum ``[N_dst, H, C]`` divided by its
    in-degree (at least 1, as PyG's mean aggregation) from the CSR pointer."""
    degree = ptr.diff().clamp(min=1).view(-1, 1, 1)
    return out / degree.to(out.dtype)


@torch.compiler.disable  # sparse CSR kernels: opaque to torch.compile
def fused_attention(graph: LayerGraph, query: Tensor, key: Tensor,
                    value: Tensor, metric: str, time_scale: float | Tensor,
                    edge_bias: OptTensor = None, dropout_mask: OptTensor = None,
                    normalization: str = 'row', sinkhorn_iterations: int = 3,
                    edge_graph: OptTensor = None, mean: bool = False,
                    need_weights: bool = False) -> tuple[Tensor, OptTensor]:
    r"""The fused backend: ``(out [N_dst, H, C], weights [E', H] or None)``
    in the order of :attr:`LayerGraph.edge_index`.

    ``'row'`` runs the fused segment softmax
    (:func:`~pyg_metric_attn.nn.sparse_attention.sparse_metric_attention`);
    the other normalisations take the whole logits to edge order, normalise
    them as the scatter backend does
    (:func:`~pyg_metric_attn.nn.normalization.attention_weights`) and
    aggregate with the same sparse product.

    Args:
        graph (LayerGraph): The graph.
        query (torch.Tensor): Destination points ``[N_dst, H, D]``.
        key (torch.Tensor): Source points ``[N_src, H, D]``.
        value (torch.Tensor): Source values ``[N_src, H, C]``.
        metric (str): ``'metric'``, ``'l2'`` or ``'dot'``.
        time_scale (float or torch.Tensor): The time scale :math:`t`.
        edge_bias (torch.Tensor, optional): Logit bias ``[E', H]``.
        dropout_mask (torch.Tensor, optional): Factor on the weights
            ``[E', H]``.
        normalization (str, optional): See
            :func:`~pyg_metric_attn.nn.normalization.normalize_edge_logits`.
        sinkhorn_iterations (int, optional): Steps of ``'sinkhorn'``.
        edge_graph (torch.Tensor, optional): Graph of each edge ``[E']``
            (``'global'``).
        mean (bool, optional): Divide by the in-degree (``aggr='mean'``).
        need_weights (bool, optional): Return the weights.
    """
    csr = graph.csr(query.size(1))
    if normalization == 'row':
        out, weights = sparse_metric_attention(
            query, key, value, csr, metric, time_scale, edge_bias,
            dropout_mask)
        weights = csr.to_edges(weights) if need_weights else None
    else:
        edge_index = graph.edge_index
        logits = csr.to_edges(block_logits(  # [E', H]
            query, key, csr, metric, time_scale, row_term=True))
        alpha = attention_weights(
            logits, edge_bias, dropout_mask, normalization, edge_index[1],
            edge_index[0], graph.num_dst, graph.num_src, edge_graph,
            sinkhorn_iterations)
        out = SparseAggregate.apply(csr, csr.from_edges(alpha),
                                    value.to(alpha.dtype))
        weights = alpha.to(key.dtype) if need_weights else None
    out = out.to(value.dtype)
    return (mean_over_edges(out, csr.ptr) if mean else out), weights


def triton_attention(graph: LayerGraph, query: Tensor, key: Tensor,
                     value: Tensor, metric: str, time_scale: float | Tensor,
                     edge_bias: OptTensor = None, dropout_p: float = 0.0,
                     mean: bool = False,
                     need_weights: bool = False) -> tuple[Tensor, OptTensor]:
    """The Triton backend: ``(out [N_dst, H, C], weights [E', H] or None)``
    in the order of :attr:`LayerGraph.edge_index`. Queries and keys enter in
    the values' dtype (the kernel accumulates in float32); dropout
    (probability ``dropout_p``) is drawn inside the kernel. Arguments as
    :func:`fused_attention`."""
    perm, prepared = graph.triton_graph()
    dtype = value.dtype
    out, weights = triton_metric_attention(
        query.to(dtype), key.to(dtype), value, metric=metric, time_scale=time_scale,
        edge_bias=None if edge_bias is None else edge_bias.index_select(0, perm),
        dropout_p=dropout_p, need_weights=need_weights, graph=prepared)
    if mean:
        out = mean_over_edges(out, prepared.rowptr)
    if weights is None:
        return out, None
    # In at least float32, as the other backends return them.
    weights = weights.to(torch.promote_types(weights.dtype, torch.float32))
    return out, torch.empty_like(weights).index_copy_(0, perm, weights)
