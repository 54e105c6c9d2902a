"""The mesh models' predictions do not depend on how a file numbers the
vertices, the faces and each face's corners: a renumbered file goes through
the whole preprocessing (operators computed from it) and every model the
human_seg task builds gives the same per-face logits."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import trimesh
from conftest import shared_dataset
from torch_geometric.utils import to_dense_batch

from pyg_metric_attn.datasets.mesh_io import read_mesh
from pyg_metric_attn.datasets.synthetic_humans import synthetic_human
from pyg_metric_attn.experiments.attention import ATTENTIONS
from pyg_metric_attn.experiments.tasks.human_seg import HumanSegTask
from pyg_metric_attn.geometry import renumber_mesh
from pyg_metric_attn.training.segmentation import face_logits
from pyg_metric_attn.utils.point_sets import (
    UNRANKED,
    PaddedSets,
    farthest_point_keys,
    farthest_point_ranks,
    farthest_point_sampling,
)

K = 32  # eigenpairs: enough for the diffusion, cheap to compute

#: (model, task options): the former as the task builds it by default and
#: with its other global options, DiffusionNet, and the IPN with every
#: attention.
MODELS = [pytest.param('metricformer', {}, id='former'),
          pytest.param('metricformer', dict(former_global_stride=1),
                       id='former-all-pairs'),
          pytest.param('metricformer', dict(former_global_stride=3),
                       id='former-stride3'),
          pytest.param('metricformer', dict(former_global_attention=False),
                       id='former-local'),
          pytest.param('metricformer', dict(former_local_attention=False),
                       id='former-global'),
          pytest.param('metricformer', dict(former_gradients=False),
                       id='former-no-gradients'),
          pytest.param('metricformer', dict(former_diffusion=False),
                       id='former-no-diffusion'),
          pytest.param('diffusionnet', {}, id='diffusionnet'),
          *[pytest.param(attention, {}, id=f'ipn-{attention}')
            for attention in ATTENTIONS]]


pytestmark = pytest.mark.usefixtures('one_thread')


def test_renumber_mesh_keeps_the_oriented_faces():
    sphere = trimesh.creation.icosphere(1)
    pos, face = np.asarray(sphere.vertices), np.asarray(sphere.faces)
    new_pos, new_face, vertex_order, face_order = renumber_mesh(
        pos, face, np.random.default_rng(0))
    assert (vertex_order != np.arange(len(pos))).any()
    assert (face_order != np.arange(len(face))).any()
    np.testing.assert_array_equal(new_pos, pos[vertex_order])
    old = vertex_order[new_face]  # the new faces in old vertex ids
    rotations = [(old == np.roll(face[face_order], -shift, axis=1)).all(1)
                 for shift in range(3)]
    assert np.logical_or.reduce(rotations).all()  # same faces, same orientation
    assert all(rotation.any() for rotation in rotations)  # corners rotated


@pytest.fixture(scope='module', params=['synthetic', 'human_seg'])
def mesh_pair(request):
    """A mesh and its renumbered copy, each processed from its own file as
    the task processes meshes (all operators any model needs)."""
    if request.param == 'synthetic':
        pos, face, _ = synthetic_human(np.random.default_rng(0), target_faces=1500)
    else:
        pos, face = read_mesh(shared_dataset('human_seg') / 'test' / 'shrec__1.obj')
    new_pos, new_face, _, face_order = renumber_mesh(
        pos, face, np.random.default_rng(0))
    task = HumanSegTask(progress=False, k=K)
    segmenter = task.segmenter(task.build_model('metric'))
    return (segmenter.prepare(pos, face, 'mesh'),
            segmenter.prepare(new_pos, new_face, 'renumbered'), face_order)


@pytest.mark.parametrize('model_name,options', MODELS)
def test_predictions_do_not_depend_on_numbering(mesh_pair, model_name, options):
    mesh, renumbered_mesh, face_order = mesh_pair
    task = HumanSegTask(progress=False, k=K, **options)
    torch.manual_seed(0)
    model = task.build_model(model_name).eval()
    with torch.no_grad():
        logits = face_logits(task.forward(model, mesh), mesh.face)
        new_logits = face_logits(task.forward(model, renumbered_mesh),
                                 renumbered_mesh.face)
    assert logits.std(dim=0).min() > 0.01  # the logits differ between faces
    torch.testing.assert_close(new_logits, logits[face_order], rtol=1e-4,
                               atol=1e-4)


def test_farthest_point_sampling_by_hand():
    # Two sets of the points 0, 1, ..., 9 on a line, the second shuffled
    # (a fixed order that puts the tied points out of position order).
    shuffled = torch.randperm(10, generator=torch.Generator().manual_seed(0))
    x = torch.cat([torch.arange(10.0), shuffled.float()])
    pos = torch.stack([x, torch.zeros(20), torch.zeros(20)], dim=1)
    batch = torch.arange(2).repeat_interleave(10)
    chosen = farthest_point_sampling(pos, batch, stride=3)
    # ceil(10 / 3) = 4 per set: 0 and 9 are farthest from the centroid 4.5
    # (tie: the smaller position), then 9, then 4 (tied with 5), then 2
    # (tied with 6 and 7).
    for points in x[chosen].split(4):
        assert sorted(points.tolist()) == [0.0, 2.0, 4.0, 9.0]
    assert farthest_point_sampling(pos, batch).all()  # stride 1: all


def test_farthest_point_sampling_ignores_order_even_on_ties():
    # A regular icosahedron subdivided: every vertex is as far from the
    # centroid as every other, and many distances tie afterwards.
    sphere = trimesh.creation.icosphere(2)
    pos = torch.tensor(sphere.vertices, dtype=torch.float32)
    chosen = pos[farthest_point_sampling(pos, stride=5)]
    assert len(chosen) == -(-len(pos) // 5)
    for seed in range(3):
        order = torch.randperm(len(pos), generator=torch.Generator().manual_seed(seed))
        again = pos[order][farthest_point_sampling(pos[order], stride=5)]
        assert sorted(map(tuple, again.tolist())) == sorted(map(tuple, chosen.tolist()))


def test_farthest_point_ranks_hold_the_samples_of_every_stride():
    generator = torch.Generator().manual_seed(0)
    for trial in range(12):
        sizes = torch.randint(1, 40, (1 + trial % 3,), generator=generator)
        batch = torch.arange(len(sizes)).repeat_interleave(sizes)
        if trial % 2:  # points on a small grid: many coincide
            pos = torch.randint(0, 3, (len(batch), 3), generator=generator).float()
        else:
            pos = torch.randn(len(batch), 3, generator=generator)
        ranks = farthest_point_ranks(pos, batch)
        for stride in (1, 2, 3, 8):
            assert torch.equal(farthest_point_keys(ranks, batch, stride),
                               farthest_point_sampling(pos, batch, stride))
        # Empty sets between them: set indices beyond the point count.
        sparse = 1000 * batch + 5
        assert torch.equal(farthest_point_keys(ranks, sparse, 3),
                           farthest_point_sampling(pos, batch, 3))
        for points, set_ranks in zip(pos.split(sizes.tolist()),
                                     ranks.split(sizes.tolist()), strict=True):
            # Distinct positions get the steps 0, 1, ...; a point that
            # coincides with a ranked one gets none.
            distinct = len(torch.unique(points, dim=0))
            assert sorted(set_ranks[set_ranks != UNRANKED].tolist()) == list(
                range(distinct))
    # One set: the first points on the line of the test above, in order.
    x = torch.arange(10.0)
    ranks = farthest_point_ranks(torch.stack([x, 0 * x, 0 * x], dim=1))
    assert ranks[[0, 9, 4, 2]].tolist() == [0, 1, 2, 3]


def test_farthest_point_keys_checks_its_inputs():
    ranks = farthest_point_ranks(torch.randn(5, 3))
    with pytest.raises(ValueError, match=r"'ranks' must be an int64 vector "
                       r"\[N\], got torch.float32 of shape \[5\]"):
        farthest_point_keys(ranks.float(), stride=2)
    with pytest.raises(ValueError, match="'stride' must be a positive integer, "
                       "got 0"):
        farthest_point_keys(ranks, stride=0)
    with pytest.raises(ValueError, match="'stride' must be a positive integer"):
        farthest_point_sampling(torch.randn(5, 3), stride=2.5)
    with pytest.raises(ValueError, match="'batch' must be sorted"):
        farthest_point_keys(ranks, torch.tensor([0, 1, 0, 1, 1]), stride=2)


def test_padded_sets_lay_out_points_and_keys_as_to_dense_batch():
    generator = torch.Generator().manual_seed(0)
    batch = torch.tensor([0, 0, 0, 2, 2, 3, 3, 3, 3, 3])  # set 1 empty
    x = torch.randn(10, 4, generator=generator)
    keys = torch.tensor([1, 0, 1, 0, 1, 1, 0, 0, 1, 1], dtype=torch.bool)
    layout = PaddedSets.of(keys, batch)
    queries, query_mask = to_dense_batch(x, batch)
    padded_keys, key_mask = to_dense_batch(x[keys], batch[keys],
                                           batch_size=queries.size(0))
    assert layout.shape == (4, 5, 3)
    assert torch.equal(layout.queries(x), queries)
    assert torch.equal(layout.keys(x), padded_keys)
    assert torch.equal(layout.key_padding, ~key_mask)
    assert torch.equal(layout.unpad(queries), x)
    # One set (batch None) and gradients through all three.
    x.requires_grad_()
    layout = PaddedSets.of(keys)
    out = layout.unpad(layout.queries(x) + layout.keys(x).sum(1, keepdim=True))
    out.sum().backward()
    assert torch.equal(x.grad, 1 + 10 * keys.float()[:, None].expand(10, 4))
    with pytest.raises(ValueError, match=r"'keys' must be a boolean mask \[N\], "
                       r"got torch.int64 of shape \[10\]"):
        PaddedSets.of(keys.long(), batch)
    with pytest.raises(ValueError, match="'batch' must be sorted"):
        PaddedSets.of(keys, batch.flip(0))
