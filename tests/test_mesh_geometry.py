"""Mesh operators against analytic facts, degenerate input."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import trimesh
from conftest import shared_dataset
from torch_geometric.data import Data

from pyg_metric_attn.datasets.mesh_io import read_mesh
from pyg_metric_attn.geometry import (
    MeshError,
    check_mesh,
    cotan_laplacian,
    eigendecomposition,
    face_areas,
    face_normals,
    gradient_coefficients,
    gradient_operators,
    heat_kernel_signature,
    hks_times,
    laplacian,
    mesh_edges,
    normalize_positions,
    operator_cache_key,
    random_rotation,
    renumber_mesh,
    spectral,
    tangent_frames,
    tufted_laplacian,
    vertex_fan_counts,
    vertex_normals,
    vertex_to_face_averaging,
)
from pyg_metric_attn.transforms import RandomRotation


@pytest.fixture(scope='module')
def human():
    pos, face = read_mesh(shared_dataset('human_seg') / 'test' / 'shrec__1.obj')
    return normalize_positions(pos), face


def sphere(subdivisions: int = 3):
    mesh = trimesh.creation.icosphere(subdivisions)
    return np.asarray(mesh.vertices, float), np.asarray(mesh.faces, np.int64)


def spectrum(pos: np.ndarray, face: np.ndarray, k: int
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(evals, evecs, 16 HKS)`` of a mesh as given (not normalised)."""
    evals, evecs = eigendecomposition(*laplacian(pos, face)[:2], k=k)
    return evals, evecs, heat_kernel_signature(evals, evecs, 16)


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
    reference = spectrum(pos, face, 64)[2]
    rotated = pos @ random_rotation(torch.Generator().manual_seed(0)).numpy().T
    np.testing.assert_allclose(spectrum(rotated, face, 64)[2], reference,
                               rtol=1e-4, atol=1e-6)
    perm = np.random.default_rng(0).permutation(len(pos))
    inverse = np.argsort(perm)  # new vertex i is old vertex perm[i]
    hks = spectrum(pos[perm], inverse[face], 64)[2]
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


def test_gradient_coefficients_hold_both_operators():
    pos, face = sphere(1)
    grad_x, grad_y = gradient_operators(pos, face)
    index, weight = gradient_coefficients(grad_x, grad_y)
    # Sorted by row, then column, each nonzero once.
    flat = index[0] * len(pos) + index[1]
    assert (np.diff(flat) > 0).all()
    for axis, operator in enumerate((grad_x, grad_y)):
        dense = np.zeros((len(pos), len(pos)))
        dense[index[0], index[1]] = weight[:, axis]
        np.testing.assert_array_equal(dense, operator.toarray())
    # Nonzeros only on the diagonal and the edges (an exact zero, e.g. a
    # diagonal of this symmetric mesh, may be left out).
    edges = {tuple(edge) for edge in mesh_edges(face)[0].tolist()}
    assert all(i == j or (min(i, j), max(i, j)) in edges for i, j in index.T.tolist())
    assert index.shape[1] >= 2 * len(edges)


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
        check_mesh(bad, face, name='ball.obj')
    with pytest.raises(MeshError, match='belong to no face'):
        check_mesh(np.concatenate([pos, [[3.0, 3, 3]]]), face)
    with pytest.raises(MeshError, match='face indices'):
        check_mesh(pos, face + 1)
    with pytest.raises(MeshError, match='triangles'):
        check_mesh(pos, face[:, :2])
    with pytest.raises(MeshError, match='mass'):
        eigendecomposition(laplacian(pos, face)[0], np.zeros(len(pos)), k=4)
    # A zero-area face (a collapsed triangle) is handled by the robust Laplacian.
    degenerate = np.concatenate([face, [[0, 0, 1]]])
    L, mass, method = laplacian(pos, degenerate)
    assert method == 'robust'
    evals, evecs = eigendecomposition(L, mass, k=8)
    assert np.isfinite(heat_kernel_signature(evals, evecs, 16)).all()


def test_random_rotation_is_a_rotation_and_the_transform_applies_it():
    for axis in (None, 0, 1, 2):
        rotation = random_rotation(torch.Generator().manual_seed(3), axis=axis)
        np.testing.assert_allclose((rotation @ rotation.T).numpy(), np.eye(3),
                                   atol=1e-12)
        assert torch.det(rotation).item() == pytest.approx(1.0)
        if axis is not None:  # the axis stays where it is
            assert rotation[axis, axis].item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="'axis' must be 0, 1 or 2"):
        random_rotation(axis=3)
    pos = torch.randn(5, 3, dtype=torch.float64)
    rotated = RandomRotation(torch.Generator().manual_seed(7))(Data(pos=pos.clone()))
    expected = pos @ random_rotation(torch.Generator().manual_seed(7)).T
    torch.testing.assert_close(rotated.pos, expected)


