"""MeshPreprocessing, the one preprocessing path of the mesh models."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import trimesh
from conftest import shared_dataset
from torch_geometric.data import Data

from pyg_metric_attn.datasets.mesh_dataset import compute_operators, mesh_data
from pyg_metric_attn.datasets.mesh_io import read_mesh
from pyg_metric_attn.transforms.mesh_preprocessing import MeshPreprocessing

pytestmark = pytest.mark.usefixtures('one_thread')


def bumpy_sphere() -> tuple[np.ndarray, np.ndarray]:
    """An icosphere (162 vertices) with seeded bumps: no symmetric
    eigenspaces."""
    sphere = trimesh.creation.icosphere(2)
    bumps = np.random.default_rng(0).uniform(0.9, 1.1, (len(sphere.vertices), 1))
    return np.asarray(sphere.vertices) * bumps * 3 + 1, np.asarray(sphere.faces)


def meshes() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    pos, face = bumpy_sphere()
    icosahedron = trimesh.creation.icosahedron()  # 12 vertices < k: padded
    collapsed = np.concatenate([face, [[0, 0, 1]]])  # a zero-area face: robust
    return {'sphere': (pos, face),
            'small': (np.asarray(icosahedron.vertices),
                      np.asarray(icosahedron.faces)),
            'collapsed': (pos, collapsed)}


def raw_data(pos: np.ndarray, face: np.ndarray, name: str) -> Data:
    return Data(pos=torch.from_numpy(pos), face=torch.from_numpy(face.T.copy()),
                name=name)


def assert_same_fields(data: Data, expected: Data, keys) -> None:
    for key in keys:
        value, reference = data[key], expected[key]
        assert value.dtype == reference.dtype, key
        assert torch.equal(value, reference), key


@pytest.mark.parametrize('spectral_basis,gradients', [(0, False), (10, True),
                                                      (16, True)])
def test_equals_the_data_sets_former_operators(spectral_basis, gradients):
    settings = dict(k=16, hks_count=4, gradients=gradients,
                    laplacian_method='auto')
    preprocess = MeshPreprocessing(16, 4, spectral_basis, gradients)
    keys = ['pos', 'edge_index', 'hks', 'x', 'mass']
    keys += ['evals', 'evecs'] if spectral_basis else []
    keys += ['grad_index', 'grad_weight'] if gradients else []
    for name, (pos, face) in meshes().items():
        old = mesh_data(pos, face, name)
        compute_operators([old], settings, cache_dir=None, num_workers=1,
                          progress=False, spectral_basis=spectral_basis)
        new = preprocess(raw_data(pos, face, name))
        assert_same_fields(new, old, keys)


def test_equals_the_former_operators_on_a_benchmark_mesh():
    # A SCAPE mesh: a pinch vertex, so the robust Laplacian; k = 128 as trained.
    pos, face = read_mesh(shared_dataset('human_seg') / 'train' / 'scape__mesh000.obj')
    old = mesh_data(pos, face, 'scape')
    compute_operators([old], dict(k=128, hks_count=16, gradients=True,
                                  laplacian_method='auto'),
                      cache_dir=None, num_workers=1, progress=False,
                      spectral_basis=128)
    new = MeshPreprocessing(128, 16, 128, True)(raw_data(pos, face, 'scape'))
    assert_same_fields(new, old, ['pos', 'edge_index', 'hks', 'x', 'mass', 'evals',
                                  'evecs', 'grad_index', 'grad_weight'])
