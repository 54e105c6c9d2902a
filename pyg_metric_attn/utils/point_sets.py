"""Point sets as graphs: all pairs among the points of each set."""
from __future__ import annotations

import torch
from torch import Tensor


def check_batch(batch: Tensor, num_nodes: int) -> None:
    """Raise unless ``batch`` is a sorted ``[num_nodes]`` set index (points of
    a set contiguous, as PyG batches them)."""
    if batch.dim() != 1 or batch.numel() != num_nodes:
        raise ValueError(f"'batch' must have shape [{num_nodes}], got "
                         f"{list(batch.shape)}")
    if batch.numel() > 1 and bool((batch[1:] < batch[:-1]).any()):
        raise ValueError("'batch' must be sorted (points of a set contiguous)")


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


def shuffled_sets(num_points: int, set_size: int,
                  generator: torch.Generator | None = None) -> list[Tensor]:
    """Split a random permutation of ``range(num_points)`` into point sets of
    ``set_size`` (the last one may be smaller)."""
    if set_size < 1:
        raise ValueError(f"'set_size' must be positive, got {set_size}")
    return list(torch.randperm(num_points, generator=generator).split(set_size))
