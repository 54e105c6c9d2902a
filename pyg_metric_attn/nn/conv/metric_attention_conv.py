r"""Metric-attention as a PyG message-passing layer."""
from __future__ import annotations

from typing import Any, overload

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.nn import Parameter
from torch_geometric.nn.conv import MessagePassing
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.nn.inits import zeros
from torch_geometric.typing import Adj, OptTensor, PairTensor, Size, SparseTensor
from torch_geometric.utils import to_dense_batch

from pyg_metric_attn.nn.edge_attention import (
    LayerGraph,
    check_backend,
    choose_backend,
    fused_attention,
    triton_attention,
)
from pyg_metric_attn.nn.functional import dense_metric_attention
from pyg_metric_attn.nn.normalization import attention_weights, check_normalization
from pyg_metric_attn.nn.pseudo_metric import check_metric, embed_pair, metric_maps
from pyg_metric_attn.nn.sparse_attention import gathered_logits
from pyg_metric_attn.nn.time_scale import TimeScale, resolve_time_scale
from pyg_metric_attn.utils.adjacency import (
    adjacency_to_edge_index,
    edge_features,
    edge_values_like,
    node_counts,
)
from pyg_metric_attn.utils.checks import (
    check_batch_vector,
    check_edge_attr,
    check_node_features,
)
from pyg_metric_attn.utils.point_sets import check_batch, point_set_mask


