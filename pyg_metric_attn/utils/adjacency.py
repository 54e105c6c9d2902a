"""Conversions between PyG's adjacency formats and a plain ``edge_index``.

Layers accept ``edge_index`` (``[2, E]``, row 0 = source, row 1 = destination,
a plain tensor or PyG's :class:`~torch_geometric.EdgeIndex`),
``torch_sparse.SparseTensor`` and ``torch.sparse`` COO/CSR/CSC tensors. Sparse
adjacencies follow PyG's transposed convention: entry ``(i, j)`` is the edge
``j -> i`` (rows are destinations). :func:`adjacency_to_edge_index` turns any of
them into an ``edge_index`` (keeping the adjacency's values, which attention
layers read as edge features: :func:`edge_features`), :func:`node_counts`
reads the number of source and destination nodes, and
:func:`edge_values_like` returns per-edge values in the caller's format, as
:class:`~torch_geometric.nn.conv.GATConv` returns attention weights.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch_geometric import EdgeIndex
from torch_geometric.typing import Size, SparseTensor
from torch_geometric.utils import (
    is_torch_sparse_tensor,
    to_edge_index,
    to_torch_coo_tensor,
    to_torch_csc_tensor,
    to_torch_csr_tensor,
)


class Adjacency(NamedTuple):
    """A graph as ``edge_index`` plus what is needed to return to its format."""
    edge_index: Tensor
    layout: str  # 'edge_index' | 'sparse_tensor' | torch sparse layout name
    num_src: int | None
    num_dst: int | None
    value: Tensor | None = None  # [E] or [E, D] values of a sparse adjacency


def adjacency_to_edge_index(adj: Any) -> Adjacency:
    """Return ``adj`` as an ``edge_index`` (``[2, E]``, source row first), a
    plain tensor: an :class:`~torch_geometric.EdgeIndex` gives its data
    (zero-copy, the same tensor at every call), so kernels that read raw
    pointers never see the subclass."""
    if isinstance(adj, EdgeIndex):
        num_src, num_dst = adj.sparse_size()
        return Adjacency(adj.as_tensor(), 'edge_index', num_src, num_dst)
    if isinstance(adj, SparseTensor):
        dst, src, value = adj.coo()
        num_dst, num_src = adj.sparse_sizes()
        return Adjacency(torch.stack([src, dst]), 'sparse_tensor', num_src,
                         num_dst, value)
    if is_torch_sparse_tensor(adj):
        dst_src, value = to_edge_index(adj)
        num_dst, num_src = int(adj.size(0)), int(adj.size(1))
        return Adjacency(dst_src.flip(0), str(adj.layout), num_src, num_dst,
                         value)
    if isinstance(adj, Tensor):
        return Adjacency(adj, 'edge_index', None, None)
    raise TypeError(
        "'edge_index' must be a [2, E] tensor, a SparseTensor or a torch.sparse "
        f"tensor, got {type(adj).__name__}")


def edge_features(adjacency: Adjacency, edge_attr: Tensor | None) -> Tensor | None:
    """The edge features of a layer that reads them: ``edge_attr``, or the
    values of a sparse adjacency (as PyG's attention layers). Beside an
    ``edge_attr`` (ordered like the adjacency's non-zeros) the values only
    mark the pattern, as in PyG, unless they are edge features themselves
    (multi-dimensional)."""
    if adjacency.value is None:
        return edge_attr
    if edge_attr is None:
        return adjacency.value
    if adjacency.value.dim() > 1:
        raise ValueError(
            f"Edge features were given twice: as 'edge_attr' and as the "
            f"{list(adjacency.value.shape)} values of the sparse adjacency; "
            f"pass one of them")
    return edge_attr


def node_counts(adjacency: Adjacency, num_src: int, x_dst: Tensor | None,
                size: Size) -> tuple[int, int]:
    """``(num_src, num_dst)`` of a layer's call with ``num_src`` source
    features, from ``size``, the adjacency's own size, the destination
    features ``x_dst`` (:obj:`None`: the first ``num_dst`` sources, PyG's
    sampled-subgraph convention), in that order."""
    if size is not None:
        num_dst = size[1]
        if size[0] is not None and size[0] != num_src:
            raise ValueError(f"'size[0]' ({size[0]}) does not match the "
                             f"{num_src} source nodes in 'x'")
    elif adjacency.num_dst is not None:
        num_dst = adjacency.num_dst
    elif x_dst is not None:
        num_dst = x_dst.size(0)
    else:
        num_dst = num_src
    if x_dst is None and num_dst > num_src:
        raise ValueError(f"With 'x=(x_src, None)' the {num_dst} destination "
                         f"nodes must be among the {num_src} source nodes")
    if adjacency.num_src is not None and adjacency.num_src != num_src:
        raise ValueError(f"The adjacency has {adjacency.num_src} columns "
                         f"(source nodes) but 'x' has {num_src} rows")
    return num_src, num_dst


def edge_values_like(adjacency: Adjacency, edge_index: Tensor, value: Tensor,
                     num_src: int, num_dst: int) -> Any:
    """Per-edge ``value`` (``[E, ...]``) on ``edge_index`` in ``adjacency``'s
    format: ``(edge_index, value)``; for a ``SparseTensor`` one holding
    ``value``; for a ``torch.sparse`` adjacency ``(adj, adj_values)`` with the
    values in the returned tensor's own order."""
    if adjacency.layout == 'edge_index':
        return edge_index, value
    src, dst = edge_index[0], edge_index[1]
    size = (num_dst, num_src)
    if adjacency.layout == 'sparse_tensor':
        return SparseTensor(row=dst, col=src, value=value, sparse_sizes=size)
    dst_src = torch.stack([dst, src])
    if adjacency.layout == str(torch.sparse_csr):
        adj = to_torch_csr_tensor(dst_src, value, size=size)
    elif adjacency.layout == str(torch.sparse_csc):
        adj = to_torch_csc_tensor(dst_src, value, size=size)
    else:
        adj = to_torch_coo_tensor(dst_src, value, size=size)
    return adj, adj.values()
