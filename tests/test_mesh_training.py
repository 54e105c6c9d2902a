"""Mesh segmentation: metrics against hand-computed values, the global
attention of MetricMeshFormer, a short training run, the train / resume /
evaluate / predict commands, and training in two processes under torchrun."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import trimesh
from matplotlib.figure import Figure
from torch_geometric.data import Batch, Data

from pyg_metric_attn.cli import main
from pyg_metric_attn.datasets import BODY_PARTS, SyntheticHumans
from pyg_metric_attn.experiments import TASKS
from pyg_metric_attn.experiments.tasks.human_seg import HumanSegTask
from pyg_metric_attn.geometry import taubin_smoothing
from pyg_metric_attn.nn.models import (
    MetricMeshFormer,
    MetricMeshFormerConfig,
    mesh_former,
)
from pyg_metric_attn.training import load_best_model
from pyg_metric_attn.training.segmentation import SegmentationMeter, face_logits
from pyg_metric_attn.transforms import MeshPreprocessing
from pyg_metric_attn.utils.io import load_verified
from pyg_metric_attn.utils.point_sets import PaddedSets, farthest_point_ranks
from pyg_metric_attn.visualization import (
    MARK_COLOR,
    label_colors,
    render_segmentations,
)

#: The tiny synthetic setting, without the recipe's copies, smoothing and
#: validation meshes where a test does not set them.
SMALL = dict(synthetic_train=4, synthetic_test=1, num_workers=1, k=32,
             batch_size=2, augment_copies=0, mesh_smoothing=0, val_fraction=0.0)


def small(**changes):
    """The tiny setting with some options changed."""
    return {**SMALL, **changes}


pytestmark = pytest.mark.usefixtures('one_thread')


@pytest.fixture(scope='module')
def synthetic_root(tmp_path_factory):
    root = tmp_path_factory.mktemp('synthetic')
    for split, count in (('train', 4), ('test', 1)):
        SyntheticHumans(str(root), split, count, num_workers=1,
                        pre_transform=MeshPreprocessing(32), log=False)
    return root


@pytest.fixture(scope='module')
def trained_run(synthetic_root, tmp_path_factory):
    """A run folder of ``train`` (one epoch of the IPN on the tiny data)."""
    run = tmp_path_factory.mktemp('trained') / 'run'
    assert main(['train', '--attention', 'metric', '--epochs', '1', '--out',
                 str(run), '--no-progress', *cli_options(synthetic_root)]) == 0
    return run


def cli_options(synthetic_root) -> list[str]:
    """``-o`` flags of the tiny synthetic setting."""
    return ['-o', f'processed_dir={synthetic_root}'] + [
        arg for key, value in SMALL.items() for arg in ('-o', f'{key}={value}')]


def test_segmentation_meter_by_hand():
    # Two triangles sharing edge (1, 2); 3 classes; logits chosen per vertex.
    face = torch.tensor([[0, 1, 2], [1, 3, 2]]).t()
    logits = torch.tensor([[3.0, 0, 0], [0, 3, 0], [0, 3, 0], [0, 0, 9]])
    # Face 0: mean (1, 2, 0) -> class 1; face 1: mean (0, 2, 3) -> class 2.
    assert face_logits(logits, face).argmax(1).tolist() == [1, 2]
    edges = torch.tensor([[0, 1], [1, 2], [0, 2], [1, 3], [2, 3]]).t()
    # Edge predictions from endpoints: 0, 1, 0, 2, 2.
    data = Data(face=face, y=torch.tensor([1, 1]), edge_label_index=edges,
                edge_label=torch.tensor([0, 1, 1, 2, 1]),
                edge_label_soft=torch.tensor([[1, 0, 0], [0, 1, 0], [1, 1, 0],
                                              [0, 0, 0], [0, 1, 1]]).bool(),
                edge_label_weight=torch.tensor([0.1, 0.2, 0.3, 0.15, 0.25]),
                num_nodes=4)
    meter = SegmentationMeter(3)
    meter.update(logits, Batch.from_data_list([data]))
    metrics = meter.compute('test_')
    assert metrics['test_face_acc'] == pytest.approx(0.5)
    assert metrics['test_edge_acc'] == pytest.approx(3 / 5)  # edges 0, 1, 3
    # Soft: edges 0 (0.1), 1 (0.2), 2 (0.3), 4 (0.25) have the prediction.
    assert metrics['test_soft_edge_acc'] == pytest.approx(0.85)
    details = meter.details()
    assert details['confusion'] == [[0, 0, 0], [0, 1, 1], [0, 0, 0]]
    assert details['class_acc'][1] == pytest.approx(0.5)
    assert np.isnan(details['class_acc'][0])


def test_global_attention_attends_to_the_marked_vertices():
    torch.manual_seed(0)
    model = MetricMeshFormer(5, 3, hidden_channels=16, num_layers=1, heads=2,
                             global_stride=3)
    block = model.blocks[0]
    sizes = [7, 11]
    h = torch.randn(sum(sizes), 16)
    batch = torch.repeat_interleave(torch.arange(2), torch.tensor(sizes))
    keys = torch.rand(sum(sizes)) < 0.4
    keys[[0, 7]] = True  # at least one key per mesh
    out = block._global(h, batch, keys)
    reference, all_pairs = [], []
    for part, mask in zip(h.split(sizes), keys.split(sizes), strict=True):
        ref, _ = block.global_attention(part[None], part[mask][None],
                                        part[mask][None], need_weights=False)
        reference.append(ref[0])
        ref, _ = block.global_attention(part[None], part[None], part[None],
                                        need_weights=False)
        all_pairs.append(ref[0])
    torch.testing.assert_close(out, torch.cat(reference), atol=1e-5, rtol=1e-5)
    # No mask: all pairs within each mesh (one unpadded call per mesh).
    torch.testing.assert_close(block._global(h, batch, None),
                               torch.cat(all_pairs), atol=1e-5, rtol=1e-5)
    # The model samples the keys from the positions.
    with pytest.raises(ValueError, match="pass 'pos'"):
        model(torch.randn(sum(sizes), 5), torch.empty(2, 0, dtype=torch.long),
              batch)


def no_sampling(*args, **kwargs):
    """A stand-in for farthest_point_sampling where the keys must come from
    the ranks."""
    raise AssertionError('the keys were sampled in the forward pass')


def test_former_takes_its_global_keys_from_the_farthest_point_ranks(
        monkeypatch):
    torch.manual_seed(0)
    model = MetricMeshFormer(5, 3, hidden_channels=16, num_layers=2, heads=2,
                             global_stride=3, dropout=0.0).eval()
    sizes = [7, 11]
    pos, x = torch.randn(sum(sizes), 3), torch.randn(sum(sizes), 5)
    batch = torch.repeat_interleave(torch.arange(2), torch.tensor(sizes))
    edges = torch.empty(2, 0, dtype=torch.long)
    ranks = farthest_point_ranks(pos, batch)
    sampled = model(x, edges, batch, pos=pos)
    monkeypatch.setattr(mesh_former, 'farthest_point_sampling', no_sampling)
    # The same vertices, so the same outputs to the bit; the ranks are read
    # where the positions are given too.
    assert torch.equal(model(x, edges, batch, farthest_point_rank=ranks), sampled)
    assert torch.equal(model(x, edges, batch, pos=pos, farthest_point_rank=ranks),
                       sampled)
    # Other ranks, other keys.
    assert not torch.equal(model(x, edges, batch, farthest_point_rank=ranks.flip(0)),
                           sampled)
    with pytest.raises(ValueError, match=r"'farthest_point_rank' must have "
                       r"shape \[18\] \(one per vertex\), got \[17\]"):
        model(x, edges, batch, farthest_point_rank=ranks[1:])


def test_human_seg_meshes_carry_the_ranks_and_no_step_samples_keys(
        synthetic_root, monkeypatch):
    task = HumanSegTask(progress=False, processed_dir=str(synthetic_root), **SMALL)
    assert task.preprocessing.farthest_point_ranks  # the former's stride 8
    train = task.meshes("train")
    batch = Batch.from_data_list([train[0], train[1]])
    assert torch.equal(batch.farthest_point_rank,
                       farthest_point_ranks(batch.pos, batch.batch))
    torch.manual_seed(0)
    model = task.build_model('metricformer').eval()
    with torch.no_grad():
        sampled = model(batch.x, batch.edge_index, batch.batch, pos=batch.pos,
                        evecs=batch.evecs, evals=batch.evals, mass=batch.mass,
                        grad_index=batch.grad_index,
                        grad_weight=batch.grad_weight)
    monkeypatch.setattr(mesh_former, 'farthest_point_sampling', no_sampling)
    with torch.no_grad():
        assert torch.equal(task.forward(model, batch), sampled)
    # A former without a stride has its meshes prepared without ranks.
    assert not HumanSegTask(progress=False, former_global_stride=1,
                            **SMALL).preprocessing.farthest_point_ranks


def test_former_lays_out_its_global_keys_once_per_forward_pass(monkeypatch):
    # Not in every block: finding the layout reads back to the host (syncs
    # on a GPU), using it does not.
    from benchmarks.op_count import HOST_READS, OpCounter
    layouts, find = [], PaddedSets.of

    def counted(keys, batch=None):
        layouts.append(find(keys, batch))
        return layouts[-1]
    monkeypatch.setattr(mesh_former.PaddedSets, 'of', counted)
    sizes = [7, 11]
    x, pos = torch.randn(sum(sizes), 5), torch.randn(sum(sizes), 3)
    batch = torch.repeat_interleave(torch.arange(2), torch.tensor(sizes))
    model = MetricMeshFormer(5, 3, hidden_channels=16, num_layers=4, heads=2,
                             global_stride=3, local_attention=False)
    model(x, torch.empty(2, 0, dtype=torch.long), batch, pos=pos).sum().backward()
    assert len(layouts) == 1
    h = torch.randn(sum(sizes), 16)
    with OpCounter() as counter:
        model.blocks[0]._global(h, batch, layouts[0])
    assert not any(counter.ops[name] for name in HOST_READS
                   if name != '_local_scalar_dense')  # no boolean selection
    assert counter.ops['index'] == 2  # the keys' rows and the unpadding


def test_former_without_local_attention_does_not_read_the_mesh_edges():
    torch.manual_seed(0)
    x = torch.randn(12, 5)
    ring = torch.stack([torch.arange(12), torch.arange(12).roll(1)])
    other = torch.stack([torch.arange(12), torch.arange(12).roll(5)])
    for local in (True, False):
        model = MetricMeshFormer(5, 3, hidden_channels=16, heads=2,
                                 num_layers=2, local_attention=local)
        assert (model.blocks[0].local is not None) == local
        changed = not torch.allclose(model(x, ring), model(x, other))
        assert changed == local
    # The global step alone: the output is the same for any edges.
    assert not any('local' in name for name, _ in model.named_parameters())


def test_former_global_attention_measures_at_the_head_width():
    # MetricMultiheadAttention's default metric width is one less than the
    # head width; the former keeps the head width, which its results and
    # checkpoints were made with (a checkpoint of before loads).
    model = MetricMeshFormer(5, 3, MetricMeshFormerConfig(
        hidden_channels=16, heads=2, num_layers=1))
    attention = model.blocks[0].global_attention
    assert attention.metric_channels == 8
    assert attention.query_map.out.weight.shape == (16, 16)


def test_former_config_holds_the_architecture_and_no_data_set_defaults():
    config = MetricMeshFormerConfig(hidden_channels=16, heads=2, num_layers=1)
    model = MetricMeshFormer(5, 3, config, global_stride=2)
    assert model.config == MetricMeshFormerConfig(
        hidden_channels=16, heads=2, num_layers=1, global_stride=2)
    assert len(model.blocks) == 1 and model.lin_out.out_channels == 3
    with pytest.raises(TypeError, match='out_channels'):
        MetricMeshFormer(16)  # the classes are the data set's to say
    with pytest.raises(TypeError, match="'config' must be a MetricMeshFormerConfig"):
        MetricMeshFormer(5, 16, 3)
    with pytest.raises(TypeError, match=r"unknown arguments \['hidden'\]"):
        MetricMeshFormer(5, 3, hidden=16)
    with pytest.raises(ValueError, match=r"'hidden_channels' \(128\) must be "
                       r"divisible by 'heads' \(3\)"):
        MetricMeshFormerConfig(heads=3)
    with pytest.raises(ValueError, match=r"'dropout' must be in \[0, 1\)"):
        MetricMeshFormerConfig(dropout=1.0)
    with pytest.raises(ValueError, match="'num_layers' must be a positive"):
        MetricMeshFormerConfig(num_layers=0)


@pytest.mark.parametrize('attention,diffusion,gradients', [
    ('metric', False, False), ('gat', False, False),
    ('metricformer', False, False), ('metricformer', True, False),
    ('metricformer', True, True)])
def test_short_training_run_loss_falls(synthetic_root, attention, diffusion,
                                       gradients):
    task = HumanSegTask(epochs=6, progress=False, processed_dir=str(synthetic_root),
                        former_hidden_channels=32, former_num_layers=2,
                        former_heads=2, former_dropout=0.0,
                        former_diffusion=diffusion,
                        former_gradients=gradients, lr=1e-2, **SMALL)
    mesh = task.meshes('train')[0]
    if diffusion:
        assert mesh.evecs.shape == (mesh.num_nodes, SMALL['k'])
        assert mesh.evals.shape == (1, SMALL['k'])
    # Gradient operators: a diagonal and one entry per directed edge.
    assert ('grad_index' in mesh) == gradients
    if gradients:
        assert mesh.grad_weight.shape == (mesh.num_nodes + mesh.num_edges, 2)
    result = task.run(attention, seed=0)
    losses = [row['train_loss'] for row in result['history']]
    assert losses[-1] < 0.8 * losses[0]
    final = result['final']
    assert 0 <= final['test_face_acc'] <= 1
    assert len(final['confusion']) == 8 and len(final['class_acc']) == 8


#: A small DiffusionNet on the tiny meshes.
SMALL_DIFFUSIONNET = dict(diffusionnet_hidden_channels=16,
                          diffusionnet_num_layers=2, diffusionnet_dropout=0.0)


def test_diffusionnet_trains_with_its_step_schedule(synthetic_root):
    task = HumanSegTask(epochs=6, progress=False,
                        processed_dir=str(synthetic_root), lr=1e-2,
                        **SMALL_DIFFUSIONNET, **SMALL)
    model, trainer = task.fit('diffusionnet', seed=0)
    losses = [row['train_loss'] for row in trainer.history]
    assert losses[-1] < 0.8 * losses[0]
    assert len(model.blocks) == 2 and model.blocks[0].mlp[0].out_channels == 16
    # Its paper's recipe: halved every 50 epochs; the former's: cosine to
    # zero over the epochs; the IPN's: none.
    lrs = {}
    for attention in ('diffusionnet', 'metricformer', 'metric'):
        optimizer = torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=1.0)
        schedule = HumanSegTask(epochs=100, **SMALL).schedule(attention, optimizer)
        lrs[attention] = []
        for _ in range(100):
            optimizer.step()
            if schedule is not None:
                schedule.step()
            lrs[attention].append(optimizer.param_groups[0]['lr'])
    assert lrs['diffusionnet'][48:51] == [1.0, 0.5, 0.5]
    assert lrs['diffusionnet'][-1] == 0.25
    assert lrs['metricformer'][49] == pytest.approx(0.5)
    assert lrs['metricformer'][-1] == pytest.approx(0.0, abs=1e-12)
    assert set(lrs['metric']) == {1.0}
    with pytest.raises(ValueError, match="'diffusionnet' reads the meshes' "
                       "eigenpairs"):
        HumanSegTask(former_diffusion=False, **SMALL).build_model('diffusionnet')


def test_diffusionnet_is_selectable_from_the_command_line(synthetic_root,
                                                          tmp_path):
    out = tmp_path / 'experiment'
    options = [arg for key, value in SMALL_DIFFUSIONNET.items()
               for arg in ('-o', f'{key}={value}')]
    assert main(['experiment', 'human_seg', '--attention', 'diffusionnet',
                 '--seeds', '1', '--epochs', '1', '--out', str(out),
                 '--no-progress', *cli_options(synthetic_root), *options]) == 0
    record = json.loads((out / 'runs' / 'diffusionnet-seed0.json').read_text())
    assert record['status'] == 'ok'
    assert record['task_config']['diffusionnet_hidden_channels'] == 16
    assert 0 <= record['final']['test_face_acc'] <= 1


def test_xyz_inputs_are_rotated_for_training(synthetic_root):
    task = HumanSegTask(progress=False, processed_dir=str(synthetic_root),
                        features='xyz', **SMALL)
    batch = Batch.from_data_list(list(task.meshes('train')[:2]))
    torch.manual_seed(0)
    rotated = task.inputs(batch, augment=True)
    assert torch.equal(task.inputs(batch), batch.pos)
    assert not torch.allclose(rotated, batch.pos)
    # A rotation per mesh: norms are kept.
    torch.testing.assert_close(rotated.norm(dim=1), batch.pos.norm(dim=1))


def test_training_meshes_are_drawn_from_their_perturbed_copies(synthetic_root):
    task = HumanSegTask(epochs=1, progress=False,
                        processed_dir=str(synthetic_root),
                        **small(augment_copies=1,
                                augment_perturbations='decimation,jitter'))
    train = task.meshes('train')
    augmented = task.augmented(train)
    assert len(augmented) == len(train) and len(augmented.sources) == 3
    torch.manual_seed(0)
    face_counts = {augmented[0].face.size(1) for _ in range(30)}
    assert train[0].face.size(1) in face_counts and len(face_counts) == 2
    assert 'source_face' not in augmented[0]  # only what all meshes hold
    assert (Path(train.processed_root) / 'augmentation').is_dir()
    _, trainer = task.fit('metric', seed=0)
    assert np.isfinite(trainer.history[-1]['train_loss'])
    # Two copies of each random perturbation, one of loop subdivision (which
    # draws nothing: a second copy would be the same mesh).
    twice = HumanSegTask(progress=False, processed_dir=str(synthetic_root),
                         **small(augment_copies=2,
                                 augment_perturbations='subdivision,jitter'))
    sources = twice.augmented(twice.meshes('train')).sources
    assert len(sources) == 4
    assert [copy.perturbation for copy in sources[1:]] == [
        'subdivision', 'jitter', 'jitter']
    with pytest.raises(ValueError, match="'augment_perturbations' must name"):
        HumanSegTask(augment_perturbations='twist')


def test_mesh_smoothing_gives_every_mesh_the_operators_of_its_smoothed_surface(
        synthetic_root):
    task = HumanSegTask(progress=False, processed_dir=str(synthetic_root),
                        **small(mesh_smoothing=2))
    mesh = task.meshes('train')[0]
    plain = HumanSegTask(progress=False, processed_dir=str(synthetic_root),
                         **SMALL)
    assert torch.equal(mesh.pos, plain.meshes('train')[0].pos)  # pos kept
    face = mesh.face.t().numpy()
    expected = MeshPreprocessing(
        32, 16, task.spectral_basis, task.gradients).operators(
            taubin_smoothing(mesh.pos.double().numpy(), face, 2), face)
    for key, value in expected.items():
        torch.testing.assert_close(mesh[key], value, msg=key)
    assert not torch.allclose(mesh.hks, plain.meshes('train')[0].hks, rtol=1e-3)
    # A mesh file given to predict is processed the same way (its positions
    # normalised anew: equal up to float32 round-off, eigenvectors up to sign).
    prepare = task.segmenter(task.build_model('metric')).prepare
    prepared = prepare(mesh.pos.numpy(), face, 'file.obj')
    for key in ('hks', 'mass'):
        torch.testing.assert_close(prepared[key], expected[key], rtol=1e-4,
                                   atol=1e-6, msg=key)
    unsmoothed = plain.segmenter(plain.build_model('metric')).prepare(
        mesh.pos.numpy(), face, 'file.obj')
    assert not torch.allclose(prepared.hks, unsmoothed.hks, rtol=1e-3)
    with pytest.raises(ValueError, match='mesh_smoothing'):
        HumanSegTask(**small(mesh_smoothing=-1))


def test_train_resume_evaluate_predict_commands(synthetic_root, tmp_path, capsys):
    options = cli_options(synthetic_root)
    run = tmp_path / 'run'
    assert main(['train', '--attention', 'metric', '--epochs', '2', '--out',
                 str(run), '--no-progress', *options]) == 0
    assert main(['train', '--attention', 'metric', '--epochs', '3', '--out',
                 str(run), '--no-progress', '--resume', *options]) == 0
    rows = json.loads((run / 'metrics.json').read_text())
    assert [r['epoch'] for r in rows] == [1, 2, 3]
    assert (run / 'segmentation.png').stat().st_size > 0

    assert main(['evaluate', str(run)]) == 0
    result = json.loads((run / 'evaluation-test.json').read_text())
    assert result['face_acc'] == pytest.approx(rows[-1]['test_face_acc'])
    assert 'face_acc' in capsys.readouterr().out

    mesh = trimesh.creation.capsule(height=1.0, radius=0.3, count=[12, 12])
    mesh_path = tmp_path / 'capsule.obj'
    mesh.export(mesh_path)
    assert main(['predict', str(run), str(mesh_path), '--out',
                 str(tmp_path / 'out')]) == 0
    labels = np.loadtxt(tmp_path / 'out' / 'capsule.txt', dtype=int)
    assert labels.shape == (len(mesh.faces),) and labels.max() < 8
    colored = trimesh.load(tmp_path / 'out' / 'capsule.ply', process=False)
    assert len(colored.faces) == len(mesh.faces)
    np.testing.assert_array_equal(colored.visual.face_colors,
                                  label_colors(labels))
    assert (tmp_path / 'out' / 'capsule.png').stat().st_size > 0


#: The options recorded (config.json) for the runs behind the reported human_seg
#: numbers and the shipped model: the recipe.
RECIPE = dict(augment_copies=1, batch_size=1, mesh_smoothing=2,
              val_fraction=0.1, weight_decay=0,
              augment_perturbations='subdivision,decimation,anisotropic_scaling,'
                                    'jitter')


def test_the_defaults_are_the_recipe_of_the_reported_runs():
    """``train human_seg`` with no -o trains the reported recipe: the same
    recorded settings, the former, 200 epochs."""
    assert HumanSegTask().recorded_config() == HumanSegTask(
        **RECIPE).recorded_config()
    assert HumanSegTask().recorded_config()['epochs'] == 200
    assert HumanSegTask.default_attentions[0] == 'metricformer'


def test_human_seg_task_is_registered():
    assert TASKS['human_seg'] is HumanSegTask
    with pytest.raises(ValueError, match='Unknown human_seg options'):
        HumanSegTask(hiden=3)
    task = HumanSegTask(val_fraction=0.25)
    assert task.eval_split == 'val' and task.final_metric == 'test_face_acc'
    assert HumanSegTask(val_fraction=0.0).eval_split == 'test'


def test_predict_names_outputs_apart_and_goes_on_after_a_bad_mesh(
        trained_run, tmp_path, capsys):
    sphere = trimesh.creation.icosphere(subdivisions=3)
    meshes = [tmp_path / 'a.obj', tmp_path / 'bad.obj', tmp_path / 'a.stl']
    sphere.export(meshes[0])
    meshes[1].write_text('v 0 0 0\n')  # no faces
    sphere.export(meshes[2])
    out = tmp_path / 'out'
    assert main(['predict', str(trained_run), *map(str, meshes),
                 '--out', str(out)]) == 1
    err = capsys.readouterr().err
    assert 'bad.obj: has no triangle faces' in err and 'Traceback' not in err
    labels = {ext: np.loadtxt(out / f'a-{ext}.txt', dtype=int)
              for ext in ('obj', 'stl')}
    assert labels['obj'].shape == labels['stl'].shape == (len(sphere.faces),)
    # The .stl is read as the same connected sphere, not a triangle soup.
    assert (labels['obj'] == labels['stl']).mean() > 0.95
    assert sorted(path.name for path in out.iterdir()) == [
        f'a-{ext}.{kind}' for ext in ('obj', 'stl') for kind in ('ply', 'png', 'txt')]


def test_cli_errors_are_one_line_unless_debug(tmp_path, capsys):
    missing = tmp_path / 'no-run'
    assert main(['evaluate', str(missing)]) == 1
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and 'Traceback' not in err
    assert f"'{missing}' is no run folder of train (no config.json)" in err
    with pytest.raises(FileNotFoundError, match='no config.json'):
        main(['evaluate', str(missing), '--debug'])


def folder_contents(folder) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(folder.iterdir())}


def test_invalid_resume_changes_nothing_in_the_run_folder(synthetic_root, tmp_path,
                                                          capsys):
    run = tmp_path / 'run'
    train = ['train', '--attention', 'metricformer', '--out', str(run),
             '--no-progress', *cli_options(synthetic_root), '-o',
             'former_hidden_channels=16', '-o', 'former_num_layers=1',
             '-o', 'former_heads=2']
    assert main([*train, '--epochs', '2']) == 0
    before = folder_contents(run)
    capsys.readouterr()
    # The cosine schedule reached lr 0 at epoch 2; more epochs would raise it.
    assert main([*train, '--epochs', '3', '--resume']) == 1
    assert 'cosine learning-rate schedule ends at epoch 2' in capsys.readouterr().err
    # Another model than the checkpoint's.
    assert main([*train, '--epochs', '2', '--resume', '-o',
                 'former_hidden_channels=8']) == 1
    assert 'does not fit the model' in capsys.readouterr().err
    assert folder_contents(run) == before
    assert main(['evaluate', str(run)]) == 0


def test_a_run_folder_in_use_is_refused(trained_run, synthetic_root, capsys):
    from pyg_metric_attn.utils.io import locked_folder
    before = folder_contents(trained_run)
    with locked_folder(trained_run):  # as another train process would
        assert main(['train', '--attention', 'metric', '--epochs', '1',
                     '--resume', '--out', str(trained_run),
                     *cli_options(synthetic_root)]) == 1
    assert f"'{trained_run}' is in use by another process" in capsys.readouterr().err
    assert folder_contents(trained_run) == before


def test_train_in_two_processes_under_torchrun(synthetic_root, tmp_path):
    """``torchrun --nproc_per_node=2 -m pyg_metric_attn.cli train``: each
    rank trains on one of the two training meshes and evaluates one of the
    two validation meshes; the metrics rank 0 logs are those of all meshes
    (one process evaluating the checkpoint gets the same)."""
    run = tmp_path / 'run'
    former = ['-o', 'former_hidden_channels=16', '-o', 'former_num_layers=1',
              '-o', 'former_heads=2']
    repo = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONPATH=os.pathsep.join(
        [repo, *filter(None, [os.environ.get('PYTHONPATH')])]))
    result = subprocess.run(
        [sys.executable, '-m', 'torch.distributed.run', '--standalone',
         '--nproc_per_node=2', '-m', 'pyg_metric_attn.cli', 'train',
         '--attention', 'metricformer', '--epochs', '2', '--out', str(run),
         '--no-progress', *cli_options(synthetic_root), *former,
         '-o', 'val_fraction=0.5'],
        env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count('checkpoints, metrics, segmentation.png') == 1
    rows = json.loads((run / 'metrics.json').read_text())
    assert [row['epoch'] for row in rows] == [1, 2]
    assert len(load_verified(run / 'last.pt')['rng_per_rank']) == 2

    task = HumanSegTask(processed_dir=str(synthetic_root),
                        former_hidden_channels=16, former_num_layers=1,
                        former_heads=2, **small(val_fraction=0.5))
    model = task.build_model('metricformer')
    load_best_model(model, run)
    evaluation = task.meshes('val')
    assert len(evaluation) == 2
    alone = task.evaluate(model, evaluation).compute('val_')
    assert alone['val_face_acc'] == rows[-1]['val_face_acc']
    assert alone['val_loss'] == pytest.approx(rows[-1]['val_loss'], rel=1e-5)


def test_segmentation_meter_merges_shares_as_one_pass():
    g = torch.Generator().manual_seed(0)
    meshes = []
    for faces, edges in ((5, 6), (7, 9), (4, 5)):
        meshes.append(Data(
            face=torch.randint(0, 6, (3, faces), generator=g),
            y=torch.randint(0, 8, (faces,), generator=g), num_nodes=6,
            edge_label_index=torch.randint(0, 6, (2, edges), generator=g),
            edge_label=torch.randint(0, 8, (edges,), generator=g),
            edge_label_soft=torch.rand(edges, 8, generator=g) < 0.3,
            edge_label_weight=torch.full((edges,), 1 / edges)))
    logits = [torch.randn(6, 8, generator=g) for _ in meshes]
    whole, parts = SegmentationMeter(8), [SegmentationMeter(8), SegmentationMeter(8)]
    for index, (mesh, logit) in enumerate(zip(meshes, logits, strict=True)):
        batch = Batch.from_data_list([mesh])
        whole.update(logit, batch, loss=torch.tensor(0.5 + index))
        parts[index % 2].update(logit, batch, loss=torch.tensor(0.5 + index))
    merged = SegmentationMeter(8)
    for part in parts:
        merged.merge(part)
    assert merged.compute().keys() == {'face_acc', 'loss', 'edge_acc',
                                       'soft_edge_acc'}
    assert merged.compute() == pytest.approx(whole.compute())
    assert merged.details()['confusion'] == whole.details()['confusion']
    np.testing.assert_array_equal(merged.details()['class_acc'],
                                  whole.details()['class_acc'])  # NaN: no face


def test_prediction_png_legend_fits_the_figure(monkeypatch, tmp_path):
    saved = []
    save = Figure.savefig

    def keep(figure, *args, **kwargs):
        saved.append(figure)
        return save(figure, *args, **kwargs)

    monkeypatch.setattr(Figure, 'savefig', keep)
    sphere = trimesh.creation.icosphere(subdivisions=1)
    labels = np.arange(len(sphere.faces)) % len(BODY_PARTS)
    render_segmentations(tmp_path / 'one.png', sphere.vertices, sphere.faces,
                         [labels], ['prediction'], BODY_PARTS)
    (figure,) = saved
    (legend,) = figure.legends
    box = legend.get_window_extent()
    assert 0 <= box.x0 and box.x1 <= figure.bbox.x1
    assert 0 <= box.y0
    assert len(legend.get_texts()) == len(BODY_PARTS)


def test_label_colors_mark_faces_black():
    labels = np.array([0, 1, 2, 3])
    colors = label_colors(labels, marked=np.array([False, True, False, True]))
    np.testing.assert_array_equal(colors[[1, 3]], [MARK_COLOR, MARK_COLOR])
    np.testing.assert_array_equal(colors[[0, 2]], label_colors(labels)[[0, 2]])
    assert not (label_colors(np.arange(10))[:, :3] == 0).all(axis=1).any()
    with pytest.raises(ValueError, match="one flag per label"):
        label_colors(labels, marked=np.array([True]))


def test_rendered_segmentations_draw_marked_faces_black(tmp_path):
    from matplotlib.image import imread

    sphere = trimesh.creation.icosphere(subdivisions=1)
    labels = np.arange(len(sphere.faces)) % len(BODY_PARTS)
    half = np.arange(len(sphere.faces)) % 2 == 0
    for name, marked in (('plain', None), ('marked', [half])):
        render_segmentations(tmp_path / f'{name}.png', sphere.vertices,
                             sphere.faces, [labels], ['prediction'],
                             marked=marked)
    black = {name: int((imread(tmp_path / f'{name}.png')[..., :3] == 0)
                       .all(axis=-1).sum()) for name in ('plain', 'marked')}
    # the title's text is black too: the marked faces add tens of thousands
    assert black['marked'] > 100 * max(black['plain'], 1)
    with pytest.raises(ValueError, match='one face mask'):
        render_segmentations(tmp_path / 'bad.png', sphere.vertices,
                             sphere.faces, [labels], ['prediction'],
                             marked=half)


def test_importing_the_plotting_modules_keeps_the_matplotlib_backend(monkeypatch):
    import importlib

    import matplotlib

    import pyg_metric_attn.experiments.report as report
    import pyg_metric_attn.visualization as visualization
    chosen = []
    monkeypatch.setattr(matplotlib, 'use', lambda *args, **kwargs:
                        chosen.append(args))
    for module in (visualization, report):
        importlib.reload(module)
    assert chosen == []


def test_segmentation_meter_keeps_a_loss_of_zero():
    face = torch.tensor([[0, 1, 2]]).t()
    batch = Batch.from_data_list([Data(face=face, y=torch.tensor([0]),
                                       num_nodes=3)])
    meter = SegmentationMeter(2)
    meter.update(torch.tensor([[5.0, 0], [5, 0], [5, 0]]), batch,
                 loss=torch.tensor(0.0))
    assert meter.compute() == {'face_acc': 1.0, 'loss': 0.0}
    without = SegmentationMeter(2)
    without.update(torch.zeros(3, 2), batch)
    assert 'loss' not in without.compute()


def test_synthetic_data_go_to_the_data_folder_and_are_named(tmp_path, monkeypatch,
                                                          capsys):
    """Without --root the humanoids go to $PYG_METRIC_ATTN_DATA (default
    ~/.cache/pyg-metric-attn) or --processed-dir, never to the working
    directory, and the task says where."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv('PYG_METRIC_ATTN_DATA', str(tmp_path / 'data'))
    HumanSegTask(progress=False, synthetic_train=1, synthetic_test=1,
                 num_workers=1, k=32, val_fraction=0.0).datasets()
    folder = tmp_path / 'data' / 'synthetic_humans'
    assert list(folder.rglob('train_1_seed0.pt')), list(tmp_path.rglob('*'))
    assert not (tmp_path / 'datasets').exists()
    assert f'synthetic humanoids in {folder}' in capsys.readouterr().out

    assert HumanSegTask(processed_dir='elsewhere').synthetic_root == Path(
        'elsewhere')
    monkeypatch.delenv('PYG_METRIC_ATTN_DATA')
    monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
    assert HumanSegTask().synthetic_root == (tmp_path / 'cache' / 'pyg-metric-attn'
                                             / 'synthetic_humans')
    monkeypatch.delenv('XDG_CACHE_HOME')
    monkeypatch.setenv('HOME', str(tmp_path / 'home'))
    assert HumanSegTask().synthetic_root == (tmp_path / 'home' / '.cache'
                                             / 'pyg-metric-attn' / 'synthetic_humans')




