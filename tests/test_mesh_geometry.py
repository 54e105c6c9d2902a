"""Mesh operators against analytic facts, degenerate input, the cache."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import trimesh
from conftest import shared_dataset

from pyg_metric_attn.datasets.mesh_io import read_mesh
from pyg_metric_attn.geometry import (
    MeshError,
    OperatorCache,
    eigendecomposition,
    face_areas,
    gradient_operators,
    heat_kernel_signature,
    laplacian,
    mesh_edges,
    mesh_operators,
    normalize_positions,
    operator_cache_key,
    tangent_frames,
    vertex_fan_counts,
)
from pyg_metric_attn.transforms import random_rotation


@pytest.fixture(scope='module')
def human():
    pos, face = read_mesh(shared_dataset('human_seg') / 'test' / 'shrec__1.obj')
    return normalize_positions(pos), face


def sphere(subdivisions: int = 3):
    mesh = trimesh.creation.icosphere(subdivisions)
    return np.asarray(mesh.vertices, float), np.asarray(mesh.faces, np.int64)


def pinched_tetrahedra():
    """Two closed tetrahedra sharing vertex 0 (a non-manifold pinch)."""
    pos = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, 0, 1],
                    [-1, 0, 0], [0, -1, 0], [0, 0, -1]], float)
    tet = np.array([[0, 2, 1], [0, 1, 3], [0, 3, 2], [1, 2, 3]])
    other = np.where(tet == 0, 0, tet + 3)
    return pos, np.concatenate([tet, other])


@pytest.mark.parametrize('method', ['cotan', 'robust'])
def test_laplacian_rows_sum_to_zero_and_mass_is_area(human, method):
    pos, face = human
    L, mass, used = laplacian(pos, face, method)
    assert used == method
    assert abs(L - L.T).max() < 1e-12
    assert np.abs(np.asarray(L.sum(axis=1))).max() < 1e-10
    assert (L.diagonal() > 0).all()
    assert mass.sum() == pytest.approx(face_areas(pos, face).sum(), rel=1e-3)
    assert (mass > 0).all()


def test_sphere_eigenvalues_are_l_l_plus_1():
    pos, face = sphere(3)  # unit sphere, 642 vertices
    L, mass, _ = laplacian(pos, face)
    evals, evecs = eigendecomposition(L, mass, k=25)
    expected = np.concatenate([np.full(2 * l + 1, l * (l + 1.0))
                               for l in range(5)])  # 0, 2 x3, 6 x5, 12 x7, 20 x9
    assert evals[0] == pytest.approx(0.0, abs=1e-5)
    np.testing.assert_allclose(evals[1:], expected[1:], rtol=0.03)
    # M-orthonormal eigenvectors.
    gram = evecs.T @ (mass[:, None] * evecs)
    np.testing.assert_allclose(gram, np.eye(25), atol=1e-8)


def test_small_mesh_is_solved_densely():
    pos, face = sphere(0)  # 12 vertices < k
    L, mass, _ = laplacian(pos, face)
    evals, evecs = eigendecomposition(L, mass, k=128)
    assert evals.shape == (12,) and evecs.shape == (12, 12)
    np.testing.assert_allclose(evecs.T @ (mass[:, None] * evecs), np.eye(12),
                               atol=1e-8)


def test_hks_invariant_to_rotation_and_vertex_order(human):
    pos, face = human
    reference = mesh_operators(pos, face, k=64)['hks'].numpy()
    rotated = pos @ random_rotation().numpy().T
    np.testing.assert_allclose(mesh_operators(rotated, face, k=64)['hks'].numpy(),
                               reference, rtol=1e-4, atol=1e-6)
    perm = np.random.default_rng(0).permutation(len(pos))
    inverse = np.argsort(perm)  # new vertex i is old vertex perm[i]
    hks = mesh_operators(pos[perm], inverse[face], k=64)['hks'].numpy()
    np.testing.assert_allclose(hks, reference[perm], rtol=1e-4, atol=1e-6)
    # HKS at t -> 0 is large, it decays with t and is positive.
    assert (reference > 0).all() and (np.diff(reference, axis=1) < 0).all()


def test_heat_kernel_signature_formula():
    rng = np.random.default_rng(0)
    evals, evecs = np.sort(rng.uniform(0, 50, 6)), rng.normal(size=(5, 6))
    times = np.array([0.01, 0.1, 1.0])
    expected = [[sum(np.exp(-evals[k] * t) * evecs[v, k] ** 2 for k in range(6))
                 for t in times] for v in range(5)]
    np.testing.assert_allclose(heat_kernel_signature(evals, evecs, times), expected)
    assert heat_kernel_signature(evals, evecs, 16).shape == (5, 16)


def test_rescaled_hks_is_the_hks_of_a_scaled_mesh():
    import torch

    from pyg_metric_attn.transforms import rescaled_heat_kernel_signatures

    pos, face = sphere(2)
    pos = pos * np.array([1.0, 0.7, 0.5])  # an ellipsoid: distinct eigenvalues
    ops = mesh_operators(pos, face, k=24)
    evals = torch.stack([ops['evals'], ops['evals']]).double()
    evecs = torch.cat([ops['evecs'], ops['evecs']]).double()
    batch = torch.arange(2).repeat_interleave(len(pos))
    size = 1.5  # scaling by a: evals / a^2, mass-normalised evecs^2 / a^2
    rescaled = rescaled_heat_kernel_signatures(
        evals, evecs, batch, torch.tensor([1.0, size ** -2], dtype=torch.float64))
    np.testing.assert_allclose(rescaled[:len(pos)].numpy(), ops['hks'].numpy(),
                               rtol=1e-5)
    enlarged = mesh_operators(pos * size, face, k=24)['hks'].numpy()
    np.testing.assert_allclose(rescaled[len(pos):].numpy() / size ** 2,
                               enlarged, rtol=1e-4)
    with pytest.raises(ValueError, match='one positive factor per mesh'):
        rescaled_heat_kernel_signatures(evals, evecs, batch, torch.ones(3))
    with pytest.raises(ValueError, match='one positive factor per mesh'):
        rescaled_heat_kernel_signatures(evals, evecs, batch, -torch.ones(2))
    with pytest.raises(ValueError, match=r"'evecs' \[V, K\]"):
        rescaled_heat_kernel_signatures(evals, evecs[:, :5], batch, torch.ones(2))


def test_gradient_of_linear_function_is_exact():
    xs, ys = np.meshgrid(np.linspace(0, 1, 8), np.linspace(0, 1, 6))
    pos = np.stack([xs.ravel(), ys.ravel(), np.zeros(xs.size)], axis=1)
    index = np.arange(xs.size).reshape(xs.shape)
    a, b = index[:-1, :-1].ravel(), index[:-1, 1:].ravel()
    c, d = index[1:, :-1].ravel(), index[1:, 1:].ravel()
    face = np.concatenate([np.stack([a, b, d], 1), np.stack([a, d, c], 1)])
    frames = tangent_frames(pos, face)
    grad_x, grad_y = gradient_operators(pos, face, frames)
    f = 2 * pos[:, 0] - 3 * pos[:, 1] + 0.5
    gradient = ((grad_x @ f)[:, None] * frames[:, 0]
                + (grad_y @ f)[:, None] * frames[:, 1])
    np.testing.assert_allclose(gradient, np.tile([2.0, -3.0, 0.0], (len(pos), 1)),
                               atol=1e-6)
    # Frames are orthonormal with the normal last.
    np.testing.assert_allclose(np.einsum('vij,vkj->vik', frames, frames),
                               np.broadcast_to(np.eye(3), frames.shape), atol=1e-12)


def test_mesh_edges_follow_meshcnn_order(human):
    _, face = human
    edges, side_ids = mesh_edges(face)
    reference, ids = [], {}
    for f in face:  # MeshCNN's loop
        for i in range(3):
            edge = tuple(sorted((int(f[i]), int(f[(i + 1) % 3]))))
            if edge not in ids:
                ids[edge] = len(reference)
                reference.append(edge)
    assert edges.tolist() == [list(e) for e in reference]
    assert len(edges) == 2250
    assert side_ids.tolist() == [[ids[tuple(sorted((int(f[i]), int(f[(i + 1) % 3]))))]
                                  for i in range(3)] for f in face]


def test_auto_laplacian_switches_to_robust_on_non_manifold_input():
    pos, face = pinched_tetrahedra()
    assert vertex_fan_counts(face, len(pos)).tolist() == [2, 1, 1, 1, 1, 1, 1]
    L, mass, method = laplacian(pos, face)
    assert method == 'robust'
    assert np.isfinite(L.data).all() and (mass > 0).all()
    # A fin: three triangles on one edge.
    pos = np.array([[0, 0, 0], [1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1.]])
    face = np.array([[0, 1, 2], [1, 0, 3], [0, 1, 4]])
    assert laplacian(pos, face)[2] == 'robust'
    # SCAPE meshes of the benchmark have a pinch vertex.
    pos, face = read_mesh(shared_dataset('human_seg') / 'train' / 'scape__mesh000.obj')
    assert vertex_fan_counts(face, len(pos)).max() == 2
    assert laplacian(pos, face)[2] == 'robust'


def test_degenerate_meshes_get_clear_errors_or_robust_results():
    pos, face = sphere(1)
    bad = pos.copy()
    bad[5, 1] = np.nan
    with pytest.raises(MeshError, match=r"ball\.obj: 1 vertices have NaN.*vertex 5"):
        mesh_operators(bad, face, k=8, name='ball.obj')
    with pytest.raises(MeshError, match='belong to no face'):
        mesh_operators(np.concatenate([pos, [[3.0, 3, 3]]]), face, k=8)
    with pytest.raises(MeshError, match='face indices'):
        mesh_operators(pos, face + 1, k=8)
    with pytest.raises(MeshError, match='triangles'):
        mesh_operators(pos, face[:, :2], k=8)
    with pytest.raises(MeshError, match='mass'):
        eigendecomposition(laplacian(pos, face)[0], np.zeros(len(pos)), k=4)
    # A zero-area face (a collapsed triangle) is handled by the robust Laplacian.
    degenerate = np.concatenate([face, [[0, 0, 1]]])
    operators = mesh_operators(pos, degenerate, k=8)
    assert operators['laplacian_method'] == 'robust'
    assert np.isfinite(operators['hks'].numpy()).all()


def test_operator_cache_hit_corruption_and_mismatch(tmp_path, monkeypatch):
    pos, face = sphere(1)  # k = 9: whole eigenspaces (1 + 3 + 5)
    cache = OperatorCache(tmp_path)
    first = mesh_operators(pos, face, k=9, cache=cache)
    key = operator_cache_key(pos, face, dict(k=9, hks_count=16, gradients=False,
                                             laplacian='auto'))
    path = cache.path(key)
    assert path.exists()

    import pyg_metric_attn.geometry.operators as operators_module

    def fail(*args, **kwargs):
        raise AssertionError('recomputed although cached')
    with monkeypatch.context() as m:
        m.setattr(operators_module, 'eigendecomposition', fail)
        hit = mesh_operators(pos, face, k=9, cache=cache)
    assert np.array_equal(hit['hks'].numpy(), first['hks'].numpy())

    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match='checksum'):
        again = mesh_operators(pos, face, k=9, cache=cache)
    np.testing.assert_allclose(again['hks'].numpy(), first['hks'].numpy())
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # rewritten: now a clean hit
        mesh_operators(pos, face, k=9, cache=cache)

    # An entry filed under the wrong key (e.g. copied by hand) is not used.
    other = mesh_operators(pos * 2, face, k=9, cache=cache)
    other_key = operator_cache_key(pos * 2, face, dict(k=9, hks_count=16,
                                                       gradients=False,
                                                       laplacian='auto'))
    path.write_bytes(cache.path(other_key).read_bytes())
    with pytest.warns(UserWarning, match='another mesh'):
        again = mesh_operators(pos, face, k=9, cache=cache)
    np.testing.assert_allclose(again['hks'].numpy(), first['hks'].numpy())
    assert not np.allclose(other['evals'].numpy(), first['evals'].numpy())
    # Settings are part of the key.
    assert operator_cache_key(pos, face, {'k': 8}) != operator_cache_key(
        pos, face, {'k': 16})


def test_mesh_transforms(tmp_path):
    import torch
    from torch_geometric.data import Data

    from pyg_metric_attn.transforms import MeshOperators, NormalizeMesh

    pos, face = sphere(1)
    data = Data(pos=torch.tensor(pos * 3 + 1, dtype=torch.float),
                face=torch.from_numpy(face.T.copy()), name='ball')
    data = NormalizeMesh()(data)
    radius = data.pos.norm(dim=1)
    assert float(radius.max()) == pytest.approx(1.0, abs=1e-6)
    assert data.pos.mean(0).abs().max() < 1e-6
    transform = MeshOperators(k=9, gradients=True, cache_dir=tmp_path,
                              keep=('hks', 'evals', 'evecs', 'grad_x', 'frames'))
    out = transform(data)
    assert out.hks.shape == (42, 16) and out.evals.shape == (1, 9)
    assert out.evecs.shape == (42, 9) and out.grad_x.is_sparse
    assert out.frames.shape == (42, 3, 3)
    assert len(list(tmp_path.rglob('*.pt'))) == 1
    with pytest.raises(KeyError, match='Unknown operator'):
        MeshOperators(k=9, keep=('nope',))(data)
