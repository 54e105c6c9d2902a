r"""Fused sparse metric-attention in Triton: one pass per direction over a
CSR graph.

:func:`triton_metric_attention` computes, for every destination row :math:`i`
of a destination-sorted CSR graph and every head,

.. math::
    s_{ij} = -\|q_i - k_j\|^2 / t + b_{ij} \quad(\texttt{'metric'},
    \texttt{'l2'}), \qquad
    s_{ij} = q_i \cdot k_j / (\sqrt{D}\, t) + b_{ij} \quad(\texttt{'dot'}),

    \alpha_{ij} = \mathrm{softmax}_{j \in N(i)}(s_{ij}), \qquad
    \mathrm{out}_i = \sum_j \alpha_{ij}\, z_{ij}\, v_j,

with :math:`z_{ij} = \mathrm{keep}_{ij} / (1 - p)` under attention dropout.
No per-edge tensor is stored (unless the weights are asked for): the kernels
gather by index and keep everything per edge in registers.

The package reads like the FlashAttention tutorial: :mod:`.kernels` (the
``@triton.jit`` kernels and their shared fragments), :mod:`.schedule` (the
graph prepared once: checks, transpose, work schedules), :mod:`.function`
(the custom operators and their autograd) and this launcher.

Dtypes: float32, float16, bfloat16 (``query``, ``key``, ``value`` in one
dtype, no autocast handling); sums in float32; ``out``, weights and
gradients in the input dtype. Devices: CUDA, or CPU tensors in Triton's
interpreter (``TRITON_INTERPRET=1`` set before the first call). Everything
is compiled with long-standing Triton features only (checked for sm_90 with
triton 3.6 and 3.9; the interpreter of triton 3.6 cannot run the kernels
under numpy >= 2.4, that of 3.9 can). Under :func:`torch.compile` the call
is one graph (``fullgraph=True``): the kernels run as two custom operators
(called without the dispatcher outside compilation, for less host time).
"""
from __future__ import annotations

import os

import torch
from torch import Tensor

from pyg_metric_attn.nn.pseudo_metric import check_metric
from pyg_metric_attn.nn.triton.function import run_attention
from pyg_metric_attn.nn.triton.schedule import TritonGraph, prepare_triton_graph
from pyg_metric_attn.utils.constants import device_constant

try:  # triton is an optional dependency: pip install pyg-metric-attn[gpu]
    import triton  # noqa: F401
    HAVE_TRITON = True
except ImportError:  # pragma: no cover - exercised where triton is absent
    HAVE_TRITON = False

__all__ = ['triton_metric_attention', 'metric_attention_lse',
           'prepare_triton_graph', 'TritonGraph', 'HAVE_TRITON']

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _require_triton() -> None:
    if not HAVE_TRITON:
        raise ImportError(
            'triton_metric_attention needs Triton, which is not installed; '
            'install it with `pip install pyg-metric-attn[gpu]` (or `pip install '
            'triton`).')


def _check_device(device: torch.device) -> None:
    if device.type == 'cuda':
        return
    if device.type == 'cpu' and os.environ.get('TRITON_INTERPRET', '0') == '1':
        return
    raise RuntimeError(
        f'triton_metric_attention runs on CUDA tensors (got {device.type}); CPU '
        'tensors run only in Triton\'s interpreter, with the environment variable '
        'TRITON_INTERPRET=1 set before the first call.')


