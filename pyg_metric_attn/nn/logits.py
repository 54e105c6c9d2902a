r"""Attention logits and their precision policy, shared by the dense
(:mod:`~pyg_metric_attn.nn.functional`) and the sparse
(:mod:`~pyg_metric_attn.nn.sparse_attention`) paths.

The logits are :math:`s_{ij} = -\|q_i - k_j\|^2 / t` (``'metric'``,
``'l2'``) or :math:`q_i^\top k_j / (\sqrt{D}\, t)` (``'dot'``). The fused
kernels compute the distance logits in the expanded form: since
:math:`\|q_i\|^2` is constant along a softmax row,

.. math::
    \mathrm{softmax}_j\!\left(-\|q_i - k_j\|^2 / t\right)
    = \mathrm{softmax}_j\!\left((2\, q_i^\top k_j - \|k_j\|^2) / t\right),

a dot product with the factor :func:`logit_scale` (``2/t``; ``'dot'``:
``1/(sqrt(D) t)``) plus a per-key term.

Precision. Distances are translation invariant, so queries and keys are
first shifted by the mean of the keys of their own softmax
(:func:`centred`: per batch element and head, counting only finite keys that
some query may attend to): sets far apart (the graphs of a mini-batch around
``+c`` and ``-c``), padding and a NaN or infinite point do not move a
centre, so a non-finite point stays confined to its own softmax. The
expanded form still rounds each logit by about

.. math::
    u \sqrt{D}\, (\max\|q\| + \max\|k\|)^2 / t

for the centred points (``u``: the unit roundoff of float32, or of float64
for float64 inputs; ``'dot'``: :math:`u \max\|q\| \max\|k\| / t`), because
it cancels large terms: large when the points are spread far apart within
one softmax, infinite when they are so large that the expanded form
overflows (or when a point is infinite). :func:`rounding_error` estimates it
on the device; the policy ``precision`` decides what happens above
:data:`LOGIT_ROUNDING_TOLERANCE` (``1e-3``):

* ``'checked'`` (the default), dense path: :func:`needs_exact` makes the
  decision per softmax (batch element and head) as a boolean tensor on the
  device; where the augmentation runs fused (on a GPU,
  :func:`~pyg_metric_attn.nn.augmentation.checked_augmentation`) the same
  decision is one more small launch inside the augmentation operator
  instead of a score of torch ops. The fused expanded form always runs
  (with the flagged softmaxes' points zeroed, so that it and its backward
  stay finite), then
  :func:`~pyg_metric_attn.nn.exact_attention.exact_attention_where`
  replaces the flagged softmaxes by attention computed in float64 from the
  direct differences, and their gradients likewise; one bad softmax costs
  the others nothing. Nothing is read back to the host, and
  :func:`torch.compile` compiles it as one graph (``fullgraph=True``). The
  result is finite for all finite inputs. Explicit paths
  (``need_weights``, normalisations other than ``'row'``) compute in
  float64 throughout (no decision needed).
* ``'checked'``, sparse path (:mod:`~pyg_metric_attn.nn.sparse_attention`):
  :func:`expanded_logits_are_accurate` reads the estimate over all points
  back to the host, one synchronisation per call and, under
  :func:`torch.compile`, one graph break; above the tolerance the call
  takes its exact path.
* ``'fast'`` (dense path only): no estimate and no correction: the centred
  expanded form alone, and the explicit paths in float32. It saves the
  decision and the correction operator, which is most of what
  ``'checked'`` costs where the step is bound by the host (short
  sequences on a GPU): a repeated training step of
  :class:`~pyg_metric_attn.nn.MetricMultiheadAttention` (embedding 32, 4
  heads, 16 tokens; counted on CPU with the augmentation routed through
  its kernels, as on a GPU) dispatches 114 aten ops and 3 augmentation
  launches with ``'fast'`` against 147 ops and 4 launches with
  ``'checked'`` (168 and 3 before the decision moved into the
  augmentation), an inference call 39 ops and 2 launches against 56 and 3;
  each aten op is a kernel launch on a GPU unless compiled, and on a GPU
  the correction adds its three Triton launches (one forward, two
  backward), whose programs load their softmax's flag and exit where it is
  not set. Its results match the checked ones wherever the estimate is
  within the tolerance (e.g. unit-scale embeddings at :math:`t \ge 1`);
  beyond it the logits carry the rounding above, and points that overflow
  the expanded form give non-finite outputs within their own softmax.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from pyg_metric_attn.nn.pseudo_metric import check_metric
from pyg_metric_attn.utils.constants import device_constant

# The largest estimated rounding error of a fused (expanded-form) logit that
# the 'checked' policy accepts; above it the exact path runs.
LOGIT_ROUNDING_TOLERANCE = 1e-3

PRECISIONS = ('checked', 'fast')


def check_precision(precision: str) -> str:
    """``precision`` if it names a policy, else a :class:`ValueError`."""
    if precision not in PRECISIONS:
        raise ValueError(f"Unknown precision '{precision}'; expected one of "
                         f"{PRECISIONS}")
    return precision


def logit_scale(metric: str, dim: int,
                time_scale: float | Tensor) -> float | Tensor:
    r"""The factor on :math:`q_i^\top k_j` in the logits: :math:`1 /
    (\sqrt{D}\, t)` for ``'dot'`` (``dim`` :math:`= D`), :math:`2 / t` for
    the expanded distance logits."""
    if metric == 'dot':
        return 1.0 / (math.sqrt(dim) * time_scale)
    return 2.0 / time_scale


def attention_logits(query: Tensor, key: Tensor, metric: str,
                     time_scale: float | Tensor = 1.0) -> Tensor:
    r"""The explicit ``[..., L_q, L_k]`` logit matrix (no masking); distances
    come from direct differences, so large offsets cost no precision."""
    check_metric(metric)
    if metric == 'dot':
        return (query @ key.transpose(-1, -2)) * logit_scale(
            metric, query.size(-1), time_scale)
    distance = torch.cdist(query, key,
                           compute_mode='donot_use_mm_for_euclid_dist')
    return -distance.square() / time_scale


def centred(query: Tensor, key: Tensor, dim: int = -2,
            mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Shift queries and keys by the mean key along ``dim`` (a constant for
    autograd): distances are unchanged, the expanded form
    ``|q|^2 - 2 q.k + |k|^2`` loses no precision to large offsets.

    Only finite keys count (a NaN or infinite key does not move the centre),
    and with ``mask`` (boolean, broadcastable to ``key`` with size 1 in the
    last dimension) only the keys where it is :obj:`True`; with no key left
    the centre is zero. In 16-bit dtypes the centre is rounded to a multiple
    of the unit in the last place of the largest counted coordinate, so that
    the shift itself rounds (almost) nothing: a centre near the origin
    becomes zero (in bfloat16 a rounded shift would cost more than it
    gains), one far from it is subtracted exactly (float32 and float64 lose
    too little to the shift to pay for that pass). Torch ops on the device,
    no synchronisation."""
    key_data = key.detach()
    # A key counts where its coordinate sum is finite (cheaper than checking
    # each coordinate; a finite key whose sum overflows just does not count).
    counted = key_data.sum(-1, keepdim=True).isfinite()
    if mask is not None:
        counted = counted & mask
    count = counted.sum(dim, keepdim=True).clamp(min=1)
    counted_keys = torch.where(counted, key_data, 0)
    finfo = torch.finfo(key.dtype)
    grid = None
    if finfo.bits <= 16:
        largest = torch.linalg.vector_norm(counted_keys, ord=math.inf,
                                           dim=(dim, -1), keepdim=True)
        grid = (torch.exp2(largest.clamp(min=finfo.tiny).log2().floor())
                * finfo.eps)
    # Divide before summing: no overflow even for keys near the dtype's max.
    centre = counted_keys.div_(count).sum(dim, keepdim=True)
    if grid is not None:
        centre = centre.div(grid).round().mul(grid)
    shifted_key = key - centre
    # Self-attention with a tied map: shift once (and keep `query is key`).
    return (shifted_key if query is key else query - centre), shifted_key


