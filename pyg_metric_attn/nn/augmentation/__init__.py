r"""The augmented queries and keys of dense metric attention, fused in Triton.

Dense metric attention (:mod:`~pyg_metric_attn.nn.functional`) runs SDPA
at scale :math:`2/t` on

.. math::
    q'_i = [q_i - c,\ -\tfrac12,\ 0, \dots], \qquad
    k'_j = [\tilde k_j,\ \|\tilde k_j\|^2 - \sigma,\ 0, \dots], \qquad
    \tilde k_j = a_j (k_j - c),

``W`` columns each, where :math:`c` is the centre of the keys of one
softmax (:func:`~pyg_metric_attn.nn.logits.centred`: the mean of the finite
keys that some query may attend to, :math:`a_j = 1`; 16-bit dtypes round
it to a grid), :math:`a_j = 0` for a key no query may attend to, and
:math:`\sigma` the mean of the key terms (a constant along every softmax
row: it only makes the terms smaller, so that they round less). Written as
torch ops that is some thirty kernels per forward and backward (reductions,
``isfinite``, ``where``, ``cat``, ``pad``), whose launches dominate short
sequences on a GPU; :func:`augmented_queries_and_keys` writes :math:`q'`
and :math:`k'` in two kernel launches and differentiates in one
(:mod:`.kernels`), as one custom operator to :func:`torch.compile`
(:mod:`.function`). Gradients, as
of the torch ops: :math:`dq = dq'_{:D}`, :math:`dk = a (dk'_{:D} + 2
\tilde k\, dk'_D)`; :math:`c` and :math:`\sigma` are constants.

The values are those of the torch ops to rounding: the centre is the mean
summed in float32 (float64) and rounded once, where the torch ops sum terms
rounded to the key dtype, so a 16-bit centre may lie one grid step from
theirs (a translation of every point of the softmax: no distance changes);
:math:`\sigma` comes from the keys' summaries (:mod:`.kernels`) instead of
the rounded centred keys, and is 0 where it would overflow (the torch ops
leave overflowing key terms out): a constant along every row either way.

It runs on CUDA tensors (:func:`runs_fused` says where
:mod:`~pyg_metric_attn.nn.functional` takes it); CPU tensors run the torch
ops, or, in tests, Triton's interpreter (``TRITON_INTERPRET=1``).
Dtypes: float16, bfloat16, float32 (sums in float32), float64.
"""
from __future__ import annotations

import os

import torch
from torch import Tensor

from pyg_metric_attn.nn.augmentation.function import run_augment
from pyg_metric_attn.nn.triton import HAVE_TRITON

__all__ = ['augmented_queries_and_keys', 'checked_augmentation', 'runs_fused',
           'FUSED_DEVICES']

#: The device types on which :func:`runs_fused` holds (Triton installed).
FUSED_DEVICES = ('cuda',)

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def runs_fused(query: Tensor, key: Tensor) -> bool:
    """Whether dense metric attention augments ``query`` and ``key`` here:
    on a device of :data:`FUSED_DEVICES` with Triton installed, one dtype
    of :data:`DTYPES` and the same leading dimensions (else the torch ops
    do, broadcasting as they do)."""
    return (HAVE_TRITON and query.device.type in FUSED_DEVICES
            and query.dtype == key.dtype and query.dtype in DTYPES
            and query.dim() == key.dim() >= 2
            and query.shape[:-2] == key.shape[:-2])


def augmented_queries_and_keys(query: Tensor, key: Tensor,
                               attended: Tensor | None,
                               width: int) -> tuple[Tensor, Tensor]:
    r"""The padded augmented :math:`q'`, :math:`k'` (module docstring).

    Args:
        query (torch.Tensor): Queries ``[..., L_q, D]``.
        key (torch.Tensor): Keys ``[..., L_k, D]``, the same leading
            dimensions and dtype.
        attended (torch.Tensor, optional): Boolean, :obj:`True` for a key
            some query may attend to, broadcastable to ``[..., L_k, 1]``
            (:obj:`None`: every key).
        width (int): The head width ``W >= D + 1`` of the outputs.

    Returns:
        ``(q' [..., L_q, W], k' [..., L_k, W])``, contiguous.
    """
    query_aug, key_aug, _ = _augment(query, key, attended, width, None)
    return query_aug, key_aug


