r"""The heat-kernel limit of attention propagation (paper, sections 2.3 and 3).

With :math:`\phi` the identity, metric-attention propagates a function
:math:`f` sampled at points :math:`x_1, \dots, x_n` of a manifold as
:math:`S f`, :math:`S = \mathrm{softmax}_j(-\|x_i - x_j\|^2 / t)`. For
:math:`n \to \infty` and then :math:`t \to 0`,

.. math::
    L_{n,t} f = \frac{S f - f}{t / 4} \to \Delta f + 2\, \nabla\log p \cdot
    \nabla f,

a drift-diffusion operator (:mod:`pyg_metric_attn.theory.manifolds` samples
manifolds where the right-hand side is known). The error has two parts with
opposite trends: a bias that shrinks with :math:`t` (:math:`O(t)`) and a
sampling variance that grows as :math:`t` shrinks (about
:math:`1 / (n\, t^{d/2 + 1})` in the squared error for intrinsic dimension
:math:`d`), so for each :math:`n` there is a best :math:`t`.
:func:`propagation_generator` computes :math:`L_{n,t} f` with the library's
own dense attention (float64, in row blocks so that no :math:`n \times n`
matrix is held), :func:`relative_error` compares it with the target. With a
learned :math:`\phi` the target is that of the induced metric
(:mod:`pyg_metric_attn.theory.induced_metric`).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from pyg_metric_attn.nn.functional import dense_metric_attention
from pyg_metric_attn.theory.manifolds import ManifoldSample


def propagation_generator(points: Tensor, function: Tensor, time_scale: float,
                          block_size: int = 2048) -> Tensor:
    r""":math:`(S f - f) / (t / 4)` at every point, ``[n]`` (float64).

    Args:
        points (torch.Tensor): ``[n, D]`` points (e.g. :math:`\phi(x_i)`).
        function (torch.Tensor): ``[n]`` values of :math:`f`.
        time_scale (float): The heat-kernel time :math:`t > 0`.
        block_size (int): Query rows per attention call.
    """
    if points.dim() != 2 or function.shape != points.shape[:1]:
        raise ValueError(f"'points' must be [n, D] and 'function' [n], got "
                         f"{list(points.shape)} and {list(function.shape)}")
    if not time_scale > 0:
        raise ValueError(f"'time_scale' must be positive, got {time_scale}")
    points = points.double()
    values = function.double().unsqueeze(1)
    propagated = torch.cat([
        dense_metric_attention(points[start:start + block_size], points, values,
                               metric='l2', time_scale=time_scale)[0]
        for start in range(0, points.size(0), block_size)]).squeeze(1)
    return (propagated - values.squeeze(1)) / (time_scale / 4)


def relative_rms(estimate: Tensor, target: Tensor,
                 reference: Tensor | None = None) -> float:
    """RMS of ``estimate - target`` relative to the RMS of ``reference``
    (default: ``target``)."""
    reference = target if reference is None else reference
    if not estimate.shape == target.shape == reference.shape:
        raise ValueError(f"'estimate', 'target' and 'reference' differ in "
                         f"shape: {list(estimate.shape)}, {list(target.shape)} "
                         f"and {list(reference.shape)}")
    return float((estimate - target).square().mean().sqrt()
                 / reference.square().mean().sqrt())


def relative_error(sample: ManifoldSample, time_scale: float,
                   block_size: int = 2048) -> float:
    r"""RMS of :math:`L_{n,t} f - (\Delta f + 2 \nabla\log p\cdot\nabla f)`
    over the points, relative to the RMS of the target."""
    estimate = propagation_generator(sample.points, sample.function, time_scale,
                                     block_size)
    return relative_rms(estimate, sample.drift_diffusion)


def log_log_slope(x: list[float], y: list[float]) -> float:
    """Least-squares slope of ``log y`` against ``log x``."""
    if len(x) != len(y) or len(x) < 2:
        raise ValueError('a slope needs at least two (x, y) pairs of equal count')
    lx = torch.tensor([math.log(v) for v in x], dtype=torch.float64)
    ly = torch.tensor([math.log(v) for v in y], dtype=torch.float64)
    lx, ly = lx - lx.mean(), ly - ly.mean()
    return float((lx * ly).sum() / lx.square().sum())
