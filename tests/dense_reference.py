"""MetricAttentionConv written out densely from its raw parameter tensors: an
independent reference for every backend, normalisation and self-loop fill.

Nothing here calls the package's layers: the maps, the logits, the self-loops with
their edge features and the four normalisations (Definitions 7-10 of the
paper) are written in plain torch on ``[H, N_dst, N_src]`` matrices, the
normalisations in linear space (the package's run in log space on edges).
Graphs must have no duplicate edges (a dense matrix holds one per pair).
"""
from __future__ import annotations

import copy
import math

import torch

from pyg_metric_attn import MetricAttentionConv


def phi(conv, module, u):
    """The map of ``conv.metric`` to the metric space, from its weights."""
    if conv.metric == 'metric':
        skip = u if module.skip is None else u @ module.skip.weight.T
        hidden = torch.tanh(u @ module.hidden.weight.T + module.hidden.bias)
        return skip + hidden @ module.out.weight.T + module.out.bias
    return u @ module.weight.T


def dense_logits(conv, x_src, x_dst):
    """``[H, N_dst, N_src]`` logits of every pair."""
    H, D = conv.heads, conv.metric_channels
    n_src, n_dst = x_src.size(0), x_dst.size(0)
    dst_map = conv.embed_dst if conv.embed_dst is not None else conv.embed_src
    q = phi(conv, dst_map, x_dst).view(n_dst, H, D)
    k = phi(conv, conv.embed_src, x_src).view(n_src, H, D)
    if conv.metric == 'dot':
        logits = torch.einsum('ihd,jhd->hij', q, k) / math.sqrt(D)
    else:
        diff = q.unsqueeze(1) - k.unsqueeze(0)  # [N_dst, N_src, H, D]
        logits = -diff.square().sum(-1).permute(2, 0, 1)
    return logits / conv.time_scale


def loop_features(edge_attr, dst, num_loops, fill_value):
    """Edge features ``[num_loops, D_e]`` of the added self-loops, as
    :func:`torch_geometric.utils.add_self_loops` defines them: a number or a
    vector for every loop, or a reduction of each node's incoming features
    (0 for a node without any)."""
    width = edge_attr.size(1)
    if isinstance(fill_value, (int, float)):
        return edge_attr.new_full((num_loops, width), float(fill_value))
    if isinstance(fill_value, torch.Tensor):
        return fill_value.to(edge_attr).expand(num_loops, width)
    reduce = {'add': lambda t: t.sum(0), 'sum': lambda t: t.sum(0),
              'mean': lambda t: t.mean(0), 'max': lambda t: t.amax(0),
              'min': lambda t: t.amin(0), 'mul': lambda t: t.prod(0)}[fill_value]
    out = edge_attr.new_zeros(num_loops, width)
    for i in range(num_loops):
        incoming = edge_attr[dst == i]
        if len(incoming):
            out[i] = reduce(incoming)
    return out


def divided(weights, total):
    """``weights / total``, 0 where the total is 0 (no edge)."""
    return weights / torch.where(total == 0, 1.0, total)


def normalized(similarity, normalization, iterations=3, graph=None):
    """Definitions 7-10 on ``[H, N_dst, N_src]`` similarities (0 off the
    graph): row sums (over sources), column sums (over destinations),
    ``iterations`` column-then-row steps, or each graph's total (``graph``:
    the graph of each destination, :obj:`None` for one)."""
    if normalization == 'row':
        return divided(similarity, similarity.sum(-1, keepdim=True))
    if normalization == 'column':
        return divided(similarity, similarity.sum(-2, keepdim=True))
    if normalization == 'sinkhorn':
        for _ in range(iterations):
            similarity = divided(similarity, similarity.sum(-2, keepdim=True))
            similarity = divided(similarity, similarity.sum(-1, keepdim=True))
        return similarity
    assert normalization == 'global', normalization
    if graph is None:
        graph = torch.zeros(similarity.size(1), dtype=torch.long)
    rows = similarity.sum(-1)  # [H, N_dst]
    totals = rows.new_zeros(rows.size(0), int(graph.max()) + 1)
    totals.index_add_(1, graph, rows)
    return divided(similarity, totals[:, graph].unsqueeze(-1))