def checked_augmentation(query: Tensor, key: Tensor, attended: Tensor | None,
                         width: int, time_scale: Tensor
                         ) -> tuple[Tensor, Tensor, Tensor]:
    r""":func:`augmented_queries_and_keys` with the ``'checked'`` precision
    policy's decision, made in the same operator (one more, small, launch):
    whether each softmax's fused logits round by more than the tolerance
    (:func:`~pyg_metric_attn.nn.logits.needs_exact` for the centred
    points). The flagged softmaxes' :math:`q'` and :math:`k'` are zeroed:
    their fused attention is to be replaced, and stays finite.

    The arguments are those of :func:`augmented_queries_and_keys` and:

    Args:
        time_scale (torch.Tensor): The time scale of every softmax
            (:func:`~pyg_metric_attn.nn.logits.slice_time_scale`; not
            differentiated).

    Returns:
        ``(q', k', needs_exact)``, the flags boolean of the leading
        dimensions.
    """
    leading = query.shape[:-2]  # the time scale as the points' [B, H]
    time_scale = _four_dimensional(
        time_scale.detach().expand(leading)[..., None, None])[..., 0, 0]
    query_aug, key_aug, flags = _augment(query, key, attended, width, time_scale)
    return query_aug, key_aug, flags.view(leading)


def _augment(query: Tensor, key: Tensor, attended: Tensor | None, width: int,
             time_scale: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    _check(query, key, attended, width)
    leading = query.shape[:-2]
    query_aug, key_aug, flags = run_augment(
        _four_dimensional(query), _four_dimensional(key),
        _mask_per_pair(attended, key), width, time_scale)
    return (query_aug.view(*leading, *query_aug.shape[2:]),
            key_aug.view(*leading, *key_aug.shape[2:]), flags)


def _four_dimensional(points: Tensor) -> Tensor:
    """``[..., L, D]`` as ``[B, H, L, D]`` (a view unless more than two
    leading dimensions do not merge)."""
    while points.dim() < 4:
        points = points.unsqueeze(0)
    return points.flatten(0, -4) if points.dim() > 4 else points


def _mask_per_pair(attended: Tensor | None, key: Tensor) -> Tensor | None:
    """The mask as a (broadcast) boolean ``[B, H, L_k]``."""
    if attended is None:
        return None
    mask = attended.squeeze(-1).expand(key.shape[:-1])
    return _four_dimensional(mask.unsqueeze(-1)).squeeze(-1)


def _check(query: Tensor, key: Tensor, attended: Tensor | None,
           width: int) -> None:
    if query.dim() < 2 or query.dim() != key.dim() or \
            query.shape[:-2] != key.shape[:-2] or query.size(-1) != key.size(-1):
        raise ValueError('query and key must be [..., L_q, D] and [..., L_k, D] '
                         'with the same leading dimensions; got '
                         f'{tuple(query.shape)} and {tuple(key.shape)}')
    if query.dtype != key.dtype or query.dtype not in DTYPES:
        raise TypeError(f'query and key must share one dtype of {DTYPES}; got '
                        f'{query.dtype} and {key.dtype}')
    if width < query.size(-1) + 1:
        raise ValueError(f'width must be at least D + 1 = {query.size(-1) + 1}, '
                         f'got {width}')
    if attended is not None and (
            attended.dtype != torch.bool or attended.dim() > key.dim()
            or any(size not in (1, target) for size, target in zip(
                reversed(attended.shape), reversed(key.shape[:-1] + (1,)),
                strict=False))):
        raise ValueError('attended must be boolean and broadcastable to '
                         f'{tuple(key.shape[:-1]) + (1,)}; got {attended.dtype} '
                         f'{tuple(attended.shape)}')
    interpreted = os.environ.get('TRITON_INTERPRET', '0') == '1'
    for name, t in (('key', key), ('attended', attended)):
        if t is not None and t.device != query.device:
            raise ValueError(f'{name} is on {t.device}, query on {query.device}')
    if not HAVE_TRITON:
        raise ImportError('augmented_queries_and_keys needs Triton, which is not '
                          'installed (pip install pyg-metric-attn[gpu])')
    if query.device.type != 'cuda' and not (query.device.type == 'cpu'
                                            and interpreted):
        raise RuntimeError(
            f'augmented_queries_and_keys runs on CUDA tensors (got '
            f'{query.device.type}); CPU tensors only in Triton\'s interpreter '
            '(TRITON_INTERPRET=1 set before the first call)')
