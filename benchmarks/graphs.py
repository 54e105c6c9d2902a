"""Random graphs of the benchmark suites, drawn fast and frugally at any size.

Every generator is vectorised (no Python loop over nodes or edges), seeded,
and draws on the device it is given; ``edge_index`` is ``[2, E]`` int64 with
row 0 the sources. At 50M edges the uniform graph takes its 800 MB result and
nothing more; the power-law graph about twice that while it draws.
"""
from __future__ import annotations

import torch

POWER_LAW_EXPONENT = 0.7  # rank-size exponent a: weight of rank r ~ r^-a
GRAPH_KINDS = ('uniform', 'power-law')


def uniform_edge_index(num_nodes: int, num_edges: int,
                       device: torch.device) -> torch.Tensor:
    """``num_edges`` directed edges with both ends uniformly random (seed 0,
    drawn on ``device``)."""
    generator = torch.Generator(device=device).manual_seed(0)
    return torch.randint(0, num_nodes, (2, num_edges), generator=generator,
                         device=device)


def power_law_edge_index(num_nodes: int, num_edges: int, device: torch.device,
                         exponent: float = POWER_LAW_EXPONENT) -> torch.Tensor:
    r"""``num_edges`` directed edges whose ends follow a rank-size (Zipf) law.

    Node of rank :math:`r` (ranks randomly permuted over node ids, one
    permutation per end) is drawn with probability :math:`\propto r^{-a}`,
    independently for the source and the destination of each edge (inverse
    CDF on one uniform number per end; seed 0, drawn on ``device``). With
    :math:`a = 0.7` the degree distribution has tail exponent
    :math:`1 + 1/a \approx 2.4` and the largest hub has in- and out-degree
    about :math:`E \cdot a' / N^{0.3}` with :math:`a' = 0.3`: ~2e4 at
    100k / 2M and ~1e5 at 1M / 20M. Multi-edges occur (between hubs).
    """
    generator = torch.Generator(device=device).manual_seed(0)
    ranks = torch.arange(1, num_nodes + 1, device=device, dtype=torch.float64)
    cdf = ranks.pow(-exponent).cumsum(0)
    cdf /= cdf[-1].clone()
    edge_index = torch.empty(2, num_edges, dtype=torch.long, device=device)
    for end in edge_index:  # sources, then destinations
        u = torch.rand(num_edges, generator=generator, device=device,
                       dtype=torch.float64)
        rank = torch.searchsorted(cdf, u).clamp_max_(num_nodes - 1)
        del u
        node_of_rank = torch.randperm(num_nodes, generator=generator,
                                      device=device)
        torch.index_select(node_of_rank, 0, rank, out=end)
    return edge_index


def make_graph(kind: str, nodes: int, edges: int,
               device: torch.device) -> torch.Tensor:
    """The graph of one of :data:`GRAPH_KINDS`."""
    if kind == 'uniform':
        return uniform_edge_index(nodes, edges, device)
    if kind == 'power-law':
        return power_law_edge_index(nodes, edges, device)
    raise ValueError(f"Unknown graph kind '{kind}'; expected one of "
                     f'{GRAPH_KINDS}')
