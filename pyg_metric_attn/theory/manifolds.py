r"""Point samples of closed manifolds whose Laplace-Beltrami operator is known.

The paper's section 2.3 (Ruan & Zhang, arXiv 2412.18288) shows that attention
propagation with the heat kernel tends, for many samples and a small time
:math:`t`, to a drift-diffusion operator,

.. math::
    \frac{(S f)(x) - f(x)}{t / 4} \to \Delta f(x) + 2\, \nabla \log p(x)
    \cdot \nabla f(x), \qquad
    S_{ij} = \frac{\exp(-\|x_i - x_j\|^2 / t)}{\sum_k \exp(-\|x_i - x_k\|^2 / t)},

with :math:`\Delta` the Laplace-Beltrami operator (negative semi-definite) and
:math:`p` the sampling density with respect to the manifold's volume. To
measure that limit one needs manifolds, densities and test functions for which
the right-hand side is known in closed form: each sampler here returns the
points (in the ambient space), a smooth test function and its
drift-diffusion target at the points.

* :func:`circle`: the unit circle, :math:`f = \cos k\theta`,
  :math:`\Delta f = -k^2 f`; density uniform or :math:`\propto 1 + a \cos\theta`.
* :func:`sphere`: the unit sphere :math:`S^2`, :math:`f = P_l(z)` (a zonal
  spherical harmonic), :math:`\Delta f = -l(l + 1) f`; density uniform or von
  Mises-Fisher :math:`\propto e^{\kappa z}`.
* :func:`torus`: the torus of radii :math:`R > r` in :math:`\mathbb{R}^3`,
  :math:`f = \cos\theta + \cos\varphi`; density uniform (with respect to
  area) or :math:`\propto 1 + a \cos\theta`.

Each sample also carries its chart coordinates and a :class:`Chart` (the
parametrisation, the test function and the log-density as functions of the
coordinates), from which
:func:`~pyg_metric_attn.theory.induced_metric.induced_drift_diffusion`
computes the target under any map :math:`\phi` of the points.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

DENSITIES = ('uniform', 'non-uniform')


@dataclass(frozen=True)
class Chart:
    """A parametrised manifold with a test function and a sampling density.

    Each callable takes the coordinates of *one* point, ``[d]``, and is
    vectorised over points with :func:`torch.func.vmap` (so it indexes
    ``c[0]``, ``c[1]``, never a batch dimension).
    """
    #: ``[d] -> [D]``: the point of the manifold in the ambient space.
    embedding: Callable[[Tensor], Tensor]
    #: ``[d] -> []``: the test function f.
    function: Callable[[Tensor], Tensor]
    #: ``[d] -> []``: log of the sampling density with respect to the
    #: embedded manifold's volume, up to an additive constant.
    log_density: Callable[[Tensor], Tensor]


@dataclass
class ManifoldSample:
    """``n`` points of a manifold and a test function on them (float64)."""
    points: Tensor           # [n, ambient dimension]
    function: Tensor         # [n]  f
    drift_diffusion: Tensor  # [n]  Laplace-Beltrami f + 2 grad(log p) . grad f
    dimension: int           # intrinsic dimension d
    coords: Tensor           # [n, d] chart coordinates of the points
    chart: Chart             # the parametrisation, f and log p of the coords


def _check(num_points: int, density: str) -> None:
    if num_points < 2:
        raise ValueError(f"'num_points' must be at least 2, got {num_points}")
    if density not in DENSITIES:
        raise ValueError(f"Unknown density '{density}'; expected one of "
                         f"{DENSITIES}")


def _rejection(num_points: int, propose, accept_probability,
               generator: torch.Generator) -> Tensor:
    """``num_points`` draws of ``propose(m)`` kept with
    ``accept_probability(draws)`` (values in [0, 1])."""
    kept: list[Tensor] = []
    count = 0
    while count < num_points:
        draws = propose(2 * (num_points - count) + 16)
        keep = torch.rand(draws.size(0), generator=generator,
                          dtype=torch.float64) < accept_probability(draws)
        kept.append(draws[keep])
        count += int(keep.sum())
    return torch.cat(kept)[:num_points]


def circle(num_points: int, density: str = 'uniform', frequency: int = 2,
           amplitude: float = 0.5, seed: int = 0) -> ManifoldSample:
    r"""The unit circle; non-uniform density :math:`\propto 1 + a\cos\theta`
    (``amplitude`` :math:`a < 1`)."""
    _check(num_points, density)
    generator = torch.Generator().manual_seed(seed)

    def propose(m: int) -> Tensor:
        return torch.rand(m, generator=generator, dtype=torch.float64) * 2 * math.pi

    a = amplitude if density == 'non-uniform' else 0.0
    theta = _rejection(num_points, propose,
                       lambda th: (1 + a * th.cos()) / (1 + abs(a)), generator)
    k = frequency
    function = (k * theta).cos()
    laplacian = -k * k * function
    # d/ds log p * d/ds f along the unit-speed angle.
    drift = (-a * theta.sin() / (1 + a * theta.cos())) * (-k * (k * theta).sin())
    points = torch.stack([theta.cos(), theta.sin()], dim=1)
    chart = Chart(embedding=lambda c: torch.stack([c[0].cos(), c[0].sin()]),
                  function=lambda c: (k * c[0]).cos(),
                  log_density=lambda c: torch.log1p(a * c[0].cos()))
    return ManifoldSample(points, function, laplacian + 2 * drift, 1,
                          theta.unsqueeze(1), chart)


def _legendre(degree: int, z: Tensor) -> tuple[Tensor, Tensor]:
    """:math:`P_l(z)` and :math:`P_l'(z)` by the three-term recurrence."""
    p_prev, p = torch.ones_like(z), z.clone()
    if degree == 0:
        return p_prev, torch.zeros_like(z)
    for n in range(1, degree):
        p_prev, p = p, ((2 * n + 1) * z * p - n * p_prev) / (n + 1)
    # (1 - z^2) P_l' = l (P_{l-1} - z P_l)
    return p, degree * (p_prev - z * p)  # the second value times 1/(1 - z^2)


def sphere(num_points: int, density: str = 'uniform', degree: int = 2,
           concentration: float = 1.0, seed: int = 0) -> ManifoldSample:
    r"""The unit sphere :math:`S^2`; non-uniform density von Mises-Fisher
    :math:`\propto e^{\kappa z}` (``concentration`` :math:`\kappa > 0`)."""
    _check(num_points, density)
    if degree < 0:
        raise ValueError(f"'degree' must be non-negative, got {degree}")
    generator = torch.Generator().manual_seed(seed)
    kappa = concentration if density == 'non-uniform' else 0.0
    u = torch.rand(num_points, generator=generator, dtype=torch.float64)
    if kappa > 0:  # inverse CDF of z under e^{kappa z} on [-1, 1]
        z = 1 + torch.log(u + (1 - u) * math.exp(-2 * kappa)) / kappa
    else:
        z = 2 * u - 1
    angle = torch.rand(num_points, generator=generator,
                       dtype=torch.float64) * 2 * math.pi
    radius = (1 - z.square()).clamp(min=0).sqrt()
    points = torch.stack([radius * angle.cos(), radius * angle.sin(), z], dim=1)
    function, scaled_derivative = _legendre(degree, z)
    laplacian = -degree * (degree + 1) * function
    # grad log p = kappa grad z; grad f = P_l'(z) grad z; |grad z|^2 = 1 - z^2.
    drift = kappa * scaled_derivative

    def embedding(c: Tensor) -> Tensor:  # coordinates (z, longitude)
        ring = (1 - c[0].square()).sqrt()
        return torch.stack([ring * c[1].cos(), ring * c[1].sin(), c[0]])

    chart = Chart(embedding, function=lambda c: _legendre(degree, c[0])[0],
                  log_density=lambda c: kappa * c[0])
    return ManifoldSample(points, function, laplacian + 2 * drift, 2,
                          torch.stack([z, angle], dim=1), chart)


def torus(num_points: int, density: str = 'uniform', major_radius: float = 2.0,
          minor_radius: float = 1.0, amplitude: float = 0.5,
          seed: int = 0) -> ManifoldSample:
    r"""The torus :math:`((R + r\cos\varphi)\cos\theta, (R +
    r\cos\varphi)\sin\theta, r\sin\varphi)`; non-uniform density (with
    respect to area) :math:`\propto 1 + a\cos\theta`."""
    _check(num_points, density)
    R, r = major_radius, minor_radius
    if not 0 < r < R:
        raise ValueError(f"A torus needs 0 < minor_radius < major_radius, got "
                         f"{minor_radius} and {major_radius}")
    generator = torch.Generator().manual_seed(seed)
    a = amplitude if density == 'non-uniform' else 0.0

    def propose(m: int) -> Tensor:
        return torch.rand(m, 2, generator=generator, dtype=torch.float64) * 2 * math.pi

    def accept(angles: Tensor) -> Tensor:  # area element times the density
        theta, phi = angles.unbind(1)
        return ((R + r * phi.cos()) / (R + r)) * (1 + a * theta.cos()) / (1 + abs(a))

    theta, phi = _rejection(num_points, propose, accept, generator).unbind(1)
    ring = R + r * phi.cos()
    points = torch.stack([ring * theta.cos(), ring * theta.sin(),
                          r * phi.sin()], dim=1)
    function = theta.cos() + phi.cos()
    # Metric diag(ring^2, r^2), sqrt(det g) = r ring.
    laplacian = (-theta.cos() / ring.square()
                 + (r * phi.sin().square() - ring * phi.cos()) / (r * r * ring))
    drift = (-a * theta.sin() / (1 + a * theta.cos())) * (-theta.sin()) / ring.square()

    def embedding(c: Tensor) -> Tensor:  # coordinates (theta, phi)
        ring = R + r * c[1].cos()
        return torch.stack([ring * c[0].cos(), ring * c[0].sin(),
                            r * c[1].sin()])

    chart = Chart(embedding, function=lambda c: c[0].cos() + c[1].cos(),
                  log_density=lambda c: torch.log1p(a * c[0].cos()))
    return ManifoldSample(points, function, laplacian + 2 * drift, 2,
                          torch.stack([theta, phi], dim=1), chart)


MANIFOLDS = {'circle': circle, 'sphere': sphere, 'torus': torus}
