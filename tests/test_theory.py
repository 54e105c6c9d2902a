"""The heat-kernel limit of attention propagation (issue 18, §3): samplers
with known drift-diffusion targets, and the limit itself on noise-free
(quasi-uniform or quantile) samples where only the O(t) bias remains."""
from __future__ import annotations

import math

import pytest
import torch

from pyg_metric_attn.theory import (
    circle,
    log_log_slope,
    propagation_generator,
    relative_error,
    sphere,
    torus,
)
from pyg_metric_attn.theory.manifolds import ManifoldSample


def error(points, function, target, t):
    estimate = propagation_generator(points, function, t)
    return float((estimate - target).square().mean().sqrt()
                 / target.square().mean().sqrt())


def circle_quantiles(n, a, k=2):
    """Points at the quantiles of the density (1 + a cos) / 2 pi: a sample
    without sampling noise; target as in ``circle``."""
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n * 2 * math.pi
    theta = u.clone()
    for _ in range(50):  # Newton on theta + a sin(theta) = u
        theta = theta - (theta + a * theta.sin() - u) / (1 + a * theta.cos())
    f = (k * theta).cos()
    target = -k * k * f + 2 * (-a * theta.sin() / (1 + a * theta.cos())) * (
        -k * (k * theta).sin())
    return torch.stack([theta.cos(), theta.sin()], 1), f, target


@pytest.mark.parametrize('a', [0.0, 0.5])
def test_circle_limit_is_first_order_in_t(a):
    """Noise-free samples: the error is the bias alone, proportional to t
    (slope 1), and small: the constant 4 and the drift term are right."""
    points, f, target = circle_quantiles(1500, a)
    ts = [0.002, 0.005, 0.02]
    errors = [error(points, f, target, t) for t in ts]
    assert errors[0] < 3e-3
    assert log_log_slope(ts, errors) == pytest.approx(1.0, abs=0.1)
    # Without the drift term the non-uniform case would be far off.
    if a:
        diffusion_only = -4 * f
        assert error(points, f, diffusion_only, 0.002) > 0.1


@pytest.mark.parametrize('kappa', [0.0, 1.0])
def test_sphere_limit_on_a_quasi_uniform_sample(kappa):
    """Quantiles of z under e^(kappa z) and golden-angle longitudes."""
    n = 6000
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n
    z = 1 + torch.log(u + (1 - u) * math.exp(-2 * kappa)) / kappa if kappa \
        else 2 * u - 1
    angle = math.pi * (1 + 5 ** 0.5) * torch.arange(n, dtype=torch.float64)
    r = (1 - z * z).sqrt()
    points = torch.stack([r * angle.cos(), r * angle.sin(), z], 1)
    f = (3 * z * z - 1) / 2
    target = -6 * f + 2 * kappa * 3 * z * (1 - z * z)
    assert error(points, f, target, 0.03) < 0.03


def laplace_beltrami(embedding, function, coords, step=1e-4):
    """Delta f = g^-1/2 d_i (g^1/2 g^ij d_j f) at 2-D coordinates by central
    differences of the parametrisation (for checking closed forms)."""
    def metric(c):
        c = c.clone().requires_grad_()
        jac = torch.autograd.functional.jacobian(embedding, c)  # [3, 2]
        return jac.T @ jac

    def flux(c, i):
        g = metric(c)
        grad = torch.autograd.functional.jacobian(function, c)
        return (g.det().sqrt() * torch.linalg.solve(g, grad))[i]

    total = 0.0
    for i in range(2):
        e = torch.zeros(2, dtype=torch.float64)
        e[i] = step
        total = total + (flux(coords + e, i) - flux(coords - e, i)) / (2 * step)
    return total / metric(coords).det().sqrt()


def test_torus_target_matches_a_numerical_laplace_beltrami():
    R, r, a = 2.0, 1.0, 0.5

    def embed(c):
        th, ph = c
        return torch.stack([(R + r * ph.cos()) * th.cos(),
                            (R + r * ph.cos()) * th.sin(), r * ph.sin()])

    def f(c):
        return c[0].cos() + c[1].cos()

    sample = torus(50, 'non-uniform', R, r, a, seed=3)
    for point, target in zip(sample.points[:5], sample.drift_diffusion[:5],
                             strict=True):
        ph = torch.atan2(point[2] / r, (point[:2].norm() - R) / r)
        th = torch.atan2(point[1], point[0])
        c = torch.stack([th, ph])
        drift = (-a * th.sin() / (1 + a * th.cos())) * (-th.sin()) / (
            R + r * ph.cos()) ** 2
        assert float(laplace_beltrami(embed, f, c) + 2 * drift) == pytest.approx(
            float(target), abs=1e-5)