def test_run_folders_of_earlier_config_versions_load_with_their_defaults(
        trained_run, tmp_path, capsys):
    """A run records the options it was given and its config version; one of
    version 1 (before the recipe became the default) is rebuilt with the
    defaults of then, one with a retired option is refused by name, one of
    a newer version too."""
    from pyg_metric_attn.experiments.run_folder import load_run

    config = json.loads((trained_run / 'config.json').read_text())
    assert config['config_version'] == HumanSegTask.config_version == 2
    old = tmp_path / 'old'
    old.mkdir()
    for path in trained_run.glob('*.pt'):
        (old / path.name).write_bytes(path.read_bytes())
    recorded = {key: value for key, value in config['options'].items()
                if key not in ('augment_copies', 'mesh_smoothing', 'val_fraction')}
    (old / 'config.json').write_text(json.dumps(
        {**{k: v for k, v in config.items() if k != 'config_version'},
         'options': recorded}))
    task, _, _ = load_run(old, 'human_seg', {})
    c = task.config
    assert (c.weight_decay, c.augment_copies, c.mesh_smoothing, c.val_fraction,
            c.batch_size) == (1e-4, 0, 0, 0.0, SMALL['batch_size'])
    assert c.augment_perturbations == 'decimation,anisotropic_scaling,jitter'
    (old / 'config.json').write_text(json.dumps(
        {**config, 'config_version': 1,
         'options': {**recorded, 'corner_loss': 4.0, 'label_smoothing': 0.1}}))
    assert main(['evaluate', str(old)]) == 1
    assert (f"'{old}' was trained with options that have left pyg-metric-attn: "
            f"corner_loss (last in c539c4e), label_smoothing (last in c539c4e); "
            f"check out that commit") in capsys.readouterr().err
    (old / 'config.json').write_text(json.dumps({**config, 'config_version': 3}))
    with pytest.raises(ValueError, match='written by a newer pyg-metric-attn '
                       r'\(config version 3; this one reads up to 2\)'):
        load_run(old, 'human_seg', {})
