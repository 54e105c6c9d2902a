"""DiffusionNet: shapes, meshes of a batch kept apart, the gradient features
in use, and outputs that do not depend on the vertex numbering."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import trimesh
from torch_geometric.data import Batch

from pyg_metric_attn.datasets import mesh_data
from pyg_metric_attn.geometry import renumber_mesh
from pyg_metric_attn.nn.models import DiffusionNet, DiffusionNetConfig
from pyg_metric_attn.transforms import MeshPreprocessing

PREPROCESS = MeshPreprocessing(k=16, hks_count=4, spectral_basis=16,
                               gradients=True, laplacian='cotan')


def bumpy_sphere(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """An icosphere with random radii (no symmetry, so no repeated
    eigenvalues at the truncation)."""
    sphere = trimesh.creation.icosphere(2)
    radius = np.random.default_rng(seed).uniform(0.8, 1.2, (len(sphere.vertices), 1))
    return np.asarray(sphere.vertices) * radius, np.asarray(sphere.faces)


def inputs(data) -> dict:
    return dict(evecs=data.evecs, evals=data.evals, mass=data.mass,
                grad_index=data.grad_index, grad_weight=data.grad_weight)


def test_shapes_meshes_apart_and_gradient_features_in_use():
    box = trimesh.creation.box().subdivide().subdivide()
    data_list = [PREPROCESS(mesh_data(*bumpy_sphere(), 'sphere')),
                 PREPROCESS(mesh_data(np.asarray(box.vertices),
                                      np.asarray(box.faces), 'box'))]
    batch = Batch.from_data_list(data_list)
    torch.manual_seed(0)
    model = DiffusionNet(4, 3, hidden_channels=16, num_layers=2)
    model.eval()
    out = model(batch.hks, **inputs(batch), batch=batch.batch)
    assert out.shape == (batch.num_nodes, 3)
    alone = model(data_list[1].hks, **inputs(data_list[1]))
    torch.testing.assert_close(alone, out[batch.batch == 1], atol=1e-5, rtol=0)
    out.square().sum().backward()
    assert model.blocks[0].gradient_features.real.weight.grad.abs().sum() > 0
    assert model.blocks[0].diffusion.log_time.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="'grad_index' and 'grad_weight'"):
        model(batch.hks, batch.evecs, batch.evals, batch.mass, batch=batch.batch)
    plain = DiffusionNet(4, 3, hidden_channels=16, gradient_features=False)
    assert plain(batch.hks, batch.evecs, batch.evals, batch.mass,
                 batch=batch.batch).shape == (batch.num_nodes, 3)
    assert plain.blocks[0].mlp[0].in_channels == 32  # [h | diffused]


def test_config_is_checked():
    with pytest.raises(ValueError, match="'dropout' must be in"):
        DiffusionNetConfig(dropout=1.0)
    with pytest.raises(ValueError, match="'num_layers' must be a positive"):
        DiffusionNet(4, 3, num_layers=0)
    with pytest.raises(TypeError, match='unknown arguments'):
        DiffusionNet(4, 3, heads=2)
    assert DiffusionNet(4, 3).config == DiffusionNetConfig(128, 4, 0.5, True)


def test_outputs_do_not_depend_on_the_vertex_numbering():
    pos, face = bumpy_sphere(1)
    new_pos, new_face, vertex_order, _ = renumber_mesh(
        pos, face, np.random.default_rng(0))
    original = PREPROCESS(mesh_data(pos, face, 'sphere'))
    renumbered = PREPROCESS(mesh_data(new_pos, new_face, 'sphere'))
    torch.manual_seed(0)
    model = DiffusionNet(4, 5, hidden_channels=16, num_layers=2).eval()
    with torch.no_grad():
        out = model(original.hks, **inputs(original))
        new_out = model(renumbered.hks, **inputs(renumbered))
    torch.testing.assert_close(new_out, out[torch.from_numpy(vertex_order)],
                               atol=1e-4, rtol=1e-4)