def test_vertex_to_face_averaging_gives_each_face_its_vertex_mean():
    pos, face = sphere(1)
    values = np.random.default_rng(0).normal(size=(len(pos), 4))
    averaging = vertex_to_face_averaging(face, len(pos))
    assert averaging.shape == (len(face), len(pos))
    np.testing.assert_allclose(averaging @ values, values[face].mean(1),
                               rtol=1e-12, atol=1e-12)
    # A vertex's column holds 1/3 per face around it.
    np.testing.assert_allclose(np.asarray(averaging.sum(0)).ravel(),
                               np.bincount(face.ravel(), minlength=len(pos)) / 3)
    # A vertex on no face (here the last) keeps its empty column.
    extra = vertex_to_face_averaging(face, len(pos) + 1)
    assert extra.shape == (len(face), len(pos) + 1)
    np.testing.assert_allclose(extra @ np.vstack([values, np.ones((1, 4))]),
                               values[face].mean(1), rtol=1e-12, atol=1e-12)


def test_random_rotation_transform_rotates_the_positions_uniformly():
    """``RandomRotation`` maps ``data.pos`` by a proper rotation (distances
    and handedness kept, nothing else touched), drawn from its generator
    and uniform on SO(3): 2000 draws are all proper, and a rotated unit
    vector and the trace average 0 (the Haar measure's means; variances
    1/3 and 1) within 4 standard errors."""
    pos = torch.from_numpy(sphere(1)[0]).float()
    data = Data(pos=pos.clone(), y=torch.arange(len(pos)))
    rotated = RandomRotation(torch.Generator().manual_seed(0))(data.clone())
    assert rotated.pos.dtype == torch.float32
    assert torch.equal(rotated.y, data.y)
    rotation = torch.linalg.lstsq(pos.double(), rotated.pos.double()).solution.T
    torch.testing.assert_close(rotation @ rotation.T,
                               torch.eye(3, dtype=torch.float64), atol=1e-6,
                               rtol=0)
    assert abs(float(torch.det(rotation)) - 1) < 1e-6
    assert not torch.allclose(rotation, torch.eye(3, dtype=torch.float64),
                              atol=0.1)
    again = RandomRotation(torch.Generator().manual_seed(0))(data.clone())
    assert torch.equal(again.pos, rotated.pos)
    transform = RandomRotation(torch.Generator().manual_seed(1))
    axes = Data(pos=torch.eye(3, dtype=torch.float64))
    draws = torch.stack([transform(axes.clone()).pos for _ in range(2000)])
    torch.testing.assert_close(torch.det(draws), torch.ones(2000,
                                                            dtype=torch.float64))
    unit = draws[:, 2]  # the rotated z axis
    assert float(unit.mean(0).abs().max()) < 4 * (1 / 3 / 2000) ** 0.5
    traces = draws.diagonal(dim1=1, dim2=2).sum(-1)
    assert abs(float(traces.mean())) < 4 * (1 / 2000) ** 0.5


def test_operator_cache_key_hashes_values_shapes_and_settings():
    """The same values in other dtypes or settings in another order share a
    key; the same bytes split differently between the arrays do not."""
    pos, face = sphere(0)
    pos = np.round(pos * 8) / 8  # exact in float32
    key = operator_cache_key(pos, face, {'k': 8, 'smoothing': 1})
    assert operator_cache_key(pos.astype(np.float32), face.astype(np.int32),
                              {'smoothing': 1, 'k': 8}) == key
    assert operator_cache_key(pos, face, {'k': 9, 'smoothing': 1}) != key
    moved_vertex = pos.copy()
    moved_vertex[3, 0] += 1 / 8
    assert operator_cache_key(moved_vertex, face, {'k': 8, 'smoothing': 1}) != key
    flipped = face.copy()
    flipped[0] = flipped[0, ::-1]  # the same vertices, the other orientation
    assert operator_cache_key(pos, flipped, {'k': 8, 'smoothing': 1}) != key
    head, tail = pos[:2], face[:1]
    moved = np.concatenate([head, tail.view(np.float64)])  # the same bytes
    assert operator_cache_key(head, tail, {}) != operator_cache_key(
        moved, np.zeros((0, 3), np.int64), {})


def test_vertex_normals_of_a_vertex_on_no_face_point_up():
    pos = np.array([[0, 0, 0], [1, 0, 0], [0, 0, 1], [5, 5, 5.0]])
    normals = vertex_normals(pos, np.array([[0, 1, 2]]))
    np.testing.assert_array_equal(normals[:3], [[0, -1, 0]] * 3)  # unit area
    np.testing.assert_array_equal(normals[3], [0, 0, 1])