def rounding_error(query: Tensor, key: Tensor, metric: str,
                   time_scale: float | Tensor, per_slice: bool = False) -> Tensor:
    """The estimated rounding error of an expanded-form logit (see the module
    docstring) as float64 on the device (no synchronisation): ``inf`` for an
    infinite point or an overflowing norm; NaN points are ignored. A scalar
    over all points, or with ``per_slice`` one per softmax (the points of
    ``[..., L, D]`` grouped by their leading indices; a tensor time scale
    then has one element or one per slice, ``[..., 1, 1]``)."""
    rounding = torch.finfo(torch.promote_types(query.dtype,
                                               torch.float32)).eps / 2
    key_norm = _largest_norm(key, per_slice)
    query_norm = key_norm if query is key else _largest_norm(query, per_slice)
    if metric == 'dot':
        error = rounding * query_norm * key_norm
    else:
        error = (rounding_error_scale(query.dtype, query.size(-1))
                 * (query_norm + key_norm).square())
    if per_slice:
        time_scale = slice_time_scale(time_scale, error.device)
    time_scale = torch.as_tensor(time_scale).detach().to(error.device).double()
    return error / time_scale.abs()


def rounding_error_scale(dtype: torch.dtype, dim: int) -> float:
    r"""The factor :math:`u \sqrt{D}` of the distance logits' rounding
    estimate (:func:`rounding_error`) for points of ``dtype`` and width
    ``dim``: half the machine epsilon of float32 (or float64) times
    :math:`\sqrt{D}`."""
    return (torch.finfo(torch.promote_types(dtype, torch.float32)).eps / 2
            * math.sqrt(dim))