def _check_features(query: Tensor, key: Tensor, value: Tensor,
                    edge_bias: Tensor | None, graph: TritonGraph) -> None:
    if query.dim() != 3 or key.dim() != 3 or value.dim() != 3:
        raise ValueError('query, key and value must be [N, H, D], [N, H, D], '
                         f'[N, H, C]; got {tuple(query.shape)}, {tuple(key.shape)}, '
                         f'{tuple(value.shape)}')
    n_dst, heads, dim = query.shape
    n_src = key.size(0)
    if key.shape[1:] != (heads, dim) or value.shape[:2] != (n_src, heads):
        raise ValueError(f'shape mismatch: query {tuple(query.shape)}, key '
                         f'{tuple(key.shape)}, value {tuple(value.shape)}')
    if not (query.dtype == key.dtype == value.dtype) or query.dtype not in DTYPES:
        raise TypeError('query, key and value must share one dtype among float32, '
                        f'float16, bfloat16; got {query.dtype}, {key.dtype}, '
                        f'{value.dtype}')
    _check_device(query.device)
    for name, t in (('key', key), ('value', value), ('rowptr', graph.rowptr),
                    ('edge_bias', edge_bias)):
        if t is not None and t.device != query.device:
            raise ValueError(f'{name} is on {t.device}, query on {query.device}')
    if graph.num_dst != n_dst or graph.num_src != n_src:
        raise ValueError(f'the graph has {graph.num_dst} destinations (rowptr '
                         f'[N_dst + 1] = [{graph.num_dst + 1}]) and {graph.num_src} '
                         f'sources; query and key have {n_dst} and {n_src}')
    if edge_bias is not None and edge_bias.shape != (graph.num_edges, heads):
        raise ValueError(f'edge_bias must be [E, H] = [{graph.num_edges}, {heads}], '
                         f'got {tuple(edge_bias.shape)}')


def _launch(query: Tensor, key: Tensor, value: Tensor, rowptr: Tensor | None,
            col: Tensor | None, metric: str, time_scale: float | Tensor,
            edge_bias: Tensor | None, dropout_p: float, seed: int | None,
            need_weights: bool, deterministic: bool, graph: TritonGraph | None
            ) -> tuple[Tensor, Tensor, Tensor]:
    """Check, prepare and run: ``(out, weights, row state)``."""
    _require_triton()
    check_metric(metric)
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f'dropout_p must lie in [0, 1], got {dropout_p}')
    needs_grad = torch.is_grad_enabled() and (key.requires_grad
                                              or value.requires_grad)
    if graph is None:
        if rowptr is None or col is None:
            raise ValueError('pass either rowptr and col, or a prepared graph')
        if key.dim() != 3:
            raise ValueError(f'key must be [N_src, H, D], got {tuple(key.shape)}')
        graph = prepare_triton_graph(rowptr, col, key.size(0),
                                     transpose=deterministic and needs_grad)
    elif rowptr is not None or col is not None:
        raise ValueError('pass either rowptr and col, or a prepared graph, not both')
    elif deterministic and needs_grad and not graph.has_transpose:
        raise ValueError('deterministic=True needs a graph prepared with '
                         'transpose=True (or pass deterministic=False)')
    _check_features(query, key, value, edge_bias, graph)
    device = query.device
    if isinstance(time_scale, Tensor):
        if time_scale.numel() != 1:
            raise ValueError('time_scale must be a float or a one-element tensor')
        ts = time_scale.to(device=device, dtype=torch.float32).reshape(1)
    else:
        ts = device_constant(float(time_scale), device, torch.float32, (1,))
    seed_t = None
    if dropout_p > 0:  # on the device: drawing or copying it never syncs
        seed_t = (torch.randint(2**31 - 1, (1,), device=device) if seed is None else
                  torch.full((1,), int(seed) % (2**31 - 1), device=device,
                             dtype=torch.long))
    out, stats, _, weights = run_attention(
        query.contiguous(), key.contiguous(), value.contiguous(), ts,
        None if edge_bias is None else edge_bias.contiguous(), seed_t,
        graph.tensors(transpose=deterministic), graph.chunk, metric,
        float(dropout_p), need_weights, ts.requires_grad and torch.is_grad_enabled())
    return out, weights, stats