def test_tufted_laplacian_takes_float32_positions_and_mollifies_by_1e_5():
    import robust_laplacian

    pos, face = sphere(1)
    L, mass = tufted_laplacian(pos.astype(np.float32), face)
    expected_L, expected_M = robust_laplacian.mesh_laplacian(
        pos.astype(np.float32).astype(np.float64), face, 1e-5)
    assert abs(L - expected_L).max() == 0
    np.testing.assert_array_equal(mass, expected_M.diagonal())


def test_check_mesh_messages_and_the_smallest_meshes():
    pos, face = sphere(0)
    for bad_pos, shape in ((pos[:, :2], '[12, 2]'), (pos[:0], '[0, 3]')):
        with pytest.raises(MeshError, match=rf"^mesh: vertex positions must have "
                           rf"shape \[V, 3\], got {re.escape(shape)}$"):
            check_mesh(bad_pos, face)
    with pytest.raises(MeshError, match=r"^mesh: faces must be triangles of "
                       r"shape \[F, 3\], got \[0, 3\]$"):
        check_mesh(pos, face[:0])
    with pytest.raises(MeshError, match=r"^ball: face indices must lie in "
                       r"\[0, 11\], got \[0, 12\]$"):
        check_mesh(pos, np.concatenate([face, [[0, 1, 12]]]), name='ball')
    check_mesh(np.zeros((1, 3)), np.zeros((1, 3), np.int64))  # one vertex
    check_mesh(pos[:3], np.array([[0, 1, 2]]))  # one face


def test_normalize_positions_scales_to_unit_radius_or_centres_a_point():
    pos, _ = sphere(1)
    small = 0.25 * pos + 3.0
    np.testing.assert_allclose(normalize_positions(small), pos, atol=1e-12)
    np.testing.assert_array_equal(normalize_positions(np.ones((1, 3))),
                                  np.zeros((1, 3)))


def test_renumber_mesh_keeps_every_face_and_its_orientation():
    pos, face = sphere(1)
    new_pos, new_face, vertex_order, face_order = renumber_mesh(
        pos, face, np.random.default_rng(0))
    np.testing.assert_array_equal(new_pos, pos[vertex_order])
    old_corners = vertex_order[new_face]  # [F, 3] in old vertex numbers
    rotations = [np.roll(face[face_order], -shift, axis=1) for shift in range(3)]
    matches = np.stack([(old_corners == r).all(1) for r in rotations])
    assert matches.any(0).all()  # each face a rotation of its old corners
    assert len(set(matches.argmax(0).tolist())) == 3  # rotated at random


def test_laplacian_auto_takes_cotan_on_clean_meshes_and_names_the_rest():
    pos, face = sphere(1)
    L, mass, method = laplacian(pos, face)
    expected_L, expected_mass = cotan_laplacian(pos, face)
    assert method == 'cotan' and abs(L - expected_L).max() == 0
    np.testing.assert_array_equal(mass, expected_mass)
    for name, build in (('cotan', cotan_laplacian), ('robust', tufted_laplacian)):
        L, mass, _ = laplacian(pos, face, name)
        assert abs(L - build(pos, face)[0]).max() == 0, name
    with pytest.raises(ValueError, match=r"^Unknown Laplacian 'tufted'; expected "
                       r"one of \('auto', 'cotan', 'robust'\)$"):
        laplacian(pos, face, 'tufted')
    # float32 positions give the float64 operator.
    small = np.round(pos * 8) / 8
    assert abs(cotan_laplacian(small.astype(np.float32), face)[0]
               - cotan_laplacian(small, face)[0]).max() == 0


@pytest.mark.parametrize('scale,height', [(10.0, 1e-11), (0.1, 1e-13)])
def test_laplacian_auto_takes_robust_where_a_face_is_a_sliver(scale, height):
    """A face of area at most 1e-12 of the squared extent is degenerate:
    here 5e-11 of 100 and 5e-15 of 0.01 (an open, manifold strip)."""
    pos = scale * np.array([[0, 0, 0], [1, 0, 0], [0.5, height / scale, 0],
                            [0.5, 1, 0]])
    face = np.array([[0, 1, 2], [0, 2, 3]])
    assert face_areas(pos, face)[0] <= 1e-12 * np.ptp(pos) ** 2
    assert laplacian(pos, face)[2] == 'robust'
    lifted = pos + np.array([0, scale * 1e-3, 0]) * [[0], [0], [1], [0]]
    assert laplacian(lifted, face)[2] == 'cotan'  # no longer a sliver


def test_vertex_fan_counts_give_an_unreferenced_vertex_zero():
    pos, face = sphere(0)
    counts = vertex_fan_counts(face, len(pos) + 1)
    np.testing.assert_array_equal(counts, [1] * len(pos) + [0])


