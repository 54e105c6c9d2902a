r"""Heat diffusion under a learned metric (paper, section 3).

With a learned map :math:`\phi`, metric-attention propagates over the points
:math:`\phi(x_i)`, which lie on the manifold :math:`\phi(M)`. Its heat-kernel
limit (:mod:`pyg_metric_attn.theory.heat_limit`) is then the drift-diffusion
operator of :math:`\phi(M)`: on a chart :math:`c \mapsto x(c)` of :math:`M`
with :math:`J = \partial \phi(x(c)) / \partial c` the metric pulled back to
the coordinates is :math:`g = J^\top J`, and

.. math::
    \frac{S f - f}{t / 4} \to \Delta_g f + 2\, \langle \nabla_g \log p_g,
    \nabla_g f \rangle_g, \qquad
    \Delta_g f = |g|^{-1/2}\, \partial_i \big(|g|^{1/2} g^{ij}\,
    \partial_j f\big), \qquad
    p_g = p\, \frac{|g_0|^{1/2}}{|g|^{1/2}},

with :math:`p` the sampling density with respect to the volume of :math:`M`
(metric :math:`g_0`, the pull-back of the embedding alone) and :math:`p_g`
the same density with respect to the volume of :math:`\phi(M)`. The limit
needs :math:`\phi` to be an injective immersion of :math:`M` (:math:`g`
positive definite); with :math:`\phi` the identity the target is the
Euclidean one. :func:`induced_drift_diffusion` evaluates the right-hand side
exactly (automatic differentiation of the chart, :math:`\phi`, :math:`f` and
:math:`\log p` with :mod:`torch.func`, second derivatives included), in the
coordinates' dtype; :func:`pullback_metric` gives :math:`g` itself.
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor
from torch.func import grad, jacfwd, vmap

from pyg_metric_attn.theory.manifolds import Chart

FeatureMap = Callable[[Tensor], Tensor]


def _check_coords(coords: Tensor) -> None:
    if coords.dim() != 2 or not coords.is_floating_point():
        raise ValueError(f"'coords' must be floating-point [n, d], got "
                         f"{list(coords.shape)} of {coords.dtype}")


def _composed(chart: Chart, feature_map: FeatureMap | None) -> FeatureMap:
    if feature_map is None:
        return chart.embedding
    return lambda c: feature_map(chart.embedding(c))


def _metric(mapping: FeatureMap) -> Callable[[Tensor], Tensor]:
    """``c [d] -> J^T J [d, d]`` for ``J`` the Jacobian of ``mapping``."""
    def metric(c: Tensor) -> Tensor:
        jacobian = jacfwd(mapping)(c)  # [D, d]
        return jacobian.mT @ jacobian
    return metric


# Both by the Cholesky factor: under vmap, jacfwd of torch.linalg.solve and
# torch.linalg.det gives wrong or infinite derivatives (torch 2.13), which the
# triangular solves do not.
def _half_log_det(g: Tensor) -> Tensor:
    """``log |g|^(1/2)`` of a positive definite ``g`` (NaN or -inf where
    ``g`` is not positive definite)."""
    return torch.linalg.cholesky_ex(g).L.diagonal().log().sum()


def _solve(g: Tensor, b: Tensor) -> Tensor:
    """``g^-1 b`` for a positive definite ``g [d, d]`` and ``b [d]``."""
    lower = torch.linalg.cholesky_ex(g).L
    half = torch.linalg.solve_triangular(lower, b.unsqueeze(-1), upper=False)
    return torch.linalg.solve_triangular(lower.mT, half, upper=True).squeeze(-1)


def pullback_metric(chart: Chart, coords: Tensor,
                    feature_map: FeatureMap | None = None) -> Tensor:
    r"""The metric :math:`g = J^\top J` of :math:`\phi \circ x` at every
    point, ``[n, d, d]`` (:math:`\phi` the identity without
    ``feature_map``, i.e. the manifold's own metric :math:`g_0`)."""
    _check_coords(coords)
    return vmap(_metric(_composed(chart, feature_map)))(coords)


def induced_drift_diffusion(chart: Chart, coords: Tensor,
                            feature_map: FeatureMap | None = None,
                            chunk_size: int | None = 1024) -> Tensor:
    r""":math:`\Delta_g f + 2 \langle \nabla_g \log p_g, \nabla_g f\rangle_g`
    at every point, ``[n]``: the heat-kernel limit of attention over the
    points :math:`\phi(x(c_i))`.

    Args:
        chart (Chart): The manifold's parametrisation, test function and
            log-density (with respect to the manifold's own volume).
        coords (torch.Tensor): ``[n, d]`` chart coordinates of the points.
        feature_map (callable, optional): :math:`\phi`, taking one ambient
            point ``[D]`` to ``[E]`` in the coordinates' dtype (e.g. a
            ``float64`` copy of a trained
            :class:`~pyg_metric_attn.nn.pseudo_metric.ResidualTanhMLP`);
            :obj:`None` is the identity.
        chunk_size (int, optional): Points per vectorised chunk.

    Raises:
        ValueError: Where :math:`g` is singular or the result is not finite
            (:math:`\phi` is not an immersion there, or the chart is
            singular), naming how many points are affected.
    """
    _check_coords(coords)
    metric = _metric(_composed(chart, feature_map))
    base_metric = _metric(chart.embedding)

    def flux(c: Tensor) -> Tensor:  # |g|^(1/2) g^-1 grad f, [d]
        g = metric(c)
        return _half_log_det(g).exp() * _solve(g, grad(chart.function)(c))

    def log_density_g(c: Tensor) -> Tensor:  # log p_g, up to a constant
        return (chart.log_density(c) + _half_log_det(base_metric(c))
                - _half_log_det(metric(c)))

    def target(c: Tensor) -> Tensor:
        g = metric(c)
        divergence = jacfwd(flux)(c).diagonal().sum()
        laplacian = divergence / _half_log_det(g).exp()
        gradient_f = _solve(g, grad(chart.function)(c))  # g^-1 df
        drift = grad(log_density_g)(c) @ gradient_f
        return laplacian + 2 * drift

    values = vmap(target, chunk_size=chunk_size)(coords)
    bad = ~values.isfinite()
    if bad.any():
        raise ValueError(
            f'The induced drift-diffusion is not finite at {int(bad.sum())} of '
            f'{coords.size(0)} points: the map is not an immersion there '
            f'(singular metric J^T J) or the chart is singular')
    return values
