r"""A synthetic node-classification graph with real signal: a stochastic
block model whose node features are noisy indicators of the block."""
from __future__ import annotations

import torch
from torch_geometric.data import Data
from torch_geometric.utils import to_undirected


def stochastic_block_graph(num_nodes: int, num_classes: int,
                           average_degree: float = 10.0, homophily: float = 0.8,
                           num_features: int = 16, signal: float = 1.0,
                           train_fraction: float = 0.5, val_fraction: float = 0.1,
                           seed: int = 0) -> Data:
    r"""A random undirected graph of ``num_classes`` equal blocks (the labels).

    Each of the :math:`N d / 2` edge draws (:math:`d` = ``average_degree``)
    takes a uniformly random node; its partner is a uniformly random node of
    the same block with probability ``homophily`` and a uniformly random node
    otherwise (self-loops and repeated pairs are dropped, so the degree comes
    out a little below :math:`d`). Features are
    :math:`\mathbf{x}_i = s\,\mathbf{e}_{y_i} + \boldsymbol{\varepsilon}_i`
    with :math:`\boldsymbol{\varepsilon}_i \sim \mathcal{N}(0, I)` and
    :math:`s` = ``signal``: one node alone is classified only roughly, its
    neighbourhood (mostly of its own block) much better. Memory and time are
    :math:`O(N d)`, so graphs of millions of edges are quick to make.

    Args:
        num_nodes (int): Number of nodes :math:`N`.
        num_classes (int): Number of blocks (at most ``num_features``).
        average_degree (float, optional): Edge draws per node, times two.
            (default: :obj:`10.0`)
        homophily (float, optional): Share of edges drawn within a block
            (besides the :math:`1/C` of the uniform draws). (default: :obj:`0.8`)
        num_features (int, optional): Feature size. (default: :obj:`16`)
        signal (float, optional): Length :math:`s` of the class mean.
            (default: :obj:`1.0`)
        train_fraction (float, optional): Share of nodes in ``train_mask``.
            (default: :obj:`0.5`)
        val_fraction (float, optional): Share in ``val_mask``; the rest is
            ``test_mask``. (default: :obj:`0.1`)
        seed (int, optional): Seed of the graph, features and split (the same
            seed gives the same graph in every process). (default: :obj:`0`)

    Shapes:
        - **output:** :class:`~torch_geometric.data.Data` with ``x``
          :math:`(N, F)`, ``y`` :math:`(N)`, ``edge_index`` :math:`(2, E)`
          (both directions of every edge, sorted) and boolean
          ``train_mask``, ``val_mask``, ``test_mask`` :math:`(N)`
    """
    if num_nodes < 2 or num_classes < 1 or num_classes > num_nodes:
        raise ValueError(f"Need 2 <= num_nodes and 1 <= num_classes <= "
                         f"num_nodes, got num_nodes={num_nodes}, "
                         f"num_classes={num_classes}")
    if num_classes > num_features:
        raise ValueError(f"'num_classes' ({num_classes}) must not exceed "
                         f"'num_features' ({num_features}): the class means "
                         f"are unit vectors of the feature space")
    if not 0.0 <= homophily <= 1.0:
        raise ValueError(f"'homophily' must be in [0, 1], got {homophily}")
    if average_degree <= 0:
        raise ValueError(f"'average_degree' must be positive, got "
                         f"{average_degree}")
    if not (0.0 < train_fraction and 0.0 <= val_fraction
            and train_fraction + val_fraction < 1.0):
        raise ValueError(f"Need 0 < train_fraction, 0 <= val_fraction and "
                         f"train_fraction + val_fraction < 1, got "
                         f"{train_fraction} and {val_fraction}")
    g = torch.Generator().manual_seed(seed)
    y = torch.randperm(num_nodes, generator=g) % num_classes  # balanced blocks
    # Nodes sorted by block: block c is members[start[c]:start[c] + size[c]].
    members = torch.argsort(y, stable=True)
    size = torch.bincount(y, minlength=num_classes)
    start = torch.cumsum(size, 0) - size

    num_draws = max(1, round(num_nodes * average_degree / 2))
    src = torch.randint(num_nodes, (num_draws,), generator=g)
    within = torch.rand(num_draws, generator=g) < homophily
    block = y[src]
    offset = (torch.rand(num_draws, generator=g) * size[block]).long()
    same_block = members[start[block] + offset]
    anywhere = torch.randint(num_nodes, (num_draws,), generator=g)
    dst = torch.where(within, same_block, anywhere)
    keep = src != dst
    # Both directions, sorted, repeated pairs merged.
    edge_index = to_undirected(torch.stack([src[keep], dst[keep]]),
                               num_nodes=num_nodes)

    x = torch.randn(num_nodes, num_features, generator=g)
    x[torch.arange(num_nodes), y] += signal

    order = torch.randperm(num_nodes, generator=g)
    num_train = max(1, round(train_fraction * num_nodes))
    num_val = round(val_fraction * num_nodes)
    masks = []
    for part in (order[:num_train], order[num_train:num_train + num_val],
                 order[num_train + num_val:]):
        mask = torch.zeros(num_nodes, dtype=torch.bool)
        mask[part] = True
        masks.append(mask)
    return Data(x=x, y=y, edge_index=edge_index, train_mask=masks[0],
                val_mask=masks[1], test_mask=masks[2])