@pytest.mark.parametrize('k,pairs', [(10, 10), (11, 12), (12, 12)])
def test_eigendecomposition_is_dense_from_k_of_v_minus_1(k, pairs):
    """12 vertices: ``k`` pairs from ARPACK up to k = 10, all 12 from the
    dense solver from k = 11; the smallest eigenvalue ~0, none negative."""
    pos, face = sphere(0)
    L, mass, _ = laplacian(pos, face)
    evals, evecs = eigendecomposition(L, mass, k=k)
    assert evals.shape == (pairs,) and evecs.shape == (12, pairs)
    assert 0 <= evals[0] < 1e-6 and (evals >= 0).all()


def test_eigendecomposition_retries_with_a_tenfold_shift_then_names_the_mesh(
        monkeypatch):
    """Where the factorisation fails, the diagonal shift of L grows tenfold
    per retry (DiffusionNet's recipe); after ``max_retries`` the error
    names the mesh and the number of retries."""
    pos, face = sphere(1)
    L, mass, _ = laplacian(pos, face)
    shifts = []
    eigsh = spectral.sla.eigsh

    def failing(shifted, *args, failures, **kwargs):
        shifts.append(float((shifted - L).diagonal().mean()))
        if len(shifts) <= failures:
            raise RuntimeError('factor is exactly singular')
        return eigsh(shifted, *args, **kwargs)

    monkeypatch.setattr(spectral.sla, 'eigsh',
                        lambda *a, **kw: failing(*a, failures=2, **kw))
    evals, _ = eigendecomposition(L, mass, k=8, eps=1e-8)
    np.testing.assert_allclose(shifts, [1e-8, 1.1e-7, 1.11e-6], rtol=1e-6)
    assert evals.shape == (8,)
    shifts.clear()
    monkeypatch.setattr(spectral.sla, 'eigsh',
                        lambda *a, **kw: failing(*a, failures=99, **kw))
    with pytest.raises(MeshError, match=r"^mesh: the eigendecomposition failed "
                       r"after 4 regularised retries \(factor is exactly "
                       r"singular\)$"):
        eigendecomposition(L, mass, k=8)
    assert len(shifts) == 5
    with pytest.raises(MeshError, match=r"^mesh: the mass matrix has zero"):
        eigendecomposition(L, np.zeros(len(pos)), k=8)


def test_hks_times_bounds_and_default_count():
    np.testing.assert_allclose(hks_times(3, 0.01), [0.01, 0.1, 1.0])
    for bad in (0.0, 1.0, 1.5):
        with pytest.raises(ValueError, match=rf"^'min_time' must lie in \(0, 1\), "
                           rf"got {bad}$"):
            hks_times(4, bad)
    rng = np.random.default_rng(1)
    evals, evecs = np.sort(rng.uniform(0, 5, 4)), rng.normal(size=(3, 4))
    np.testing.assert_array_equal(heat_kernel_signature(evals, evecs),
                                  heat_kernel_signature(evals, evecs, hks_times()))
    assert heat_kernel_signature(evals, evecs).shape == (3, 16)


def test_face_normals_of_small_tilted_faces_match_float64_cross_products():
    """Faces of area far below 1 (|cross| < 1) are normalised too, each by
    its own norm: against the normalised cross product written out per
    component."""
    rng = np.random.default_rng(3)
    pos = rng.normal(size=(6, 3)) * np.array([[1e-3], [0.2], [0.5]]).repeat(2, 0)
    face = np.array([[0, 1, 2], [3, 4, 5], [0, 2, 4], [1, 3, 5]])
    a, b = pos[face[:, 1]] - pos[face[:, 0]], pos[face[:, 2]] - pos[face[:, 0]]
    cross = np.stack([a[:, 1] * b[:, 2] - a[:, 2] * b[:, 1],
                      a[:, 2] * b[:, 0] - a[:, 0] * b[:, 2],
                      a[:, 0] * b[:, 1] - a[:, 1] * b[:, 0]], axis=1)
    length = np.sqrt((cross ** 2).sum(1, keepdims=True))
    assert (length < 1).all()
    np.testing.assert_allclose(face_normals(pos, face), cross / length,
                               rtol=1e-12, atol=0)


def test_face_normals_are_unit_and_zero_for_a_collapsed_face():
    pos = np.array([[0, 0, 0], [2, 0, 0], [0, 0, 3], [1, 0, 0.0]])
    face = np.array([[0, 1, 2], [0, 2, 1], [0, 3, 1]])  # the last collapsed
    np.testing.assert_array_equal(face_normals(pos, face),
                                  [[0, -1, 0], [0, 1, 0], [0, 0, 0]])