def reference_forward(conv, x_src, x_dst, edge_index, edge_attr=None,
                      batch=None):
    """Dense attention of ``conv`` in its dtype: the output and the dense
    ``[H, N_dst, N_src]`` attention matrix. Honours ``heads``, ``concat``,
    ``metric``, ``value``, ``add_self_loops``, ``edge_dim`` with
    ``fill_value``, ``residual``, ``bias``, ``normalization`` with
    ``sinkhorn_iterations`` (and ``batch`` for ``'global'``) and ``aggr``
    ``'add'``/``'sum'``/``'mean'``; no dropout."""
    H, C = conv.heads, conv.out_channels
    n_src, n_dst = x_src.size(0), x_dst.size(0)
    logits = dense_logits(conv, x_src, x_dst)

    adjacency = torch.zeros(n_dst, n_src, dtype=torch.bool)
    src, dst = edge_index
    if conv.add_self_loops:
        keep = src != dst
        src, dst = src[keep], dst[keep]
        if edge_attr is not None:
            edge_attr = edge_attr[keep]
    adjacency[dst, src] = True
    if edge_attr is not None:
        weight = conv.lin_edge.weight  # [H, edge_dim]
        bias = torch.zeros(H, n_dst, n_src, dtype=x_src.dtype)
        bias[:, dst, src] = (edge_attr @ weight.T).T
    if conv.add_self_loops:
        loops = torch.arange(min(n_src, n_dst))
        adjacency[loops, loops] = True
        if edge_attr is not None:
            filled = loop_features(edge_attr, dst, len(loops), conv.fill_value)
            bias[:, loops, loops] = (filled @ weight.T).T
    if edge_attr is not None:
        logits = logits + bias

    # Shifting all logits of a head by one number changes no normalisation.
    shift = logits.masked_fill(~adjacency, -math.inf).amax((1, 2), keepdim=True)
    similarity = torch.where(adjacency, (logits - shift.clamp_min(-1e300)).exp(),
                             0.0)
    attention = normalized(similarity, conv.normalization,
                           conv.sinkhorn_iterations, batch)

    if conv.value:
        values = (x_src @ conv.lin_value.weight.T).view(n_src, H, C)
    else:  # the paper's propagation H' = S H
        values = x_src.unsqueeze(1).expand(n_src, H, C)
    out = torch.einsum('hij,jhc->ihc', attention, values)
    if conv.aggr == 'mean':
        out = out / adjacency.sum(1).clamp_min(1).view(-1, 1, 1)
    out = out.reshape(n_dst, H * C) if conv.concat else out.mean(1)
    if conv.residual:
        out = out + x_dst @ conv.res.weight.T
    if conv.bias is not None:
        out = out + conv.bias
    return out, attention


def edge_weights(attention, edge_index):
    """The dense ``[H, N_dst, N_src]`` weights at ``edge_index``'s edges,
    ``[E, H]`` as the layer returns them."""
    return attention[:, edge_index[1], edge_index[0]].T


def float64_reference(conv, x, edge_index, edge_attr=None, batch=None):
    """:func:`reference_forward` of a float64 copy of ``conv`` on the nodes
    ``x`` (sources and destinations alike): ``(out, attention)``."""
    conv = copy.deepcopy(conv).double()
    x = x.detach().double()
    if edge_attr is not None:
        edge_attr = edge_attr.detach().double()
    return reference_forward(conv, x, x, edge_index, edge_attr, batch)


def ipn_on_graph(model, x, edge_index):
    """An IPN on a graph written out: Linear, its layers along the edges
    (:class:`MetricAttentionConv` from the float64 reference, other layers
    as they are), Linear; no dropout."""
    h = model.lin_in(x)
    for conv in model.convs:
        h = (float64_reference(conv, h, edge_index)[0].to(h.dtype)
             if isinstance(conv, MetricAttentionConv) else conv(h, edge_index))
    return model.lin_out(h)