def triton_metric_attention(query: Tensor, key: Tensor, value: Tensor,
                            rowptr: Tensor | None = None, col: Tensor | None = None,
                            metric: str = 'metric',
                            time_scale: float | Tensor = 1.0,
                            edge_bias: Tensor | None = None, dropout_p: float = 0.0,
                            seed: int | None = None, need_weights: bool = False,
                            deterministic: bool = True, *,
                            graph: TritonGraph | None = None
                            ) -> tuple[Tensor, Tensor | None]:
    r"""Sparse metric-attention over a destination-sorted CSR graph, fused in Triton.

    Args:
        query (Tensor): ``[N_dst, H, D]`` destination points (:math:`\phi(x_i)`
            for ``'metric'``/``'l2'``, the queries for ``'dot'``).
        key (Tensor): ``[N_src, H, D]`` source points / keys.
        value (Tensor): ``[N_src, H, C]``.
        rowptr (Tensor, optional): ``[N_dst + 1]`` int32/int64 CSR row pointer.
        col (Tensor, optional): ``[E]`` source of every edge, in CSR order
            (duplicates, self-loops and unsorted columns within a row are fine).
        metric (str): ``'metric'``, ``'l2'`` (logits :math:`-\|q_i-k_j\|^2/t`)
            or ``'dot'`` (:math:`q_i\cdot k_j/(\sqrt{D}t)`).
        time_scale (float or Tensor): :math:`t`; a one-element tensor gets a
            gradient when it requires one.
        edge_bias (Tensor, optional): ``[E, H]`` logit bias in CSR order.
        dropout_p (float): attention dropout probability (in-kernel RNG).
        seed (int, optional): dropout seed; drawn from torch's generator on the
            device when ``None`` (``torch.manual_seed`` reproduces it).
        need_weights (bool): also return the ``[E, H]`` weights
            :math:`\alpha_{ij} z_{ij}` in CSR order (after dropout).
        deterministic (bool): source-side gradients by a pass over the
            transpose (bitwise reproducible, default) instead of float atomics.
        graph (TritonGraph, optional): the graph from
            :func:`prepare_triton_graph`, instead of ``rowptr`` and ``col``:
            a caller that reuses a graph prepares (checks, transposes,
            schedules) it once; without it every call does.

    Returns:
        ``(out, weights)``: ``out`` ``[N_dst, H, C]`` in the input dtype (0 on
        rows without edges); ``weights`` ``[E, H]`` or ``None``.
    """
    out, weights, _ = _launch(query, key, value, rowptr, col, metric, time_scale,
                              edge_bias, dropout_p, seed, need_weights,
                              deterministic, graph)
    return out, weights if need_weights else None


def metric_attention_lse(query: Tensor, key: Tensor, value: Tensor,
                         rowptr: Tensor | None = None, col: Tensor | None = None,
                         metric: str = 'metric', time_scale: float | Tensor = 1.0,
                         edge_bias: Tensor | None = None, dropout_p: float = 0.0,
                         seed: int | None = None, need_weights: bool = False,
                         deterministic: bool = True, *,
                         graph: TritonGraph | None = None
                         ) -> tuple[Tensor, Tensor, Tensor | None]:
    """:func:`triton_metric_attention` that also returns the float32 row
    log-sum-exp ``[N_dst, H]``: ``(out, lse, weights)``. ``lse`` is ``-inf``
    on rows without edges and may overflow float32 where the logits do (it
    is ``R m' + log l`` of the row state, in the row's units ``R``, see
    :mod:`.kernels`)."""
    out, weights, stats = _launch(query, key, value, rowptr, col, metric,
                                  time_scale, edge_bias, dropout_p, seed,
                                  need_weights, deterministic, graph)
    largest, log_norm, _, exponent = stats.unbind(-1)
    unit = torch.exp2(exponent.double())  # R = 2^e_r, in which m' is counted
    lse = torch.where(largest == float('-inf'), float('-inf'),
                      (largest.double() * unit + log_norm).float())
    return out, lse, weights if need_weights else None
