r"""A graph as the block-diagonal CSR matrix of its attention heads.

Multi-head attention on a graph with :math:`E` edges keeps :math:`H` numbers
per edge. :class:`HeadBlockCSR` lays them out as the values of one sparse
matrix with :math:`H` diagonal blocks,

.. math::
    A = \mathrm{diag}(A_1, \dots, A_H) \in
    \mathbb{R}^{H N_{dst} \times H N_{src}}, \qquad
    (A_h)_{ij} \ne 0 \iff (j \to i) \in \mathcal{E},

rows sorted by destination. Node tensors ``[N, H, K]`` become ``[H N, K]``
(head-major), so one sparse kernel call serves all heads: the sampled dense
product (SDDMM) gives the per-edge logits and ``A @ V`` (SpMM) aggregates.
Per-edge values are flat ``[H E]`` tensors in block order; the helpers map them
to and from the caller's ``[E, H]`` edge order.
"""
from __future__ import annotations

import warnings

import torch
from torch import Tensor


def _csr_matrix(crow: Tensor, col: Tensor, values: Tensor,
                size: tuple[int, int]) -> Tensor:
    with warnings.catch_warnings():  # torch warns once that CSR is 'beta'
        warnings.filterwarnings('ignore', message='Sparse CSR tensor support')
        return torch.sparse_csr_tensor(crow, col, values, size,
                                       check_invariants=False)


def _block_indices(ptr: Tensor, index: Tensor, heads: int, num_cols: int,
                   dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``crow``/``col`` of ``diag(A, ..., A)`` (``heads`` copies of ``A``)."""
    nnz = index.numel()
    offsets = torch.arange(heads, device=index.device).view(-1, 1)
    crow = torch.cat([(ptr[:-1].view(1, -1) + offsets * nnz).flatten(),
                      ptr.new_full((1, ), heads * nnz)])
    col = (index.view(1, -1) + offsets * num_cols).flatten()
    return crow.to(dtype), col.to(dtype)


def sort_by_segment(keys: Tensor, num_segments: int) -> tuple[Tensor, Tensor]:
    """Stable order of ``keys`` (in ``[0, num_segments)``) and the CSR pointer
    of the sorted keys (by binary search: no host sync on GPUs)."""
    keys, order = torch.sort(keys, stable=True)
    bounds = torch.arange(num_segments + 1, device=keys.device, dtype=keys.dtype)
    return order, torch.searchsorted(keys, bounds)


class HeadBlockCSR:
    r"""The graph ``edge_index`` (``[2, E]``, row 0 = source) as the
    block-diagonal CSR matrix of ``heads`` copies of its adjacency.

    Args:
        edge_index (torch.Tensor): The edges ``j -> i`` as ``[2, E]``.
        num_src (int): Number of source nodes :math:`N_{src}`.
        num_dst (int): Number of destination nodes :math:`N_{dst}`.
        heads (int): Number of blocks :math:`H`.
    """
    def __init__(self, edge_index: Tensor, num_src: int, num_dst: int,
                 heads: int):
        self.num_src, self.num_dst, self.heads = num_src, num_dst, heads
        self.num_edges = edge_index.size(1)
        largest = heads * max(num_src, num_dst, self.num_edges)
        self.index_dtype = torch.int32 if largest < 2**31 - 1 else torch.int64
        src, dst = edge_index[0], edge_index[1]
        # perm[k]: the caller's edge at CSR position k.
        self.perm, self.ptr = sort_by_segment(dst, num_dst)
        self.src = src[self.perm]
        self.crow, self.col = _block_indices(self.ptr, self.src, heads, num_src,
                                             self.index_dtype)
        self._row_offsets = self.crow.long()  # segment_reduce takes int64
        # The block row of every entry, to broadcast per-row values.
        self.row = torch.repeat_interleave(
            torch.arange(heads * num_dst, device=dst.device,
                         dtype=self.index_dtype),
            self.crow.diff(), output_size=heads * self.num_edges)
        self._transpose: tuple[Tensor, Tensor, Tensor] | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.heads * self.num_dst, self.heads * self.num_src

    def matrix(self, values: Tensor) -> Tensor:
        """The sparse CSR matrix ``A`` holding ``values`` (``[H E]``)."""
        return _csr_matrix(self.crow, self.col, values, self.shape)

    def transposed_matrix(self, values: Tensor) -> Tensor:
        """``A^T`` as a CSR matrix (rows = source nodes), for ``values`` of
        ``A`` in block order. Its structure is built on first use."""
        if self._transpose is None:
            order, ptr = sort_by_segment(self.src, self.num_src)
            dst = torch.repeat_interleave(
                torch.arange(self.num_dst, device=ptr.device), self.ptr.diff(),
                output_size=self.num_edges)
            crow, col = _block_indices(ptr, dst[order], self.heads,
                                       self.num_dst, self.index_dtype)
            offsets = torch.arange(self.heads, device=ptr.device).view(-1, 1)
            gather = (order.view(1, -1) + offsets * self.num_edges).flatten()
            self._transpose = (crow, col, gather)
        crow, col, gather = self._transpose
        return _csr_matrix(crow, col, values[gather],
                           (self.shape[1], self.shape[0]))

    def row_reduce(self, values: Tensor, reduce: str) -> Tensor:
        """Reduce ``[H E]`` values per block row to ``[H N_dst]`` (empty rows
        give the reduction's identity: 0 for ``'sum'``, ``-inf`` for ``'max'``)."""
        return torch.segment_reduce(values, reduce, offsets=self._row_offsets)

    def broadcast_rows(self, row_values: Tensor) -> Tensor:
        """``[H N_dst]`` -> ``[H E]``: each entry gets its row's value."""
        return row_values[self.row]

    def from_edges(self, edge_values: Tensor) -> Tensor:
        """``[E, H]`` in the caller's edge order -> ``[H E]`` block order."""
        return edge_values[self.perm].t().reshape(-1)

    def to_edges(self, block_values: Tensor) -> Tensor:
        """``[H E]`` block order -> ``[E, H]`` in the caller's edge order."""
        out = block_values.new_empty(self.num_edges, self.heads)
        out[self.perm] = block_values.view(self.heads, self.num_edges).t()
        return out


def to_blocks(x: Tensor) -> Tensor:
    """Node tensor ``[N, H, K]`` -> head-major ``[H N, K]``."""
    return x.transpose(0, 1).reshape(-1, x.size(-1))


def from_blocks(x: Tensor, heads: int) -> Tensor:
    """Head-major ``[H N, K]`` -> ``[N, H, K]`` (a view)."""
    return x.view(heads, -1, x.size(-1)).transpose(0, 1)
