r"""Rank collapse of attention with depth.

Pure attention propagation averages: with every layer the rows of the
feature matrix :math:`X \in \mathbb{R}^{n \times c}` of a set move closer
together, towards a rank-one matrix :math:`\mathbf{1} x^\top` (every point
the same), unless skip connections or MLPs keep them apart (Dong et al.,
"Attention is not all you need: pure attention loses rank doubly
exponentially with depth", 2021). :func:`rank_one_residual` measures the
distance to rank one, :func:`residuals_through_depth` follows it through a
stack of modules.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import Tensor
from torch_geometric.utils import scatter


def rank_one_residual(x: Tensor, batch: Tensor | None = None) -> Tensor:
    r"""The relative distance of each set's features to rank one,
    :math:`\|X - \mathbf{1} \bar{x}^\top\|_F / \|X\|_F` with :math:`\bar{x}`
    the set's mean row (the closest :math:`\mathbf{1} x^\top` in the
    Frobenius norm); ``[num_sets]`` (one value without ``batch``; 0 for a
    set of zeros)."""
    if x.dim() != 2:
        raise ValueError(f"'x' must be [num_points, channels], got {list(x.shape)}")
    if batch is None:
        batch = x.new_zeros(x.size(0), dtype=torch.long)
    x = x.double()
    mean = scatter(x, batch, 0, reduce='mean')
    spread = scatter((x - mean[batch]).square().sum(1), batch, 0, reduce='sum')
    total = scatter(x.square().sum(1), batch, 0, reduce='sum')
    return (spread / total.clamp(min=torch.finfo(x.dtype).tiny)).sqrt()


def residuals_through_depth(layers: Iterable[Callable[[Tensor], Tensor]],
                            x: Tensor, batch: Tensor | None = None) -> Tensor:
    """:func:`rank_one_residual` of the input and after each layer,
    ``[1 + num_layers, num_sets]`` (no gradients)."""
    residuals = [rank_one_residual(x, batch)]
    with torch.no_grad():
        for layer in layers:
            x = layer(x)
            residuals.append(rank_one_residual(x, batch))
    return torch.stack(residuals)
