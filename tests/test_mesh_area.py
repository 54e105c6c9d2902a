"""scale_to_area / AreaNormalization: a prepared mesh scaled to a set area
carries the operators that preprocessing the scaled mesh computes, for one
mesh and for a batch, and refuses what it cannot scale."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch_geometric.data import Batch

from pyg_metric_attn.geometry import face_areas
from pyg_metric_attn.transforms import AreaNormalization, MeshPreprocessing
from pyg_metric_attn.transforms.mesh_area import scale_to_area
from tests.test_mesh_preprocessing import bumpy_sphere, raw_data

pytestmark = pytest.mark.usefixtures('one_thread')

K, HKS = 24, 6


def prepared(seed: int = 0, stretch: float = 1.0, **settings):
    """A bumpy sphere stretched along x, prepared (``spectral_basis = k``)."""
    pos, face = bumpy_sphere(seed)
    pos = pos * np.array([stretch, 1.0, 1.0])
    preprocessing = MeshPreprocessing(K, HKS, settings.pop('spectral_basis', K),
                                      True, **settings)
    return preprocessing, preprocessing(raw_data(pos, face))


def assert_operators_of_the_scaled_mesh(out, preprocessing, area: float) -> None:
    """``out`` holds the operators MeshPreprocessing computes from its positions
    (eigenvector signs aside: compared through sign-free quantities)."""
    pos, face = out.pos.double().numpy(), out.face.t().numpy()
    assert face_areas(pos, face).sum() == pytest.approx(area, rel=1e-5)
    expected = preprocessing.operators(pos, face)
    assert out.mass.sum().item() == pytest.approx(area, rel=1e-5)
    torch.testing.assert_close(out.mass, expected['mass'], rtol=1e-5, atol=0)
    torch.testing.assert_close(out.evals[:, 1:], expected['evals'][:, 1:],
                               rtol=1e-4, atol=0)
    torch.testing.assert_close(out.hks, expected['hks'], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(out.x, out.hks)
    # Projectors onto the eigenspaces do not depend on the eigenvectors' signs.
    torch.testing.assert_close(out.evecs.square(), expected['evecs'].square(),
                               rtol=1e-3, atol=1e-5)
    assert torch.equal(out.grad_index, expected['grad_index'])
    # (float32 positions: an entry that cancels keeps their round-off)
    torch.testing.assert_close(out.grad_weight, expected['grad_weight'],
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('area', [1.0, 3.0])
def test_a_mesh_scaled_to_an_area_carries_the_operators_of_the_scaled_mesh(area):
    preprocessing, data = prepared()
    assert data.mass.sum().item() != pytest.approx(area, rel=1e-2)
    out = AreaNormalization(area)(data.clone())
    assert_operators_of_the_scaled_mesh(out, preprocessing, area)
    assert out.face is not None and torch.equal(out.face, data.face)


def test_every_mesh_of_a_batch_is_scaled_by_its_own_area():
    meshes = [prepared(seed, stretch)[1] for seed, stretch in ((0, 1.0), (1, 1.6))]
    preprocessing = prepared()[0]
    batch = Batch.from_data_list(meshes)
    out = scale_to_area(batch, 2.0)
    for i, mesh in enumerate(meshes):
        alone = scale_to_area(mesh, 2.0)
        for key in ('pos', 'mass', 'evals', 'evecs', 'hks', 'x', 'grad_weight'):
            torch.testing.assert_close(out.get_example(i)[key], alone[key],
                                       rtol=1e-5, atol=1e-7)
        assert_operators_of_the_scaled_mesh(out.get_example(i), preprocessing, 2.0)
    # The input is left as it was.
    torch.testing.assert_close(batch.mass, Batch.from_data_list(meshes).mass)


def test_scaling_twice_changes_nothing_more():
    _, data = prepared(stretch=1.3)
    once = scale_to_area(data, 1.0)
    twice = scale_to_area(once, 1.0)
    for key in ('pos', 'mass', 'evals', 'evecs', 'hks', 'grad_weight'):
        torch.testing.assert_close(twice[key], once[key], rtol=1e-5, atol=1e-7)


def test_what_cannot_be_scaled_is_named():
    _, data = prepared()
    with pytest.raises(ValueError, match="'area' must be positive"):
        AreaNormalization(0.0)
    with pytest.raises(ValueError, match="needs its vertex areas 'mass'"):
        scale_to_area(raw_data(*bumpy_sphere()))
    few = prepared(spectral_basis=K // 2)[1]
    with pytest.raises(ValueError, match='came from more eigenpairs'):
        scale_to_area(few)
    no_basis = prepared(spectral_basis=0)[1]
    with pytest.raises(ValueError, match='spectral_basis = k'):
        scale_to_area(no_basis)
    flat = data.clone()
    flat.mass = torch.zeros_like(flat.mass)
    with pytest.raises(ValueError, match='no surface area'):
        scale_to_area(flat)
