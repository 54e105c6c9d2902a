"""Tangent gradients as the mesh data sets store them, and DiffusionNet's
spatial gradient features."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import trimesh
from torch_geometric.data import Batch

from pyg_metric_attn.datasets import mesh_data
from pyg_metric_attn.geometry import gradient_operators
from pyg_metric_attn.nn import SpatialGradientFeatures
from pyg_metric_attn.nn.models import MetricMeshFormer
from pyg_metric_attn.nn.spatial_gradient import TangentGradient, vertex_gradients
from pyg_metric_attn.transforms import MeshPreprocessing

PREPROCESS = MeshPreprocessing(k=16, hks_count=4, spectral_basis=16,
                               gradients=True, laplacian='cotan')


def meshes_with_gradients():
    sphere = trimesh.creation.icosphere(2)
    box = trimesh.creation.box()
    box = box.subdivide().subdivide()  # 98 vertices, corners and flat sides
    return [PREPROCESS(mesh_data(np.asarray(m.vertices), np.asarray(m.faces), name))
            for name, m in (('sphere', sphere), ('box', box))]


def test_stored_gradients_equal_the_sparse_operators_per_mesh_in_a_batch():
    data_list = meshes_with_gradients()
    batch = Batch.from_data_list(data_list)
    h = torch.randn(batch.num_nodes, 3, dtype=torch.float64)
    out = vertex_gradients(h, batch.grad_index, batch.grad_weight.double())
    assert out.shape == (batch.num_nodes, 2, 3)
    for i, data in enumerate(data_list):
        grad_x, grad_y = gradient_operators(data.pos.double().numpy(),
                                            data.face.t().numpy())
        f = h[batch.batch == i].numpy()
        expected = np.stack([grad_x @ f, grad_y @ f], axis=1)
        # The stored coefficients are float32.
        np.testing.assert_allclose(out[batch.batch == i].numpy(), expected,
                                   rtol=1e-5, atol=1e-5 * np.abs(expected).max())


def test_gradient_features_formula_and_frame_invariance():
    torch.manual_seed(0)
    features = SpatialGradientFeatures(5).double()
    g = torch.randn(40, 2, 5, dtype=torch.float64)
    out = features(g)
    # Reference: tanh(Re(conj(g) * (A g))) with complex numbers.
    A = (features.real.weight + 1j * features.imag.weight).detach().numpy()
    gc = (g[:, 0] + 1j * g[:, 1]).numpy()
    reference = np.tanh((np.conj(gc) * (gc @ A.T)).real)
    np.testing.assert_allclose(out.detach().numpy(), reference, atol=1e-12)

    def rotate(g, angle):
        c, s = torch.cos(angle), torch.sin(angle)
        return torch.stack([c * g[:, 0] - s * g[:, 1], s * g[:, 0] + c * g[:, 1]], 1)

    # Another tangent frame per vertex: the same features.
    angle = torch.rand(40, 1, dtype=torch.float64) * 2 * torch.pi
    assert torch.allclose(features(rotate(g, angle)), out, atol=1e-12)
    # Turning one channel against the others changes them: directions count.
    turned = g.clone()
    turned[:, :, :1] = rotate(g[:, :, :1], torch.full((40, 1), 1.0,
                                                        dtype=torch.float64))
    assert not torch.allclose(features(turned), out, atol=1e-3)


def test_bad_inputs_are_named():
    h = torch.randn(4, 3)
    index = torch.tensor([[0, 1], [1, 4]])
    with pytest.raises(IndexError, match="refers to vertex 4"):
        vertex_gradients(h, index, torch.randn(2, 2))
    with pytest.raises(ValueError, match="'grad_weight' must have shape"):
        vertex_gradients(h, index, torch.randn(2, 3))
    with pytest.raises(IndexError, match="negative index -1"):
        vertex_gradients(h, torch.tensor([[0, 1], [1, -1]]), torch.randn(2, 2))
    with pytest.raises(ValueError, match="'h' must have shape \\[4, C\\]"):
        TangentGradient.from_batch(index.clamp(max=3), torch.randn(2, 2),
                                   4).apply(torch.randn(5, 3))
    with pytest.raises(ValueError, match="'gradients' must have shape"):
        SpatialGradientFeatures(3)(torch.randn(4, 3, 2))
    with pytest.raises(ValueError, match="needs 'diffusion=True'"):
        MetricMeshFormer(4, 3, hidden_channels=8, heads=2, gradients=True)


def test_former_with_gradient_features_uses_them():
    data_list = meshes_with_gradients()
    batch = Batch.from_data_list(data_list)
    torch.manual_seed(0)
    model = MetricMeshFormer(4, 3, hidden_channels=16, num_layers=2, heads=2,
                             diffusion=True, gradients=True)
    inputs = dict(evecs=batch.evecs, evals=batch.evals, mass=batch.mass)
    out = model(batch.hks, batch.edge_index, batch.batch, **inputs,
                grad_index=batch.grad_index, grad_weight=batch.grad_weight)
    out.square().sum().backward()
    assert model.blocks[0].gradient_features.real.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="'grad_index' and 'grad_weight'"):
        model(batch.hks, batch.edge_index, batch.batch, **inputs)
    # The second mesh alone gives its rows of the batched output.
    alone = model(data_list[1].hks, data_list[1].edge_index, None,
                  data_list[1].evecs, data_list[1].evals, data_list[1].mass,
                  data_list[1].grad_index, data_list[1].grad_weight)
    assert torch.allclose(alone, out[batch.batch == 1], atol=1e-5)


def test_gradients_apply_under_autocast():
    """The sparse product runs in float32 also where autocast would cast it
    to bfloat16 (which the CSR kernels do not take)."""
    gradient = TangentGradient.from_batch(torch.tensor([[0, 1, 2], [1, 2, 0]]),
                                          torch.randn(3, 2), 3)
    h = torch.randn(3, 4)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        out = gradient.apply(h)
    torch.testing.assert_close(out, gradient.apply(h))
