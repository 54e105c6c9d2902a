"""Point sets as graphs: all pairs among the points of each set, propagation
along them; spread-out subsets of each set."""
from __future__ import annotations

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
    renumbered set gives the same points.

    Args:
        pos (torch.Tensor): Positions ``[N, D]``.
        batch (torch.Tensor, optional): Sorted set assignment of each point;
            :obj:`None` means one set.
        stride (int): One point chosen per ``stride`` points. (default:
            :obj:`1`: all)
    """
    if stride < 1:
        raise ValueError(f"'stride' must be positive, got {stride}")
    if batch is None:
        batch = torch.zeros(pos.size(0), dtype=torch.long, device=pos.device)
    order = torch.arange(pos.size(0), device=pos.device)
    for key in (*pos.unbind(1)[::-1], batch):  # last key sorts first
        order = order[torch.sort(key[order], stable=True).indices]
    dense, mask = to_dense_batch(pos[order], batch[order])  # [B, L, D]
    counts = (mask.sum(1) + stride - 1) // stride
    rows = torch.arange(dense.size(0), device=pos.device)
    centroid = dense.sum(1, keepdim=True) / mask.sum(1)[:, None, None]
    distance = (dense - centroid).square().sum(-1).masked_fill(~mask, -1.0)
    chosen = torch.zeros_like(mask)
    nearest = torch.full_like(distance, torch.inf).masked_fill(~mask, -1.0)
    for step in range(int(counts.max())):
        current = distance.argmax(1)  # the first maximum: smallest position
        chosen[rows, current] |= step < counts
        nearest = torch.minimum(nearest, (dense - dense[rows, current, None])
                                .square().sum(-1))
        distance = nearest
    out = torch.zeros_like(batch, dtype=torch.bool)
    out[order] = chosen[mask]
    return out
