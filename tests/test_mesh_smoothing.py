"""Taubin smoothing of mesh positions, and MeshPreprocessing's operators of
the smoothed surface."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import trimesh
from torch_geometric.data import Data

from pyg_metric_attn.geometry import (
    normalize_positions,
    taubin_smoothing,
    umbrella_operator,
)
from pyg_metric_attn.transforms import MeshPreprocessing

pytestmark = pytest.mark.usefixtures('one_thread')


def sphere() -> tuple[np.ndarray, np.ndarray]:
    mesh = trimesh.creation.icosphere(3)  # 642 vertices on the unit sphere
    return np.asarray(mesh.vertices), np.asarray(mesh.faces)


def radial_error(pos: np.ndarray) -> float:
    """RMS distance of the vertices from the unit sphere."""
    return float(np.sqrt(np.mean((np.linalg.norm(pos, axis=1) - 1) ** 2)))


def test_one_round_is_a_shrinking_then_an_inflating_umbrella_step():
    # A square split into two triangles: degrees 3, 2, 3, 2.
    pos = np.array([[0., 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0]])
    face = np.array([[0, 1, 2], [0, 2, 3]])
    W = umbrella_operator(face, 4).toarray()
    np.testing.assert_allclose(W.sum(axis=1), 1.0)
    np.testing.assert_allclose(W[1], [0.5, 0, 0.5, 0])
    lam, mu = 0.5, 1 / (0.1 - 2)
    expected = pos + lam * (W @ pos - pos)
    expected = expected + mu * (W @ expected - expected)
    np.testing.assert_allclose(taubin_smoothing(pos, face, 1), expected)
    np.testing.assert_array_equal(taubin_smoothing(pos, face, 0), pos)


def test_a_vertex_on_no_edge_keeps_its_position():
    # Vertex 4 is in one face that has no edge (all three corners it).
    pos = np.array([[0., 0, 0], [1, 0, 0], [1, 1, 0], [0, 1, 0], [2, 2, 2]])
    face = np.array([[0, 1, 2], [0, 2, 3], [4, 4, 4]])
    np.testing.assert_array_equal(umbrella_operator(face, 5).toarray()[4],
                                  [0, 0, 0, 0, 1])
    np.testing.assert_allclose(taubin_smoothing(pos, face, 3)[4], [2, 2, 2])


def test_removes_vertex_noise_without_shrinking_the_surface():
    pos, face = sphere()
    noisy = pos + 0.02 * np.random.default_rng(0).standard_normal(pos.shape)
    smoothed = taubin_smoothing(noisy, face, 2)
    assert radial_error(smoothed) < 0.7 * radial_error(noisy)
    # The clean sphere keeps its size; plain umbrella smoothing (no
    # inflating step) shrinks it.
    radius = np.linalg.norm(taubin_smoothing(pos, face, 2), axis=1).mean()
    assert radius == pytest.approx(1.0, abs=2e-3)
    W = umbrella_operator(face, len(pos))
    shrunk = pos
    for _ in range(2):
        shrunk = shrunk + 0.5 * (W @ shrunk - shrunk)
    assert np.linalg.norm(shrunk, axis=1).mean() < 0.99


def test_bad_settings_are_named():
    pos, face = sphere()
    with pytest.raises(ValueError, match="'steps' must be a non-negative"):
        taubin_smoothing(pos, face, -1)
    with pytest.raises(ValueError, match="'steps' must be a non-negative"):
        taubin_smoothing(pos, face, 1.5)
    with pytest.raises(ValueError, match="'lam' must lie in"):
        taubin_smoothing(pos, face, 1, lam=1.0)
    with pytest.raises(ValueError, match="'pass_band' must lie in"):
        taubin_smoothing(pos, face, 1, pass_band=2.0)
    # Settings that amplify the highest surface frequencies, or the pass
    # band, instead of keeping them.
    with pytest.raises(ValueError, match='amplif'):
        taubin_smoothing(pos, face, 1, lam=0.9, pass_band=0.1)
    with pytest.raises(ValueError, match='amplif'):
        taubin_smoothing(pos, face, 1, lam=0.5, pass_band=1.9)
    with pytest.raises(ValueError, match="'smoothing' must be a non-negative"):
        MeshPreprocessing(smoothing=-2)


@pytest.mark.parametrize('lam,pass_band,match', [
    (0.0, 0.1, r"^'lam' must lie in \(0, 1\), got 0\.0$"),
    (0.5, 0.0, r"^'pass_band' must lie in \(0, 1/lam = 2\), got 0\.0$"),
    # A round would multiply the top frequency by -1.002 (just past -1):
    (0.7, 0.1, r"^lam=0\.7, pass_band=0\.1 \(mu=-0\.753\) would amplify the "
     r"surface instead of smoothing it: a round multiplies the highest "
     r"frequency by -1 and the pass band by up to 1 \(allowed: above -1, "
     r"at most 1\.1\)$"),
    # ... or the pass band by 1.125:
    (0.5, 1.0, r"^lam=0\.5, pass_band=1\.0 \(mu=-1\) would amplify the "
     r"surface instead of smoothing it: a round multiplies the highest "
     r"frequency by 0 and the pass band by up to 1\.12 \(allowed: above -1, "
     r"at most 1\.1\)$"),
])
def test_bad_settings_are_refused_with_their_gains(lam, pass_band, match):
    pos, face = sphere()
    with pytest.raises(ValueError, match=match):
        taubin_smoothing(pos, face, 1, lam=lam, pass_band=pass_band)


def test_positions_come_back_as_float64():
    pos, face = sphere()
    whole = np.round(pos * 4).astype(np.int64)
    for steps in (0, 1):
        assert taubin_smoothing(whole, face, steps).dtype == np.float64
    np.testing.assert_array_equal(taubin_smoothing(whole, face, 0), whole)


def test_preprocessing_computes_the_operators_of_the_smoothed_surface():
    pos, face = sphere()
    pos = pos * np.random.default_rng(1).uniform(0.9, 1.1, (len(pos), 1))

    def data():
        return Data(pos=torch.from_numpy(pos),
                    face=torch.from_numpy(face.T.copy()), name='bumpy')

    settings = dict(k=16, hks_count=4, spectral_basis=8, gradients=True)
    smoothed = MeshPreprocessing(**settings, smoothing=2)(data())
    plain = MeshPreprocessing(**settings)
    # Its operators are those of the normalised positions smoothed; pos is
    # kept as the plain preprocessing gives it.
    reference = plain.operators(
        taubin_smoothing(plain(data()).pos.double().numpy(), face, 2), face)
    for key, value in reference.items():
        torch.testing.assert_close(smoothed[key], value, msg=key)
    torch.testing.assert_close(smoothed.pos, plain(data()).pos)
    assert not torch.allclose(smoothed.hks, plain(data()).hks, rtol=1e-3)
    # Its own folder and cache keys; those of unsmoothed operators unchanged.
    assert MeshPreprocessing(**settings, smoothing=2).tag.endswith('_grad_taubin2')
    assert plain.tag == 'v2_k16_hks4_auto_basis8_grad'
    assert 'smoothing' not in plain.settings
    assert 'smoothing=2' in repr(MeshPreprocessing(smoothing=2))
    # A numpy integer is the same setting (and the same cache keys).
    numpy_two = MeshPreprocessing(**settings, smoothing=np.int64(2))
    assert numpy_two.settings == MeshPreprocessing(**settings, smoothing=2).settings
    assert type(numpy_two.settings['smoothing']) is int


def test_smoothing_damps_the_change_of_the_hks_under_vertex_noise():
    pos, face = sphere()
    pos = normalize_positions(
        pos * np.random.default_rng(2).uniform(0.9, 1.1, (len(pos), 1)))
    noisy = pos + 0.01 * np.random.default_rng(3).standard_normal(pos.shape)
    change = {}
    for steps in (0, 2):
        preprocessing = MeshPreprocessing(k=32, hks_count=8, smoothing=steps)
        a, b = (preprocessing.operators(p, face)['hks'] for p in (pos, noisy))
        change[steps] = float((b - a).norm() / a.norm())
    assert change[2] < 0.6 * change[0], change