def test_samplers_follow_their_densities():
    s = circle(40000, 'non-uniform', amplitude=0.5, seed=1)
    assert float(s.points[:, 0].mean()) == pytest.approx(0.25, abs=0.01)  # a/2
    s = sphere(40000, 'non-uniform', concentration=1.0, seed=1)
    # E[z] under e^z on [-1, 1]: coth(1) - 1
    assert float(s.points[:, 2].mean()) == pytest.approx(
        1 / math.tanh(1.0) - 1, abs=0.01)
    assert torch.allclose(s.points.norm(dim=1), torch.ones(40000,
                                                           dtype=torch.float64))
    s = torus(40000, 'uniform', seed=1)
    # area-uniform: E[cos phi] = r / (2 R)
    cos_phi = (s.points[:, :2].norm(dim=1) - 2.0) / 1.0
    assert float(cos_phi.mean()) == pytest.approx(0.25, abs=0.01)


def test_random_samples_converge_with_n():
    """With sampling noise the error falls as n grows (fixed t)."""
    small = relative_error(sphere(500, 'non-uniform', seed=0), 0.1)
    large = relative_error(sphere(4000, 'non-uniform', seed=0), 0.1)
    assert large < 0.7 * small


def test_clear_errors():
    with pytest.raises(ValueError, match="Unknown density"):
        circle(10, 'gaussian')
    with pytest.raises(ValueError, match="0 < minor_radius < major_radius"):
        torus(10, major_radius=1.0, minor_radius=2.0)
    with pytest.raises(ValueError, match="'time_scale' must be positive"):
        propagation_generator(torch.randn(5, 2), torch.randn(5), 0.0)
    with pytest.raises(ValueError, match=r"'points' must be \[n, D\]"):
        propagation_generator(torch.randn(5, 2), torch.randn(4), 0.1)
    assert isinstance(circle(5), ManifoldSample)


def test_rank_one_residual():
    from pyg_metric_attn.theory import rank_one_residual, residuals_through_depth
    batch = torch.tensor([0, 0, 0, 1, 1])
    x = torch.tensor([[1.0, 2.0], [1.0, 2.0], [1.0, 2.0], [1.0, 0.0], [-1.0, 0.0]])
    res = rank_one_residual(x, batch)
    assert res[0] == 0.0 and res[1] == pytest.approx(1.0)  # mean 0: all spread
    assert rank_one_residual(torch.zeros(3, 2))[0] == 0.0
    # Averaging layers collapse a set to rank one.
    average = lambda h: h.mean(0, keepdim=True).expand_as(h)  # noqa: E731
    depth = residuals_through_depth([average, average], torch.randn(6, 3))
    assert depth.shape == (3, 1) and depth[0, 0] > 0 and depth[1:].abs().max() < 1e-12


def test_heat_limit_experiment_command(tmp_path, capsys):
    from pyg_metric_attn.cli import main
    out = tmp_path / 'heat'
    assert main(['experiment', 'heat_limit', '--manifolds', 'circle',
                 '--densities', 'uniform', '--sizes', '100', '300', '--times',
                 '0.05', '0.2', '0.5', '--seeds', '1', '--out', str(out),
                 '--no-progress']) == 0
    table = capsys.readouterr().out
    assert '| circle | uniform | 300 |' in table and 'bias slope' in table
    for name in ('results.json', 'summary.md', 'heat_limit.png'):
        assert (out / name).stat().st_size > 0
    import json
    results = json.loads((out / 'results.json').read_text())
    assert len(results['cells']) == 2 * 3
    curve, = results['curves']
    assert curve['variance_slope'] < 0  # more samples, less error
    assert main(['experiment', 'heat_limit', '--manifolds', 'cube',
                 '--out', str(out)]) != 0
    assert 'Unknown manifold' in capsys.readouterr().err


def test_rank_collapse_experiment_command(tmp_path, capsys):
    """Pure dot-product attention collapses the sets within a few blocks;
    skip connections keep them apart (a small, seeded run)."""
    import json

    from pyg_metric_attn.cli import main
    out = tmp_path / 'rank'
    assert main(['experiment', 'rank_collapse', '--depth', '6', '--seeds', '1',
                 '--sets', '2', '--set-size', '30', '--out', str(out),
                 '--no-progress']) == 0
    assert '| dot | attention |' in capsys.readouterr().out
    assert (out / 'rank_collapse.png').stat().st_size > 0
    curves = {(c['metric'], c['block']): c['mean'] for c in
              json.loads((out / 'results.json').read_text())['curves']}
    assert len(curves) == 9 and all(len(m) == 7 for m in curves.values())
    assert curves['dot', 'attention'][-1] < 1e-3 * curves['dot', 'attention'][0]
    assert curves['dot', 'skip'][-1] > 0.1