class MetricAttentionConv(MessagePassing):
    r"""Metric-attention over graph edges (Ruan & Zhang, "Towards understanding
    how attention mechanism works in deep learning", arXiv 2412.18288).

    For every head, node :math:`i` aggregates its in-neighbours :math:`j` with

    .. math::
        \alpha_{ij} = \frac{\exp(s_{ij})}{\sum_{k \in \mathcal{N}(i)}
        \exp(s_{ik})}, \qquad
        \mathbf{x}'_i = \sum_{j \in \mathcal{N}(i)} \alpha_{ij}\,
        \mathbf{W}_v \mathbf{x}_j,

    where the logit :math:`s_{ij}` comes from the chosen pseudo-metric:

    * ``'metric'``: :math:`s_{ij} = -\|\phi(\mathbf{x}_i) -
      \phi(\mathbf{x}_j)\|^2 / t` with the residual tanh MLP
      :math:`\phi(u) = P u + W_2 \tanh(W_1 u + b_1) + b_2` shared by both ends,
    * ``'l2'``: the same with a tied linear :math:`\phi(u) = W u`
      (L2 self-attention),
    * ``'dot'``: :math:`s_{ij} = (W_q \mathbf{x}_i)^\top (W_k \mathbf{x}_j) /
      (\sqrt{D}\, t)`, the dot-product self-attention baseline.

    Edge features add a learned per-head bias :math:`\mathbf{w}_h^\top
    \mathbf{e}_{ji}` to :math:`s_{ij}`. With ``value=False`` the layer is the
    paper's propagation :math:`H' = S H` (no value map; each head propagates the
    input features).

    The similarities :math:`K_{ij} = \exp(s_{ij})` are normalised by one of
    the paper's four normalisations (Definitions 7-10,
    :mod:`~pyg_metric_attn.nn.normalization`):

    * ``'row'`` (above): over each destination's in-edges,
      :math:`\alpha_{ij} = K_{ij} / \sum_{k \to i} K_{ik}`,
    * ``'column'``: over each source's out-edges,
      :math:`\alpha_{ij} = K_{ij} / \sum_{j \to k} K_{kj}`,
    * ``'sinkhorn'`` (two-side): ``sinkhorn_iterations`` times a column then
      a row normalisation (Sinkformers), so rows sum to 1 and columns
      approach 1 (doubly stochastic at convergence where the graph admits
      it, e.g. connected with self-loops),
    * ``'global'``: over all edges of each graph, :math:`\alpha_{ij} =
      K_{ij} / \sum_{(l \to k) \in G} K_{kl}` (the graphs of a mini-batch
      are told apart by ``forward``'s ``batch``).

    Args:
        in_channels (int or tuple): Size of each input sample, or ``(source,
            destination)`` sizes for bipartite graphs; ``-1`` infers it lazily.
            With unequal (or lazy) tuple sizes the tied maps of
            ``'metric'``/``'l2'`` become one map per side.
        out_channels (int): Size of each output sample per head.
        heads (int, optional): Number of attention heads. (default: :obj:`1`)
        concat (bool, optional): Concatenate the heads (else average them).
            (default: :obj:`True`)
        metric (str, optional): ``'metric'``, ``'l2'`` or ``'dot'``.
            (default: :obj:`'metric'`)
        metric_channels (int, optional): Size :math:`D` of :math:`\phi` (or of
            queries and keys) per head. (default: :obj:`out_channels`)
        mlp_channels (int, optional): Hidden width :math:`d_{mlp}` of
            :math:`\phi` for ``'metric'``. (default: ``heads *
            metric_channels``)
        time_scale (float or str, optional): The time scale :math:`t` of the
            heat kernel :math:`\exp(-d/t)`, or ``'matched'``: :math:`t =
            2\sqrt{D}` (:math:`1` for ``'dot'``), the logit scale of
            scaled dot-product attention
            (:func:`~pyg_metric_attn.nn.time_scale.matched_time_scale`).
            The default is the paper's :math:`t = 1`, which saturates beyond
            a few dimensions per head: from :math:`D \approx 8` on, each
            node attends almost only to its self-loop at initialisation (see
            :mod:`~pyg_metric_attn.nn.time_scale`). (default: :obj:`1.0`)
        learn_time_scale (bool, optional): Learn :math:`t` (kept positive by a
            log parametrisation, initialised at ``time_scale``).
            (default: :obj:`False`)
        value (bool, optional): Apply a learnable value map :math:`W_v` per
            head. If :obj:`False`, messages are the raw source features, which
            requires ``out_channels`` to equal the source ``in_channels``.
            (default: :obj:`True`)
        dropout (float, optional): Dropout probability of the attention
            weights. (default: :obj:`0.`)
        add_self_loops (bool, optional): Replace self-loops by one self-loop per
            node (as :class:`~torch_geometric.nn.conv.GATConv`).
            (default: :obj:`True`)
        edge_dim (int, optional): Edge feature size; edge features then bias
            the logits. (default: :obj:`None`)
        fill_value (float or torch.Tensor or str, optional): Edge features of
            added self-loops (see
            :meth:`torch_geometric.utils.add_self_loops`). (default: :obj:`'mean'`)
        bias (bool, optional): Learn an additive output bias.
            (default: :obj:`True`)
        residual (bool, optional): Add a linear map of the destination features
            to the output. (default: :obj:`False`)
        normalization (str, optional): ``'row'``, ``'column'``,
            ``'sinkhorn'`` or ``'global'`` (see above). Dropout acts on the
            normalised weights, ``aggr='mean'`` divides by the in-degree
            after any of them. The dense :meth:`forward_point_sets` runs
            the others on an explicit ``[B, H, L, L]`` score matrix
            (:math:`O(L^2)` memory per set). (default: :obj:`'row'`)
        sinkhorn_iterations (int, optional): Column-then-row steps of
            ``'sinkhorn'``. (default: :obj:`3`)
        backend (str, optional): How the attention runs; all compute the same
            function. ``'fused'``: segment softmax and sparse products on a CSR
            view, :math:`E \times H` memory per edge
            (:mod:`~pyg_metric_attn.nn.sparse_attention`); ``'triton'``: one
            fused GPU kernel with an online softmax, no per-edge tensor
            (:mod:`~pyg_metric_attn.nn.triton`, needs
            ``pip install pyg-metric-attn[gpu]``); ``'scatter'``: PyG message
            passing with :math:`E \times H \times C` messages, which runs PyG's
            message hooks, explain mode and any ``aggr``. ``'auto'`` takes
            ``'triton'`` on CUDA where Triton is installed, ``'fused'`` on CPU
            in float32/float64, else ``'scatter'``. Every backend falls back to
            ``'scatter'`` while hooks or explain mode need the messages;
            ``'auto'`` takes it for an ``aggr`` other than
            ``'add'``/``'sum'``/``'mean'`` (which ``'fused'`` and
            ``'triton'`` refuse), under :func:`torch.compile` where
            ``'triton'`` does not apply, and under :func:`torch.jit.trace`
            (which cannot trace the other two).
            ``'triton'`` computes only ``normalization='row'`` (``'auto'``
            then takes ``'fused'`` or ``'scatter'``). (default: :obj:`'auto'`)
        **kwargs (optional): Additional arguments of
            :class:`torch_geometric.nn.conv.MessagePassing`.

    Shapes:
        - **input:** node features :math:`(|\mathcal{V}|, F_{in})` or
          :math:`((|\mathcal{V_s}|, F_{s}), (|\mathcal{V_t}|, F_{t}))`,
          edge indices :math:`(2, |\mathcal{E}|)` (a tensor or an
          :class:`~torch_geometric.EdgeIndex`; or a sparse adjacency, whose
          values are the edge features when ``edge_dim`` is set and no
          ``edge_attr`` is given),
          edge features :math:`(|\mathcal{E}|, D_e)` *(optional)*, ``batch``
          :math:`(|\mathcal{V}_t|)` *(optional, ``'global'`` only)*
        - **output:** node features :math:`(|\mathcal{V}_t|, H F_{out})` if
          ``concat`` else :math:`(|\mathcal{V}_t|, F_{out})`; with
          ``return_attention_weights`` as
          :class:`~torch_geometric.nn.conv.GATConv` returns them:
          ``(edge_index, alpha)`` with ``alpha`` of shape
          :math:`(|\mathcal{E}|, H)`, ``(adj, alpha)`` for a ``torch.sparse``
          adjacency, or the ``SparseTensor`` holding ``alpha``
    """
    def __init__(
        self,
        in_channels: int | tuple[int, int],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        metric: str = 'metric',
        metric_channels: int | None = None,
        mlp_channels: int | None = None,
        time_scale: float | str = 1.0,
        learn_time_scale: bool = False,
        value: bool = True,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        edge_dim: int | None = None,
        fill_value: float | Tensor | str = 'mean',
        bias: bool = True,
        residual: bool = False,
        normalization: str = 'row',
        sinkhorn_iterations: int = 3,
        backend: str = 'auto',
        **kwargs: Any,
    ):
        kwargs.setdefault('aggr', 'add')
        super().__init__(node_dim=0, **kwargs)

        src_channels, dst_channels = ((in_channels, in_channels)
                                      if isinstance(in_channels, int) else
                                      tuple(in_channels))
        for name, size in (('heads', heads), ('out_channels', out_channels),
                           ('metric_channels', metric_channels),
                           ('mlp_channels', mlp_channels)):
            if size is not None and (not isinstance(size, int) or size < 1):
                raise ValueError(f"'{name}' must be a positive integer, got "
                                 f"{size!r}")
        check_normalization(normalization, sinkhorn_iterations)
        check_backend(backend, self.aggr, normalization)
        if not value and src_channels > 0 and out_channels != src_channels:
            raise ValueError(
                f"'value=False' propagates the input features unchanged, so "
                f"'out_channels' ({out_channels}) must equal the source "
                f"'in_channels' ({src_channels})")

        self.in_channels = in_channels
        self.out_channels = out_channels
        self.heads = heads
        self.concat = concat
        self.metric = check_metric(metric)
        self.metric_channels = metric_channels or out_channels
        self.mlp_channels = mlp_channels or heads * self.metric_channels
        self.time = TimeScale(resolve_time_scale(
            time_scale, self.metric, self.metric_channels), learn_time_scale)
        self.value = value
        self.dropout = dropout
        self.add_self_loops = add_self_loops
        self.edge_dim = edge_dim
        self.fill_value = fill_value
        self.residual = residual
        self.normalization = normalization
        self.sinkhorn_iterations = sinkhorn_iterations
        self.backend = backend
        self._src_channels = src_channels
        self._dst_channels = dst_channels

        # Maps to the metric space: `embed_dst` is None when both ends share
        # `embed_src` (the tied maps of 'metric' and 'l2').
        embed_channels = heads * self.metric_channels
        self.embed_src, self.embed_dst = metric_maps(
            self.metric, src_channels, dst_channels, embed_channels,
            self.mlp_channels, separate=not isinstance(in_channels, int)
            and (src_channels != dst_channels or src_channels < 0))

        self.lin_value = (Linear(src_channels, heads * out_channels, bias=False,
                                 weight_initializer='glorot') if value else None)
        self.lin_edge = (Linear(edge_dim, heads, bias=False,
                                weight_initializer='glorot')
                         if edge_dim is not None else None)

        total_out_channels = out_channels * (heads if concat else 1)
        self.res = (Linear(dst_channels, total_out_channels, bias=False,
                           weight_initializer='glorot') if residual else None)
        if bias:
            self.bias = Parameter(torch.empty(total_out_channels))
        else:
            self.register_parameter('bias', None)

        self.reset_parameters()

    def reset_parameters(self) -> None:
        super().reset_parameters()
        for module in (self.embed_src, self.embed_dst, self.lin_value,
                       self.lin_edge, self.res):
            if module is not None:
                module.reset_parameters()
        self.time.reset_parameters()
        zeros(self.bias)

    @property
    def time_scale(self) -> Tensor | float:
        """The time scale :math:`t` (a tensor when it is learned)."""
        return self.time()

    @overload
    def forward(self, x: Tensor | tuple[Tensor, Tensor | None],
                edge_index: Adj, edge_attr: OptTensor = None,
                size: Size = None,
                return_attention_weights: None = None,
                *, batch: OptTensor = None) -> Tensor:
        ...

    @overload
    def forward(self, x: Tensor | tuple[Tensor, Tensor | None],
                edge_index: Tensor, edge_attr: OptTensor = None,
                size: Size = None,
                return_attention_weights: bool = ...,
                *, batch: OptTensor = None,
                ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        ...

    @overload
    def forward(self, x: Tensor | tuple[Tensor, Tensor | None],
                edge_index: SparseTensor, edge_attr: OptTensor = None,
                size: Size = None,
                return_attention_weights: bool = ...,
                *, batch: OptTensor = None,
                ) -> tuple[Tensor, SparseTensor]:
        ...

    def forward(
        self,
        x: Tensor | tuple[Tensor, Tensor | None],
        edge_index: Adj,
        edge_attr: OptTensor = None,
        size: Size = None,
        return_attention_weights: bool | None = None,
        *,
        batch: OptTensor = None,
    ) -> Tensor | tuple[Tensor, Any]:
        r"""Runs the layer.

        Args:
            x (torch.Tensor or (torch.Tensor, torch.Tensor or None)): Node
                features, or ``(source, destination)`` features. With
                ``(x, None)`` the destination nodes are the first
                ``size[1]`` source nodes (the PyG sampled-subgraph convention).
            edge_index (torch.Tensor or EdgeIndex or SparseTensor or
                torch.sparse.Tensor): The graph; sparse adjacencies are
                indexed ``[dst, src]`` and their values are the edge features
                when ``edge_dim`` is set and ``edge_attr`` is not.
            edge_attr (torch.Tensor, optional): Edge features (needs
                ``edge_dim``), ordered like the edges (a sparse adjacency's
                non-zeros, whose values then only mark the pattern).
            size ((int, int), optional): ``(num_src, num_dst)``.
            return_attention_weights (bool, optional): If :obj:`True`, also
                return the attention weights as
                :class:`~torch_geometric.nn.conv.GATConv` does (see Shapes).
            batch (torch.Tensor, optional): The graph of each destination node
                ``[N_dst]`` (PyG's ``batch`` vector; an edge belongs to its
                destination's graph), for ``normalization='global'`` only;
                :obj:`None` means one graph.
        """
        x_src, x_dst = (x, x) if isinstance(x, Tensor) else x
        adjacency = adjacency_to_edge_index(edge_index)
        if self.lin_edge is not None:
            edge_attr = edge_features(adjacency, edge_attr)
        num_src, num_dst = node_counts(adjacency, x_src.size(0), x_dst, size)
        if x_dst is None:
            x_dst = x_src[:num_dst]
        # What depends only on the graph (index check, self-loops, sorted
        # views) is built once per caller's graph tensor.
        graph = LayerGraph(adjacency.edge_index, num_src, num_dst,
                           self.add_self_loops)
        if not torch.compiler.is_compiling():
            self._check_inputs(x_src, x_dst, graph, edge_attr)
            self._check_batch(batch, num_dst)
        if edge_attr is not None and edge_attr.dim() == 1:
            edge_attr = edge_attr.view(-1, 1)
        edge_index = graph.edge_index
        edge_attr = graph.edge_attr(edge_attr, self.fill_value)

        z_src, z_dst = self._embed(x_src, x_dst)  # [N, H, D]
        values = self._values(x_src)  # [N_src, H, C]
        edge_bias = (self.lin_edge(edge_attr)  # [E, H]
                     if self.lin_edge is not None and edge_attr is not None
                     else None)
        edge_graph = None if batch is None else batch.long()[edge_index[1]]  # [E]

        backend = choose_backend(self.backend, self, values, self.normalization)
        need_weights = bool(return_attention_weights)
        if backend == 'scatter':
            logits = gathered_logits(z_dst, z_src, edge_index, self.metric,
                                     self.time_scale)  # [E, H] float64
            alpha = self.edge_updater(
                edge_index, logits=logits, edge_bias=edge_bias,
                dropout_mask=self._dropout_mask(edge_index.size(1), z_src),
                edge_graph=edge_graph, size=(num_src, num_dst)).to(z_src.dtype)
            out = self.propagate(edge_index, x=(values, None), alpha=alpha,
                                 size=(num_src, num_dst))
        elif backend == 'fused':
            out, alpha = fused_attention(
                graph, z_dst, z_src, values, self.metric, self.time_scale,
                edge_bias, self._dropout_mask(edge_index.size(1), z_src),
                self.normalization, self.sinkhorn_iterations, edge_graph,
                mean=self.aggr == 'mean', need_weights=need_weights)
        else:
            out, alpha = triton_attention(
                graph, z_dst, z_src, values, self.metric, self.time_scale,
                edge_bias, self.dropout if self.training else 0.0,
                mean=self.aggr == 'mean', need_weights=need_weights)

        out = self._combine_heads(out, x_dst)
        if return_attention_weights:
            # A copy: the caller may write to it, the cache must not see that.
            return out, edge_values_like(adjacency, edge_index.clone(), alpha,
                                         num_src, num_dst)
        return out

    def forward_point_sets(self, x: Tensor, batch: OptTensor = None) -> Tensor:
        r"""All-pairs attention among the points of each set.

        Equals ``forward(x, fully_connected_edge_index(x.size(0), batch))``
        (every point attends to every point of its set, itself included;
        ``batch=batch`` as well for ``'global'``) but never builds the
        :math:`n^2` edges: it runs the dense SDPA kernel of
        :func:`~pyg_metric_attn.nn.functional.dense_metric_attention`
        (normalisations other than ``'row'``: an explicit ``[B, H, L, L]``
        score matrix, padding left out of every normalisation).

        Args:
            x (torch.Tensor): Point features ``[N, F_in]``.
            batch (torch.Tensor, optional): Sorted set index of each point
                (checked outside :func:`torch.compile`); :obj:`None` means one
                set.
        """
        if not torch.compiler.is_compiling():
            check_node_features(x, 'x', self._src_channels)
            if batch is not None:
                check_batch(batch, x.size(0))
        if not isinstance(self.in_channels, int):
            raise ValueError("Point-set attention runs within one set of points: "
                             "build the layer with an int 'in_channels'")
        z_src, z_dst = self._embed(x, x)
        values = self._values(x)
        key, mask = self._to_sets(z_src, batch)  # [B, H, L, D], [B, L]
        query = key if z_dst is z_src else self._to_sets(z_dst, batch)[0]
        attn_mask = point_set_mask(mask, self.normalization)
        out, _ = dense_metric_attention(
            query, key, self._to_sets(values, batch)[0].to(key.dtype),
            self.metric, self.time_scale, attn_mask=attn_mask,
            dropout_p=self.dropout if self.training else 0.0,
            normalization=self.normalization,
            sinkhorn_iterations=self.sinkhorn_iterations)
        out = out.transpose(1, 2)[mask].to(values.dtype)  # [N, H, C]
        return self._combine_heads(out, x)

    def _to_sets(self, per_point: Tensor, batch: OptTensor) -> tuple[Tensor, Tensor]:
        """``[N, H, K]`` -> padded ``[B, H, L, K]`` and the ``[B, L]`` mask."""
        dense, mask = to_dense_batch(per_point.flatten(1), batch)
        dense = dense.view(mask.size(0), mask.size(1), self.heads, -1)
        return dense.transpose(1, 2), mask

    def _combine_heads(self, out: Tensor, x_dst: Tensor) -> Tensor:
        """Concatenate or average heads, then add residual and bias."""
        out = out.flatten(1) if self.concat else out.mean(dim=1)
        if self.res is not None:
            out = out + self.res(x_dst)
        if self.bias is not None:
            out = out + self.bias
        return out

    def _check_inputs(self, x_src: Tensor, x_dst: Tensor, graph: LayerGraph,
                      edge_attr: OptTensor) -> None:
        check_node_features(x_src, 'x' if x_src is x_dst else 'x_src',
                            self._src_channels)
        if not self.value and x_src.size(1) != self.out_channels:
            raise ValueError(
                f"'value=False' propagates the input features unchanged, so "
                f"the {x_src.size(1)} source channels must equal "
                f"'out_channels' ({self.out_channels})")
        if x_dst is not x_src:
            check_node_features(x_dst, 'x_dst', self._dst_channels)
            if x_dst.size(0) != graph.num_dst:
                raise ValueError(f"'x_dst' has {x_dst.size(0)} rows but the "
                                 f"graph has {graph.num_dst} destination nodes")
        graph.check()
        if edge_attr is not None:
            if self.lin_edge is None:
                raise ValueError("'edge_attr' was given but the layer was built "
                                 "without 'edge_dim'")
            check_edge_attr(edge_attr, graph.source.size(1), self.edge_dim)

    def _check_batch(self, batch: OptTensor, num_dst: int) -> None:
        """``batch`` must be given only for ``'global'``, as an integer
        ``[num_dst]`` graph index of the destination nodes."""
        if batch is None:
            return
        if self.normalization != 'global':
            raise ValueError(f"'batch' tells the graphs apart for "
                             f"normalization='global'; this layer normalises "
                             f"by {self.normalization!r}, which 'batch' would "
                             f"not change: leave it out")
        check_batch_vector(batch, num_dst)

    def _embed(self, x_src: Tensor, x_dst: Tensor) -> PairTensor:
        """Source and destination points in the metric space, ``[N, H, D]``."""
        shape = (-1, self.heads, self.metric_channels)
        z_src, z_dst = embed_pair(self.embed_src, self.embed_dst, x_src, x_dst)
        # Logits in at least float32, also under float16/bfloat16 autocast.
        dtype = torch.promote_types(z_src.dtype, torch.float32)
        points = z_src.to(dtype).view(shape)
        # One tensor for both ends of a tied map (``query is key`` downstream:
        # centred once, its blocks built and kept once).
        return points, points if z_dst is z_src else z_dst.to(dtype).view(shape)

    def _values(self, x_src: Tensor) -> Tensor:
        """What each source node sends, ``[N_src, H, C]``."""
        if self.lin_value is None:
            return x_src.unsqueeze(1).expand(-1, self.heads, -1)
        return self.lin_value(x_src).view(-1, self.heads, self.out_channels)

    def _dropout_mask(self, num_edges: int, like: Tensor) -> Tensor | None:
        """Attention dropout as a factor ``[E, H]`` on the weights (one draw
        shared by the scatter and fused backends)."""
        if not self.training or self.dropout == 0.0:
            return None
        return F.dropout(like.new_ones(num_edges, self.heads), p=self.dropout)

    def edge_update(self, logits: Tensor, edge_bias: OptTensor,
                    dropout_mask: OptTensor, edge_graph: OptTensor,
                    index: Tensor, edge_index_j: Tensor, ptr: OptTensor,
                    size_i: int | None, size_j: int | None) -> Tensor:
        return attention_weights(
            logits, edge_bias, dropout_mask, self.normalization, index,
            edge_index_j, size_i, size_j, edge_graph, self.sinkhorn_iterations,
            ptr)

    def message(self, x_j: Tensor, alpha: Tensor) -> Tensor:
        return alpha.unsqueeze(-1).to(x_j.dtype) * x_j

    def __repr__(self) -> str:
        return (f'{self.__class__.__name__}({self.in_channels}, '
                f'{self.out_channels}, heads={self.heads}, '
                f'metric={self.metric!r}'
                + (f', normalization={self.normalization!r})'
                   if self.normalization != 'row' else ')'))

