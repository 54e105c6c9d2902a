"""Point sets as graphs: all pairs among the points of each set, propagation
along them; spread-out subsets of each set."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor
from torch_geometric.utils import to_dense_batch

from pyg_metric_attn.utils.checks import check_batch_vector


def check_batch(batch: Tensor, num_nodes: int) -> None:
    """Raise unless ``batch`` is a sorted ``[num_nodes]`` set index (points of
    a set contiguous, as PyG batches them)."""
    check_batch_vector(batch, num_nodes)
    if batch.numel() > 1 and bool((batch[1:] < batch[:-1]).any()):
        raise ValueError("'batch' must be sorted (points of a set contiguous)")


def point_set_mask(mask: Tensor, normalization: str = 'row') -> Tensor:
    """The SDPA mask (:obj:`True` = may attend) of padded point sets, from
    :func:`~torch_geometric.utils.to_dense_batch`'s ``[B, L]`` mask: padded
    keys are blocked, ``[B, 1, 1, L]``; for normalisations other than
    ``'row'`` padded queries as well (they would take weight in a column or
    global normalisation), ``[B, 1, L, L]``."""
    allowed = mask.view(mask.size(0), 1, 1, mask.size(1))
    if normalization != 'row':
        allowed = allowed & mask.view(mask.size(0), 1, mask.size(1), 1)
    return allowed


def fully_connected_edge_index(num_nodes: int, batch: Tensor | None = None,
                               device: torch.device | None = None) -> Tensor:
    r"""All ordered pairs :math:`(j, i)` with :math:`j, i` in the same set.

    Self-pairs are included, so a set of :math:`n` points has :math:`n^2`
    edges. Edges are grouped by destination.

    Args:
        num_nodes (int): Number of points.
        batch (torch.Tensor, optional): Sorted set assignment of each point
            (PyG's ``batch`` vector); :obj:`None` means one set.
        device (torch.device, optional): Device of the result when ``batch``
            is :obj:`None`.
    """
    if batch is None:
        nodes = torch.arange(num_nodes, device=device)
        return torch.stack([nodes.repeat(num_nodes),
                            nodes.repeat_interleave(num_nodes)])
    check_batch(batch, num_nodes)
    set_size = torch.bincount(batch)
    set_start = torch.cumsum(set_size, 0) - set_size
    per_dst = set_size[batch]  # edges arriving at each point
    dst = torch.arange(num_nodes, device=batch.device).repeat_interleave(per_dst)
    first_edge = torch.cumsum(per_dst, 0) - per_dst
    rank = torch.arange(dst.numel(), device=batch.device) - first_edge[dst]
    src = set_start[batch[dst]] + rank
    return torch.stack([src, dst])


def propagate_within_sets(conv: torch.nn.Module, x: Tensor,
                          batch: Tensor | None = None,
                          edge_index: Tensor | None = None
                          ) -> tuple[Tensor, Tensor | None]:
    """One layer's all-pairs propagation among the points of each set: the
    layer's dense ``forward_point_sets`` where it has one
    (:class:`~pyg_metric_attn.nn.MetricAttentionConv`), else the layer on the
    sets' :func:`fully_connected_edge_index`, built once where ``edge_index``
    is :obj:`None`.

    Returns:
        ``(out, edge_index)``: the layer's output and the all-pairs edges
        (:obj:`None` while no layer needed them), to pass to the next layer.
    """
    if hasattr(conv, 'forward_point_sets'):
        return conv.forward_point_sets(x, batch), edge_index
    if edge_index is None:
        edge_index = fully_connected_edge_index(x.size(0), batch, x.device)
    return conv(x, edge_index), edge_index


def shuffled_sets(num_points: int, set_size: int,
                  generator: torch.Generator | None = None) -> list[Tensor]:
    """Split a random permutation of ``range(num_points)`` into point sets of
    ``set_size`` (the last one may be smaller)."""
    if set_size < 1:
        raise ValueError(f"'set_size' must be positive, got {set_size}")
    return list(torch.randperm(num_points, generator=generator).split(set_size))


def farthest_point_sampling(pos: Tensor, batch: Tensor | None = None,
                            stride: int = 1) -> Tensor:
    r"""A boolean mask of :math:`\lceil n / \text{stride} \rceil` points of
    every set of :math:`n` points, spread out by farthest point sampling:
    it starts at the point farthest from the set's centroid and repeatedly
    adds the point farthest from those chosen.

    The choice depends on the positions only, never on the order of the
    points: ties (equal distances) go to the lexicographically smallest
    position, and every reduction runs over the points in that order, so a
    renumbered set gives the same points. It is
    :func:`farthest_point_keys` of :func:`farthest_point_ranks`, with only
    the steps the stride needs taken.

    Args:
        pos (torch.Tensor): Positions ``[N, D]``.
        batch (torch.Tensor, optional): Sorted set assignment of each point;
            :obj:`None` means one set.
        stride (int): One point chosen per ``stride`` points. (default:
            :obj:`1`: all)
    """
    check_stride(stride)
    return _greedy_ranks(pos, batch, stride) < UNRANKED


def farthest_point_ranks(pos: Tensor, batch: Tensor | None = None) -> Tensor:
    r"""The step ``[N]`` (int64) at which farthest point sampling picks each
    point of its set: :math:`0` for the point farthest from the set's
    centroid, :math:`1` for the point farthest from it, and so on, as
    :func:`farthest_point_sampling` picks them. A point that coincides with
    an earlier one is never farther than :math:`0` from those picked and
    gets no step: its rank is :data:`UNRANKED`.

    The greedy order does not depend on how many points are taken, so the
    ranks hold the samples of every stride
    (:func:`farthest_point_keys`): a mesh's ranks can be computed once,
    with its other operators, instead of in every forward pass.

    Args:
        pos (torch.Tensor): Positions ``[N, D]``.
        batch (torch.Tensor, optional): Sorted set assignment of each point;
            :obj:`None` means one set.
    """
    return _greedy_ranks(pos, batch, 1)


def farthest_point_keys(ranks: Tensor, batch: Tensor | None = None,
                        stride: int = 1) -> Tensor:
    r"""The mask of :func:`farthest_point_sampling` with ``stride``, from the
    sets' :func:`farthest_point_ranks`: the points ranked below
    :math:`\lceil n / \text{stride} \rceil` in their set of :math:`n`
    points. No value of a GPU tensor is read back to the host.

    Args:
        ranks (torch.Tensor): :func:`farthest_point_ranks` ``[N]``.
        batch (torch.Tensor, optional): Sorted set assignment of each point
            (checked on CPU tensors, where that costs no sync);
            :obj:`None` means one set.
        stride (int): One point chosen per ``stride`` points. (default:
            :obj:`1`: all)
    """
    check_stride(stride)
    if ranks.dim() != 1 or ranks.dtype != torch.long:
        raise ValueError(f"'ranks' must be an int64 vector [N], got "
                         f"{ranks.dtype} of shape {list(ranks.shape)}")
    if batch is None:
        sizes = torch.full_like(ranks, ranks.numel())
    else:
        if batch.device.type == 'cpu':
            check_batch(batch, ranks.numel())
        else:
            check_batch_vector(batch, ranks.numel())
        # Each point's set size from the sorted set indices: no bound read
        # back, and no index out of range whatever their values.
        sizes = (torch.searchsorted(batch, batch, right=True)
                 - torch.searchsorted(batch, batch))
    return ranks < (sizes + stride - 1) // stride


@dataclass(frozen=True)
class PaddedSets:
    r"""Sorted point sets padded into a batch of sequences, and a subset of
    their points (the keys) padded into a second one:
    :func:`~torch_geometric.utils.to_dense_batch`'s layout of both, found
    once (at most three reads back to the host: the sets' order checked
    where ``batch`` is given, the keys, the sizes) and applied to any
    features of the points without another. Where several layers attend
    from every point to the keys of its set, each does three index ops
    instead of two ``to_dense_batch`` calls and three boolean selections,
    each with its own reads back (syncs on a GPU).

    Build it with :meth:`of`. Padding is zero, as ``to_dense_batch``'s.
    """
    #: ``[N]``: the row of each point in the ``[B * L]`` padded queries.
    query_slot: Tensor
    #: ``[K]``: the keys' point indices.
    key_index: Tensor
    #: ``[K]``: the row of each key in the ``[B * S]`` padded keys.
    key_slot: Tensor
    #: ``[B, S]``: :obj:`True` where a row of the padded keys holds no key
    #: (``key_padding_mask`` of :class:`~torch.nn.MultiheadAttention`).
    key_padding: Tensor
    #: ``(B, L, S)``: the sets, the most points and the most keys in one.
    shape: tuple[int, int, int]

    @classmethod
    def of(cls, keys: Tensor, batch: Tensor | None = None) -> PaddedSets:
        """The layout of the points (``batch``: their sorted set index,
        :obj:`None`: one set) and of the keys among them (``keys``: a
        boolean mask ``[N]``)."""
        if keys.dim() != 1 or keys.dtype != torch.bool:
            raise ValueError(f"'keys' must be a boolean mask [N], got "
                             f"{keys.dtype} of shape {list(keys.shape)}")
        num_points = keys.numel()
        if batch is None:
            batch = keys.new_zeros(num_points, dtype=torch.long)
        else:
            check_batch(batch, num_points)
        # Each point's position in its set, from the sorted set indices.
        query_pos = (torch.arange(num_points, device=keys.device)
                     - torch.searchsorted(batch, batch))
        key_index = keys.nonzero().view(-1)  # one read
        key_batch = batch[key_index]
        key_pos = (torch.arange(key_index.numel(), device=keys.device)
                   - torch.searchsorted(key_batch, key_batch))
        # The last set index, the most points and the most keys in a set
        # (-1 where there are none), in one read.
        largest = torch.stack([torch.cat([values, values.new_full((1,), -1)]).max()
                               for values in (batch[-1:], query_pos, key_pos)])
        num_sets, query_len, key_len = (largest + 1).tolist()
        key_slot = key_batch * key_len + key_pos
        key_padding = torch.ones(num_sets * key_len, dtype=torch.bool,
                                 device=keys.device).index_fill(0, key_slot, False)
        return cls(batch * query_len + query_pos, key_index, key_slot,
                   key_padding.view(num_sets, key_len),
                   (num_sets, query_len, key_len))

    def queries(self, x: Tensor) -> Tensor:
        """The points' features ``[N, C]`` padded to ``[B, L, C]``."""
        num_sets, query_len, _ = self.shape
        return x.new_zeros(num_sets * query_len, x.size(-1)).index_copy(
            0, self.query_slot, x).view(num_sets, query_len, x.size(-1))

    def keys(self, x: Tensor) -> Tensor:
        """The keys' features, from all points' ``[N, C]``, padded to
        ``[B, S, C]``."""
        num_sets, _, key_len = self.shape
        return x.new_zeros(num_sets * key_len, x.size(-1)).index_copy(
            0, self.key_slot, x[self.key_index]).view(num_sets, key_len,
                                                      x.size(-1))

    def unpad(self, out: Tensor) -> Tensor:
        """The points' rows ``[N, C]`` of padded queries' ``[B, L, C]``."""
        return out.reshape(-1, out.size(-1))[self.query_slot]


#: The rank of a point that farthest point sampling does not pick.
UNRANKED = torch.iinfo(torch.long).max


def check_stride(stride: int) -> None:
    """Raise unless ``stride`` is a positive integer."""
    if isinstance(stride, bool) or not isinstance(stride, int) or stride < 1:
        raise ValueError(f"'stride' must be a positive integer, got {stride!r}")


def _greedy_ranks(pos: Tensor, batch: Tensor | None, stride: int) -> Tensor:
    r"""The first :math:`\lceil n / \text{stride} \rceil` steps of farthest
    point sampling in every set; points not picked get :data:`UNRANKED`."""
    if batch is None:
        batch = torch.zeros(pos.size(0), dtype=torch.long, device=pos.device)
    order = torch.arange(pos.size(0), device=pos.device)
    for key in (*pos.unbind(1)[::-1], batch):  # last key sorts first
        order = order[torch.sort(key[order], stable=True).indices]
    dense, mask = to_dense_batch(pos[order], batch[order])  # [B, L, D]
    counts = (mask.sum(1) + stride - 1) // stride
    centroid = dense.sum(1, keepdim=True) / mask.sum(1)[:, None, None]
    distance = (dense - centroid).square().sum(-1).masked_fill(~mask, -1.0)
    ranks = torch.full(mask.shape, UNRANKED, dtype=torch.long,
                       device=pos.device)
    nearest = torch.full_like(distance, torch.inf).masked_fill(~mask, -1.0)
    steps = torch.arange(int(counts.max()), device=pos.device)[:, None]
    steps = torch.where(steps < counts, steps, UNRANKED)  # [steps, B]
    for step in steps[:, :, None]:
        # The first maximum: the smallest position. A point picked again
        # (all left coincide with picked ones) keeps its first step.
        current = distance.argmax(1, keepdim=True)  # [B, 1]
        ranks.scatter_reduce_(1, current, step, 'amin')
        picked = dense.take_along_dim(current[:, :, None], dim=1)  # [B, 1, D]
        nearest = torch.minimum(nearest, (dense - picked).square().sum(-1))
        distance = nearest
    out = torch.empty_like(batch)
    out[order] = ranks[mask]
    return out
