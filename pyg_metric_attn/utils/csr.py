r"""A graph's sparsity pattern, shared by its attention heads, as CSR.

Multi-head attention on a graph with :math:`E` edges keeps :math:`H` numbers
per edge: one sparse matrix per head,

.. math::
    A_h \in \mathbb{R}^{N_{dst} \times N_{src}}, \qquad
    (A_h)_{ij} \ne 0 \iff (j \to i) \in \mathcal{E},

all with the same pattern. :class:`HeadBlockCSR` stores that pattern once
(rows sorted by destination, 32-bit indices where they fit) and runs each
sparse kernel head by head on it: the sampled dense product (SDDMM) gives the
per-edge logits, ``A_h @ V_h`` (SpMM) aggregates, and the transposed pattern
serves the source-side gradients. Per-edge values are flat ``[H E]`` tensors,
head-major (head ``h`` holds entries ``h E`` to ``(h + 1) E``, in CSR order);
node tensors enter as ``[H, N, K]`` (head-major, or a node-major ``[N, H,
K]`` tensor seen through ``transpose(0, 1)``: each head's slice is then
strided, and nothing is copied to head-major order). The helpers map
per-edge values to and from the caller's ``[E, H]`` edge order.

Memory: five 32-bit index arrays of :math:`E` entries (the pattern's columns
and rows, the transpose's columns, the permutations to the transpose and to
the caller's order), whatever :math:`H`; every kernel's per-edge temporaries
are one head's :math:`E` entries, not :math:`H E`. Gathers use
:func:`torch.index_select`, which takes the 32-bit indices as they are.
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


def sort_by_segment(keys: Tensor, num_segments: int) -> tuple[Tensor, Tensor]:
    """Stable order of ``keys`` (in ``[0, num_segments)``) and the CSR pointer
    of the sorted keys (by binary search: no host sync on GPUs)."""
    keys, order = torch.sort(keys, stable=True)
    bounds = torch.arange(num_segments + 1, device=keys.device, dtype=keys.dtype)
    return order, torch.searchsorted(keys, bounds)


def segment_ids(ptr: Tensor, num_entries: int,
                dtype: torch.dtype = torch.long) -> Tensor:
    """The segment of every entry of a CSR pointer ``ptr`` (``[num_entries]``;
    ``num_entries`` known on the host, so no sync)."""
    return torch.repeat_interleave(
        torch.arange(ptr.numel() - 1, device=ptr.device, dtype=dtype), ptr.diff(),
        output_size=num_entries)


class HeadBlockCSR:
    r"""The graph ``edge_index`` (``[2, E]``, row 0 = source) as one CSR
    pattern that ``heads`` attention heads share (see the module docstring).

    Args:
        edge_index (torch.Tensor): The edges ``j -> i`` as ``[2, E]``.
        num_src (int): Number of source nodes :math:`N_{src}`.
        num_dst (int): Number of destination nodes :math:`N_{dst}`.
        heads (int): Number of heads :math:`H`.
    """
    def __init__(self, edge_index: Tensor, num_src: int, num_dst: int,
                 heads: int):
        self.num_src, self.num_dst, self.heads = num_src, num_dst, heads
        self.num_edges = num_edges = edge_index.size(1)
        largest = max(num_src, num_dst, num_edges)
        self.index_dtype = dtype = (torch.int32 if largest < 2**31 - 1
                                    else torch.int64)
        device = edge_index.device
        perm, self.ptr = sort_by_segment(edge_index[1], num_dst)
        # perm[k]: the caller's edge at CSR position k.
        self.perm = perm.to(dtype)
        src = edge_index[0].index_select(0, perm)
        self.crow, self.col = self.ptr.to(dtype), src.to(dtype)
        # The destination of every entry, to broadcast per-row values.
        self.row = segment_ids(self.ptr, num_edges, dtype)
        # The transposed pattern (rows = sources) and, for each of its
        # entries, the entry of the pattern it holds.
        order, src_ptr = sort_by_segment(src, num_src)
        self.transpose_crow = src_ptr.to(dtype)
        self.transpose_col = self.row.index_select(0, order)
        self.transpose_gather = order.to(dtype)
        # Block-row offsets of [H E] values (segment_reduce takes int64).
        offsets = torch.arange(heads, device=device).view(-1, 1) * num_edges
        self._row_offsets = torch.cat([
            (self.ptr[:-1].view(1, -1) + offsets).flatten(),
            self.ptr.new_full((1, ), heads * num_edges)])

    def _heads(self, block_values: Tensor) -> list[Tensor]:
        """``[H E]`` -> the ``H`` contiguous ``[E]`` slices of the heads."""
        return list(block_values.view(self.heads, self.num_edges).unbind(0))

    def sampled_dot(self, a: Tensor, b: Tensor) -> Tensor:
        r"""``[H E]``: :math:`\langle a_{h, \mathrm{dst}(e)}, b_{h,
        \mathrm{src}(e)} \rangle` for every head and entry, with ``a``
        ``[H, N_dst, K]`` and ``b`` ``[H, N_src, K]``."""
        # Zeros: with beta = 0 the kernel still propagates NaN in the input.
        out = a.new_zeros(self.heads * self.num_edges)
        for a_h, b_h, out_h in zip(a.unbind(0), b.unbind(0), self._heads(out),
                                   strict=True):
            pattern = _csr_matrix(self.crow, self.col, out_h,
                                  (self.num_dst, self.num_src))
            torch.sparse.sampled_addmm(pattern, a_h, b_h.t(), beta=0.0,
                                       out=pattern)  # into out_h
        return out

    def aggregate(self, weights: Tensor, value: Tensor,
                  out: Tensor | None = None) -> Tensor:
        """``A_h @ value_h`` for every head: ``[H E]`` weights, ``[H, N_src,
        C]`` values -> ``[H, N_dst, C]``, into ``out`` where given."""
        if out is None:
            out = value.new_empty(self.heads, self.num_dst, value.size(-1))
        for w_h, v_h, out_h in zip(self._heads(weights), value.unbind(0),
                                   out.unbind(0), strict=True):
            torch.mm(_csr_matrix(self.crow, self.col, w_h,
                                 (self.num_dst, self.num_src)), v_h, out=out_h)
        return out

    def aggregate_transposed(self, weights: Tensor, grad: Tensor,
                             out: Tensor | None = None) -> Tensor:
        """``A_h^T @ grad_h`` for every head: ``[H E]`` weights of ``A``,
        ``[H, N_dst, C]`` -> ``[H, N_src, C]``, into ``out`` where given."""
        if out is None:
            out = grad.new_empty(self.heads, self.num_src, grad.size(-1))
        for w_h, g_h, out_h in zip(self._heads(weights), grad.unbind(0),
                                   out.unbind(0), strict=True):
            torch.mm(_csr_matrix(self.transpose_crow, self.transpose_col,
                                 w_h.index_select(0, self.transpose_gather),
                                 (self.num_src, self.num_dst)), g_h, out=out_h)
        return out

    def row_reduce(self, values: Tensor, reduce: str) -> Tensor:
        """Reduce ``[H E]`` values per head and destination to ``[H N_dst]``
        (empty rows give the reduction's identity: 0 for ``'sum'``, ``-inf``
        for ``'max'``)."""
        return torch.segment_reduce(values, reduce, offsets=self._row_offsets)

    def rows_apply(self, op, values: Tensor, row_values: Tensor,
                   out: Tensor) -> Tensor:
        """``op(values, the row value of each entry, out=out)`` for ``[H E]``
        values and ``[H N_dst]`` row values, a head at a time (one head's
        :math:`E` entries of temporaries, not :math:`H E`); ``out`` may be
        ``values``. Returns ``out``."""
        for values_h, row_h, out_h in zip(
                self._heads(values), row_values.view(self.heads, -1).unbind(0),
                self._heads(out), strict=True):
            op(values_h, row_h.index_select(0, self.row), out=out_h)
        return out

    def broadcast_rows(self, row_values: Tensor) -> Tensor:
        """``[H N_dst]`` -> ``[H E]``: each entry gets its row's value."""
        return row_values.view(self.heads, -1).index_select(1, self.row).view(-1)

    def from_edges(self, edge_values: Tensor) -> Tensor:
        """``[E, H]`` in the caller's edge order -> ``[H E]`` block order."""
        return edge_values.index_select(0, self.perm).t().reshape(-1)

    def to_edges(self, block_values: Tensor) -> Tensor:
        """``[H E]`` block order -> ``[E, H]`` in the caller's edge order."""
        out = block_values.new_empty(self.num_edges, self.heads)
        out.index_copy_(0, self.perm.long(),
                        block_values.view(self.heads, self.num_edges).t())
        return out