def needs_exact(query: Tensor, key: Tensor, metric: str,
                time_scale: float | Tensor) -> Tensor:
    """The ``'checked'`` policy's decision for the dense path, per softmax
    (the leading indices of ``query`` ``[..., L_q, D]`` and ``key``
    ``[..., L_k, D]`` broadcast together): a boolean tensor on the device,
    :obj:`True` where :func:`rounding_error` exceeds
    ``LOGIT_ROUNDING_TOLERANCE`` or is NaN. Nothing is read back to the
    host."""
    error = rounding_error(query, key, metric, time_scale, per_slice=True)
    return ~(error <= LOGIT_ROUNDING_TOLERANCE)


def slice_time_scale(time_scale: float | Tensor,
                     device: torch.device) -> Tensor:
    """The time scale as a float64 tensor with one value per softmax
    (broadcastable to the leading indices of the points; differentiable):
    a float or a one-element tensor as a scalar, a ``[..., 1, 1]`` tensor
    without its last two dimensions; other shapes are an error."""
    if not isinstance(time_scale, Tensor):  # (made once per value)
        return device_constant(float(time_scale), device, torch.float64)
    if time_scale.numel() == 1:
        return time_scale.double().reshape(())
    if time_scale.dim() >= 2 and time_scale.shape[-2:] == (1, 1):
        return time_scale.double()[..., 0, 0]
    raise ValueError(f"A tensor 'time_scale' must have one element or one per "
                     f"batch element and head ([..., 1, 1]), got shape "
                     f"{list(time_scale.shape)}")


@torch.compiler.disable
def expanded_logits_are_accurate(query: Tensor, key: Tensor, metric: str,
                                 time_scale: float | Tensor) -> bool:
    """Whether :func:`rounding_error` (over all points) is within
    ``LOGIT_ROUNDING_TOLERANCE``, read back to the host: the sparse path's
    decision (one synchronisation; under :func:`torch.compile` it runs
    eagerly, one graph break)."""
    error = rounding_error(query, key, metric, time_scale)
    return bool(error <= LOGIT_ROUNDING_TOLERANCE)


def _largest_norm(points: Tensor, per_slice: bool = False) -> Tensor:
    """The largest Euclidean norm of a point (rows along the last dimension)
    as float64, over all points or, with ``per_slice``, along ``dim=-2``;
    NaN rows are ignored, infinite entries and norms that overflow the
    points' dtype count as infinite. 0 without any point."""
    norms = torch.linalg.vector_norm(points.detach(), dim=-1)
    norms = norms.nan_to_num(nan=0.0, posinf=math.inf)
    if per_slice:
        if not norms.size(-1):
            return norms.new_zeros(norms.shape[:-1], dtype=torch.float64)
        return norms.amax(-1).double()
    if not norms.numel():
        return norms.new_zeros((), dtype=torch.float64)
    return norms.max().double()
