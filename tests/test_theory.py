"""The heat-kernel limit of attention propagation (issue 18, §3): samplers
with known drift-diffusion targets, the limit itself on noise-free
(quasi-uniform or quantile) samples where only the O(t) bias remains, and the
target of the metric induced by a map phi against closed forms, finite
differences and the propagation; rank collapse (§4)."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import shared_dataset

from pyg_metric_attn.nn.pseudo_metric import ResidualTanhMLP
from pyg_metric_attn.theory import (
    MANIFOLDS,
    Chart,
    circle,
    induced_drift_diffusion,
    log_log_slope,
    propagation_generator,
    pullback_metric,
    relative_error,
    relative_rms,
    sphere,
    torus,
)
from pyg_metric_attn.theory.manifolds import ManifoldSample


def error(points, function, target, t):
    estimate = propagation_generator(points, function, t)
    return float((estimate - target).square().mean().sqrt()
                 / target.square().mean().sqrt())


def quantile_angles(n, a):
    """Angles at the quantiles of the density (1 + a cos) / 2 pi on the circle:
    a sample without sampling noise."""
    u = (torch.arange(n, dtype=torch.float64) + 0.5) / n * 2 * math.pi
    theta = u.clone()
    for _ in range(50):  # Newton on theta + a sin(theta) = u
        theta = theta - (theta + a * theta.sin() - u) / (1 + a * theta.cos())
    return theta


def circle_quantiles(n, a, k=2):
    """Quantile points of the density (1 + a cos) / 2 pi; target as in
    ``circle``."""
    theta = quantile_angles(n, a)
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


@pytest.mark.parametrize('name', list(MANIFOLDS))
@pytest.mark.parametrize('density', ['uniform', 'non-uniform'])
def test_identity_gives_the_euclidean_targets(name, density):
    sample = MANIFOLDS[name](200, density, seed=2)
    assert sample.coords.shape == (200, sample.dimension)
    assert torch.allclose(torch.func.vmap(sample.chart.embedding)(sample.coords),
                          sample.points, atol=1e-12)
    target = induced_drift_diffusion(sample.chart, sample.coords)
    assert torch.allclose(target, sample.drift_diffusion, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize('name', ['circle', 'sphere', 'torus'])
def test_scaling_divides_by_its_square_and_rigid_motions_change_nothing(name):
    sample = MANIFOLDS[name](100, 'non-uniform', seed=3)
    scaled = induced_drift_diffusion(sample.chart, sample.coords,
                                     lambda x: 2.5 * x)
    assert torch.allclose(scaled, sample.drift_diffusion / 2.5 ** 2,
                          rtol=1e-9, atol=1e-9)
    ambient = sample.points.size(1)
    rotation = torch.linalg.qr(torch.randn(ambient + 1, ambient + 1,
                                           dtype=torch.float64))[0]
    shift = torch.randn(ambient + 1, dtype=torch.float64)

    def rigid(x):  # into one more dimension, rotated and shifted
        return rotation @ torch.cat([x, x.new_zeros(1)]) + shift
    moved = induced_drift_diffusion(sample.chart, sample.coords, rigid)
    assert torch.allclose(moved, sample.drift_diffusion, rtol=1e-9, atol=1e-9)


A = 0.5  # the curve below: speed 1 + A cos 2 theta


def curve_map(x):
    r"""z -> z + (A/6) z^3 - (A/2) conj(z): the unit circle onto a convex
    closed curve with speed :math:`1 + A\cos 2\theta` and arc length
    :math:`s = \theta + (A/2)\sin 2\theta` in closed form."""
    re, im = x[..., 0], x[..., 1]
    cube = torch.stack([re ** 3 - 3 * re * im ** 2, 3 * re ** 2 * im - im ** 3], -1)
    return x + A / 6 * cube - A / 2 * torch.stack([re, -im], -1)


def arc_length(theta):
    return theta + A / 2 * (2 * theta).sin()


def curve_chart(k, b):
    """The unit circle with f = cos(k s) (s the arc length on the curve) and
    density proportional to 1 + b cos(theta)."""
    return Chart(embedding=lambda c: torch.stack([c[0].cos(), c[0].sin()]),
                 function=lambda c: (k * arc_length(c[0])).cos(),
                 log_density=lambda c: torch.log1p(b * c[0].cos()))


def curve_target(theta, k, b):
    """Closed form: Delta_g f = -k^2 f for f = cos(k s); p_g = p / speed."""
    speed = 1 + A * (2 * theta).cos()
    s = arc_length(theta)
    dlog_pg = (-b * theta.sin() / (1 + b * theta.cos())
               + 2 * A * (2 * theta).sin() / speed)
    return -k * k * (k * s).cos() + 2 * (dlog_pg / speed) * (-k * (k * s).sin())


@pytest.mark.parametrize('b', [0.0, 0.5])
def test_a_curve_with_closed_form_arc_length(b):
    theta = torch.rand(300, dtype=torch.float64) * 2 * math.pi
    target = induced_drift_diffusion(curve_chart(3, b), theta.unsqueeze(1),
                                     curve_map)
    assert torch.allclose(target, curve_target(theta, 3, b), rtol=1e-9, atol=1e-9)
    speed = pullback_metric(curve_chart(3, b), theta.unsqueeze(1),
                            curve_map).squeeze().sqrt()
    assert torch.allclose(speed, 1 + A * (2 * theta).cos())


@pytest.mark.parametrize('b', [0.0, 0.5])
def test_propagation_over_the_mapped_points_tends_to_the_induced_target(b):
    """Noise-free quantile sample of the circle pushed through the curve map:
    the error against the induced target is the O(t) bias alone; against the
    Euclidean target (even rescaled) it does not vanish."""
    theta = quantile_angles(2000, b)
    chart = curve_chart(2, b)
    coords = theta.unsqueeze(1)
    points = curve_map(torch.stack([theta.cos(), theta.sin()], 1))
    f = torch.func.vmap(chart.function)(coords)
    induced = induced_drift_diffusion(chart, coords, curve_map)
    euclidean = induced_drift_diffusion(chart, coords)
    scale = (induced * euclidean).sum() / euclidean.square().sum()
    ts = [0.001, 0.002, 0.004]
    errors = [relative_rms(propagation_generator(points, f, t), induced)
              for t in ts]
    assert errors[0] < 5e-3
    assert log_log_slope(ts, errors) == pytest.approx(1.0, abs=0.15)
    estimate = propagation_generator(points, f, ts[0])
    assert relative_rms(estimate, scale * euclidean, induced) > 0.5


def fd_target(chart, phi, c, step=1e-5):
    """Delta_g f + 2 <grad log p_g, grad f>_g at one point by central
    differences of autograd first derivatives (a second implementation)."""
    def jac(fn, x):
        return torch.autograd.functional.jacobian(fn, x)

    def metric(x, mapping):
        j = jac(mapping, x)
        return j.T @ j

    def mapped(x):
        return phi(chart.embedding(x))

    def flux(x):
        g = metric(x, mapped)
        return g.det().sqrt() * torch.linalg.inv(g) @ jac(chart.function, x)

    def log_pg(x):
        return (chart.log_density(x) + 0.5 * metric(x, chart.embedding).det().log()
                - 0.5 * metric(x, mapped).det().log())

    d = c.numel()
    divergence, grad_log = 0.0, torch.zeros(d, dtype=c.dtype)
    for i in range(d):
        e = torch.zeros(d, dtype=c.dtype)
        e[i] = step
        divergence += (flux(c + e)[i] - flux(c - e)[i]) / (2 * step)
        grad_log[i] = (log_pg(c + e) - log_pg(c - e)) / (2 * step)
    g = metric(c, mapped)
    df = torch.linalg.inv(g) @ jac(chart.function, c)
    return divergence / g.det().sqrt() + 2 * grad_log @ df


def test_a_random_mlp_on_the_sphere_matches_finite_differences():
    """A non-diagonal, position-dependent metric and a non-uniform density."""
    torch.manual_seed(0)
    phi = ResidualTanhMLP(3, 4, 8).double().requires_grad_(False)
    sample = sphere(6, 'non-uniform', seed=5)
    target = induced_drift_diffusion(sample.chart, sample.coords, phi)
    for c, value in zip(sample.coords, target, strict=True):
        assert float(value) == pytest.approx(
            float(fd_target(sample.chart, phi, c)), rel=1e-5, abs=1e-6)


def test_induced_target_clear_errors():
    sample = sphere(20, seed=0)
    with pytest.raises(ValueError, match='not an immersion'):
        induced_drift_diffusion(sample.chart, sample.coords,
                                lambda x: x[:1])  # rank-one J: J^T J singular
    with pytest.raises(ValueError, match=r"'coords' must be floating-point \[n, d\]"):
        induced_drift_diffusion(sample.chart, sample.coords[:, 0])
    with pytest.raises(ValueError, match="differ in shape"):
        relative_rms(torch.ones(3), torch.ones(4))
    assert relative_rms(torch.ones(3), torch.zeros(3), 2 * torch.ones(3)) == 0.5


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


def test_rank_collapse_on_mnist_point_sets(tmp_path, capsys):
    """``--data mnist``: sets of MNIST images (784 standardised pixels each)
    lifted to the blocks' width; the lift keeps their scale, so pure
    dot-product attention still collapses them and skips keep them apart."""
    import json

    from pyg_metric_attn.cli import main
    from pyg_metric_attn.experiments.rank_collapse import point_set_data
    root = shared_dataset('mnist')
    x_train, y_train, x_test, y_test = point_set_data('mnist', 60, 20, str(root))
    assert x_train.shape == (60, 784) and x_test.shape == (20, 784)
    assert y_train.shape == (60,) and int(y_train.max()) <= 9
    out = tmp_path / 'rank'
    assert main(['experiment', 'rank_collapse', '--data', 'mnist', '--root',
                 str(root), '--depth', '6', '--seeds', '1', '--sets', '2',
                 '--set-size', '30', '--out', str(out), '--no-progress']) == 0
    assert 'of mnist point sets' in capsys.readouterr().out
    results = json.loads((out / 'results.json').read_text())
    assert results['data'] == 'mnist'
    curves = {(c['metric'], c['block']): c['mean'] for c in results['curves']}
    assert curves['dot', 'attention'][-1] < 1e-3 * curves['dot', 'attention'][0]
    assert curves['dot', 'skip'][-1] > 0.1


def test_stretch_of_a_map_on_the_manifold():
    from pyg_metric_attn.experiments.heat_limit_learned import stretch
    sample = sphere(50, seed=1)
    assert torch.allclose(stretch(sample, lambda x: 2 * x),
                          torch.full((50, 2), 2.0, dtype=torch.float64))
    factors = stretch(sample, lambda x: x * torch.tensor([1.0, 1.0, 3.0],
                                                         dtype=torch.float64))
    # The equatorial direction keeps its length; the other one is stretched
    # by up to 3 (at the equator, where it points along z).
    assert torch.allclose(factors[:, 0], torch.ones(50, dtype=torch.float64))
    z = sample.points[:, 2]
    assert torch.allclose(factors[:, 1], (1 + 8 * (1 - z * z)).sqrt())


def test_heat_limit_learned_experiment_command(tmp_path, capsys):
    import json

    from pyg_metric_attn.cli import main
    from pyg_metric_attn.nn.pseudo_metric import tied_map
    from pyg_metric_attn.utils.io import load_verified
    out = tmp_path / 'learned'
    assert main(['experiment', 'heat_limit_learned', '--manifolds', 'circle',
                 '--sizes', '100', '200', '--times', '0.5', '1', '--seeds', '1',
                 '--steps', '30', '--keys', '60', '--queries', '20',
                 '--out', str(out), '--no-progress']) == 0
    assert '| circle | 200 |' in capsys.readouterr().out
    for name in ('results.json', 'summary.md', 'heat_limit_learned.png'):
        assert (out / name).stat().st_size > 0
    curve, = json.loads((out / 'results.json').read_text())['curves']
    assert len(curve['cells']) == 2 * 2
    q = curve['stretch_quantiles']
    assert 0 < q['min'] <= q['median'] <= q['max']
    # The training lowered the regression loss, and the saved map is that map.
    assert curve['training']['test_mse']['learned'] < \
        curve['training']['test_mse']['identity']
    saved = load_verified(out / 'phi_circle.pt')
    phi = tied_map(**saved['config'])
    phi.load_state_dict(saved['state_dict'])
    assert phi(torch.zeros(1, 2)).shape == (1, 2)


def test_rank_collapse_trained_experiment_command(tmp_path, capsys):
    """Tiny grid end to end: the distances of every run through its depth,
    before and after training, and the accuracy: the stacks with skip
    connections learn the moons (chance 50% of 40 test points; measured
    77.5-85%), pure attention stacks may collapse (dot at depth 2 stays at
    55%)."""
    import json

    from pyg_metric_attn.cli import main
    out = tmp_path / 'trained'
    assert main(['experiment', 'rank_collapse_trained', '--depths', '1', '2',
                 '--metrics', 'dot,metric', '--blocks', 'attention,skip',
                 '--seeds', '1', '--epochs', '3', '--lr', '2e-2',
                 '--set-size', '20', '--num-train', '40', '--num-test', '40',
                 '--out', str(out), '--no-progress']) == 0
    assert '| metric | skip |' in capsys.readouterr().out
    assert (out / 'rank_collapse_trained.png').stat().st_size > 0
    results = json.loads((out / 'results.json').read_text())
    assert len(results['runs']) == 2 * 2 * 2 and len(results['curves']) == 8
    for run in results['runs']:
        assert len(run['initial']) == len(run['trained']) == run['depth'] + 1
        assert all(0 <= r <= 1 for r in run['initial'] + run['trained'])
        assert run['trained'] != run['initial']  # the weights moved
        assert 0 <= run['test_acc'] <= 1
        if run['block'] == 'skip':
            assert run['test_acc'] >= 0.7, run
    assert main(['experiment', 'rank_collapse_trained', '--blocks', 'conv',
                 '--out', str(out)]) != 0
    assert 'Unknown block kind' in capsys.readouterr().err


def test_rank_collapse_trained_on_mnist_point_sets(tmp_path, capsys):
    """``--data mnist``: the stacks learn the ten digits from images as
    points, and the parts of an MNIST grid do not merge with a moons grid."""
    import json

    from pyg_metric_attn.cli import main
    root = str(shared_dataset('mnist'))
    tiny = ['--depths', '1', '--metrics', 'metric', '--blocks', 'skip',
            '--seeds', '1', '--epochs', '2', '--set-size', '20',
            '--num-train', '40', '--num-test', '40', '--no-progress']
    out = tmp_path / 'mnist'
    assert main(['experiment', 'rank_collapse_trained', '--data', 'mnist',
                 '--root', root, *tiny, '--out', str(out)]) == 0
    assert 'held-out mnist point sets' in capsys.readouterr().out
    results = json.loads((out / 'results.json').read_text())
    assert results['data'] == 'mnist'
    run, = results['runs']
    # Ten digits (chance 10%): measured 40% of the 40 test sets.
    assert len(run['trained']) == 2 and 0.25 <= run['test_acc'] <= 1
    assert main(['experiment', 'rank_collapse_trained', *tiny,
                 '--out', str(tmp_path / 'moons')]) == 0
    capsys.readouterr()
    assert main(['experiment', 'rank_collapse_trained', '--merge', str(out),
                 str(tmp_path / 'moons'), '--out', str(tmp_path / 'bad')]) != 0
    assert 'different data' in capsys.readouterr().err


def test_rank_collapse_trained_records_a_diverged_training(tmp_path, capsys):
    """A stack whose training loss becomes non-finite (here dot-product skip
    blocks at a huge learning rate) is a result of the grid, not the end of
    it: recorded with its epoch, left out of the trained means, counted in
    the table."""
    import json

    from pyg_metric_attn.cli import main
    out = tmp_path / 'diverged'
    assert main(['experiment', 'rank_collapse_trained', '--depths', '4',
                 '--metrics', 'dot,metric', '--blocks', 'skip', '--seeds', '1',
                 '--epochs', '3', '--set-size', '20', '--num-train', '40',
                 '--num-test', '40', '--lr', '1e6', '--channels', '8',
                 '--out', str(out), '--no-progress']) == 0
    results = json.loads((out / 'results.json').read_text())
    runs = {run['metric']: run for run in results['runs']}
    assert runs['dot']['diverged_at_epoch'] == 2
    assert runs['dot']['trained'] is None and runs['dot']['test_acc'] is None
    assert runs['metric']['diverged_at_epoch'] is None
    curves = {curve['metric']: curve for curve in results['curves']}
    assert curves['dot']['diverged'] == 1 and curves['dot']['last_trained'] is None
    assert curves['metric']['diverged'] == 0
    assert 0 <= curves['metric']['last_trained'] <= 1
    assert '| dot | skip | diverged (' in capsys.readouterr().out
    assert (out / 'rank_collapse_trained.png').stat().st_size > 0


def test_rank_collapse_trained_merges_parts_run_apart(tmp_path, capsys):
    """One process per metric and per seed range, merged, gives the table of
    one process over the whole grid; overlapping or mismatched parts are
    refused."""
    import json

    from pyg_metric_attn.cli import main
    tiny = ['--depths', '1', '2', '--blocks', 'skip', '--epochs', '2',
            '--set-size', '20', '--num-train', '40', '--num-test', '40',
            '--no-progress']

    def run(name, *args):
        assert main(['experiment', 'rank_collapse_trained', *tiny, *args,
                     '--out', str(tmp_path / name)]) == 0
        return str(tmp_path / name)

    whole = run('whole', '--metrics', 'dot,metric', '--seeds', '2')
    parts = [run('dot', '--metrics', 'dot', '--seeds', '2'),
             run('metric0', '--metrics', 'metric', '--seeds', '1'),
             run('metric1', '--metrics', 'metric', '--seeds', '1',
                 '--first-seed', '1')]
    assert main(['experiment', 'rank_collapse_trained', '--merge', *parts,
                 '--out', str(tmp_path / 'merged')]) == 0
    expected = json.loads((tmp_path / 'whole' / 'results.json').read_text())
    merged = json.loads((tmp_path / 'merged' / 'results.json').read_text())
    assert merged['curves'] == expected['curves']
    assert merged['seeds'] == 2 and merged['metrics'] == ['dot', 'metric']
    assert (tmp_path / 'merged' / 'summary.md').read_text() == \
        (tmp_path / 'whole' / 'summary.md').read_text()
    capsys.readouterr()
    for bad, message in (([whole, parts[0]], 'more than one part'),
                         ([parts[0], parts[1]], 'different seeds'),
                         ([whole, run('other', '--metrics', 'l2', '--seeds',
                                      '2', '--epochs', '3')], 'different epochs')):
        assert main(['experiment', 'rank_collapse_trained', '--merge', *bad,
                     '--out', str(tmp_path / 'bad')]) != 0
        assert message in capsys.readouterr().err


def test_stack_classifier_residuals_follow_its_forward():
    from pyg_metric_attn.experiments.rank_collapse_trained import StackClassifier
    from pyg_metric_attn.theory import rank_one_residual
    torch.manual_seed(0)
    model = StackClassifier(2, 8, 2, 'skip+mlp', 'metric', depth=3)
    x, batch = torch.randn(30, 2), torch.arange(3).repeat_interleave(10)
    residuals = model.residuals(x, batch)
    assert residuals.shape == (4, 3)
    h = model.lift(x)
    for block in model.blocks:
        h = block(h, batch)
    assert torch.allclose(residuals[-1], rank_one_residual(h, batch))
    assert model(x, batch).shape == (30, 2)
