"""Shipped models: written and read back with their card, the weights checked
against the card's SHA-256, no network; any mesh file of a surface gets a
prediction, a mesh the operators are not made for a one-line error; the
``predict`` command without a run folder uses the shipped model."""
from __future__ import annotations

import json
import socket

import numpy as np
import pytest
import torch
import trimesh

import pyg_metric_attn.pretrained.card as card_module
from pyg_metric_attn.cli import main
from pyg_metric_attn.datasets import BODY_PARTS, mesh_data
from pyg_metric_attn.geometry import MeshError, check_surface
from pyg_metric_attn.nn.models import MetricMeshFormer, MetricMeshFormerConfig
from pyg_metric_attn.pretrained import (
    MeshSegmenter,
    load_pretrained,
    read_card,
    write_pretrained,
)
from pyg_metric_attn.training.segmentation import face_logits
from pyg_metric_attn.transforms import MeshPreprocessing
from pyg_metric_attn.utils.io import CorruptFileError

pytestmark = pytest.mark.usefixtures('one_thread')

#: A small former with every input the shipped one reads.
CONFIG = MetricMeshFormerConfig(hidden_channels=16, num_layers=1, heads=2,
                                global_stride=4, diffusion=True, gradients=True)
PREPROCESSING = MeshPreprocessing(16, 16, 16, True, smoothing=2,
                                  farthest_point_ranks=True)


@pytest.fixture(scope='module')
def shipped(tmp_path_factory):
    """``(folder, model)``: a small former written as the shipped model
    'human_seg' into a folder of its own."""
    folder = tmp_path_factory.mktemp('pretrained')
    torch.manual_seed(0)
    model = MetricMeshFormer(16, len(BODY_PARTS), CONFIG).eval()
    with torch.no_grad():  # inputs centred on a capsule's: several parts
        hks = PREPROCESSING(mesh_data(capsule().vertices, capsule().faces,
                                      'capsule')).hks
        model.lin_in.weight.normal_(0, 10)
        model.lin_in.bias.copy_(-model.lin_in.weight @ hks.mean(dim=0))
    write_pretrained('human_seg', model, PREPROCESSING, BODY_PARTS, 'hks', folder,
                     metrics={'test_face_acc': 0.5}, training={'seed': 0})
    return folder, model


def capsule() -> trimesh.Trimesh:
    return trimesh.creation.capsule(height=1.0, radius=0.3, count=[12, 12])


def test_a_shipped_model_reads_back_as_written_without_the_network(
        shipped, monkeypatch):
    folder, model = shipped
    card = read_card('human_seg', folder)
    assert card['sha256'] == card_module.sha256((folder / 'human_seg.pt').read_bytes())
    assert card['model']['config']['hidden_channels'] == 16
    assert card['preprocessing'] == {**PREPROCESSING.settings, 'version': 2}

    def no_network(*args, **kwargs):
        raise AssertionError('a shipped model touched the network')
    monkeypatch.setattr(socket, 'socket', no_network)
    segmenter = load_pretrained('human_seg', folder)
    assert not segmenter.training and segmenter.classes == BODY_PARTS
    assert segmenter.card['metrics'] == {'test_face_acc': 0.5}
    assert segmenter.preprocessing.settings == PREPROCESSING.settings
    for key, value in model.state_dict().items():
        assert torch.equal(segmenter.model.state_dict()[key], value), key
    # Its labels are the model's own on the preprocessed mesh.
    mesh = capsule()
    labels = segmenter.segment(mesh.vertices, mesh.faces)
    data = PREPROCESSING(mesh_data(mesh.vertices, mesh.faces, 'capsule'))
    with torch.no_grad():
        logits = model(data.hks, data.edge_index, evecs=data.evecs,
                       evals=data.evals, mass=data.mass,
                       grad_index=data.grad_index, grad_weight=data.grad_weight,
                       farthest_point_rank=data.farthest_point_rank)
    expected = face_logits(logits, data.face).argmax(-1)
    assert labels.shape == (len(mesh.faces),)
    assert torch.equal(labels, expected)
    assert len(set(labels.tolist())) > 1  # a labelling, not one class
    assert 'test face accuracy 50.00%' in segmenter.description


def test_damaged_or_foreign_files_are_refused(shipped, tmp_path):
    folder, _ = shipped
    for name in ('human_seg.pt', 'human_seg.json'):
        (tmp_path / name).write_bytes((folder / name).read_bytes())
    weights = bytearray((tmp_path / 'human_seg.pt').read_bytes())
    weights[-10] ^= 1
    (tmp_path / 'human_seg.pt').write_bytes(bytes(weights))
    with pytest.raises(CorruptFileError, match='not the file its card describes'):
        load_pretrained('human_seg', tmp_path)
    (tmp_path / 'human_seg.pt').unlink()
    with pytest.raises(FileNotFoundError, match="is missing: reinstall"):
        load_pretrained('human_seg', tmp_path)
    card = json.loads((tmp_path / 'human_seg.json').read_text())
    (tmp_path / 'human_seg.json').write_text(json.dumps({**card,
                                                         'format_version': 2}))
    with pytest.raises(ValueError, match='card of format 2; this pyg-metric-attn '
                       'reads format 1'):
        load_pretrained('human_seg', tmp_path)
    with pytest.raises(FileNotFoundError, match=r"No shipped model 'faces' in .*"
                       r"\(shipped: \['human_seg'\]\)"):
        load_pretrained('faces', tmp_path)


def test_any_file_format_scale_and_pose_of_a_surface_gets_a_prediction(
        shipped, tmp_path):
    folder, _ = shipped
    segmenter = load_pretrained('human_seg', folder)
    mesh = capsule()
    expected = segmenter.segment(mesh.vertices, mesh.faces)
    rotation = trimesh.transformations.random_rotation_matrix(
        rand=np.random.default_rng(0).random(3))
    moved = mesh.copy()
    moved.apply_transform(rotation)
    moved.apply_scale(37.0)
    paths = []
    for suffix in ('obj', 'ply', 'off', 'stl'):
        paths.append(tmp_path / f'moved.{suffix}')
        moved.export(paths[-1])
    outcomes = dict(segmenter.predict_files(paths, tmp_path / 'out'))
    assert not any(isinstance(outcome, Exception) for outcome in outcomes.values())
    for suffix in ('obj', 'ply', 'off', 'stl'):
        labels = np.loadtxt(tmp_path / 'out' / f'moved-{suffix}.txt', dtype=int)
        # HKS, operators and farthest points: the pose and size do not count.
        assert (labels == expected.numpy()).mean() > 0.99, suffix
        assert (tmp_path / 'out' / f'moved-{suffix}.png').stat().st_size > 0
    # A finer meshing of the same surface is read too.
    fine = mesh.subdivide()
    assert segmenter.segment(fine.vertices, fine.faces).shape == (len(fine.faces),)


def two_tetrahedra() -> tuple[np.ndarray, np.ndarray]:
    tetrahedron = trimesh.creation.box()
    pos = np.concatenate([tetrahedron.vertices, tetrahedron.vertices + 3])
    face = np.concatenate([tetrahedron.faces, tetrahedron.faces + 8])
    return pos, face


@pytest.mark.parametrize('problem,message', [
    ('components', r"2 connected components \(face counts 12, 12\); the model "
                   r"segments one connected surface"),
    ('non-manifold', r'non-manifold: 1 edges are shared by more than two faces '
                     r'\(first: vertices {a}-{b}\)'),
    ('repeated vertex', r'1 degenerate faces \(zero area; first: face 12\)'),
    ('zero area', r'1 degenerate faces \(zero area; first: face 12\)'),
])
def test_a_mesh_the_operators_are_not_made_for_is_named(problem, message,
                                                       shipped):
    box = trimesh.creation.box()
    pos, face = np.asarray(box.vertices, dtype=float), np.asarray(box.faces)
    a, b = sorted(face[0, :2])
    if problem == 'components':
        pos, face = two_tetrahedra()
    elif problem == 'non-manifold':  # a fin on the first edge of face 0
        pos = np.concatenate([pos, [[5.0, 5.0, 5.0]]])
        face = np.concatenate([face, [[a, b, 8]]])
        message = message.format(a=a, b=b)
    elif problem == 'repeated vertex':
        face = np.concatenate([face, [[0, 0, 1]]])
    else:  # three vertices on a line
        pos = np.concatenate([pos, [(pos[0] + pos[1]) / 2]])
        face = np.concatenate([face, [[0, 8, 1]]])
    with pytest.raises(MeshError, match=message):
        check_surface(pos, face, 'mesh.obj')
    segmenter = load_pretrained('human_seg', shipped[0])
    with pytest.raises(MeshError, match=message):
        segmenter.segment(pos, face, 'mesh.obj')
    check_surface(box.vertices, box.faces)  # the box itself is a surface


def test_predict_without_a_run_folder_uses_the_shipped_model(
        shipped, tmp_path, monkeypatch, capsys):
    folder, _ = shipped
    monkeypatch.setattr(card_module, 'PRETRAINED_DIR', folder)
    good, bad = tmp_path / 'capsule.obj', tmp_path / 'two.obj'
    capsule().export(good)
    trimesh.Trimesh(*two_tetrahedra(), process=False).export(bad)
    out = tmp_path / 'out'
    assert main(['predict', 'human_seg', str(good), str(bad), '--out',
                 str(out)]) == 1
    captured = capsys.readouterr()
    assert 'shipped model human_seg: MetricMeshFormer' in captured.out
    assert f'{good} -> {out}/capsule.{{ply,png,txt}}' in captured.out
    assert 'two.obj: 2 connected components' in captured.err
    assert 'Traceback' not in captured.err
    expected = load_pretrained('human_seg', folder).segment(
        capsule().vertices, capsule().faces)
    np.testing.assert_array_equal(np.loadtxt(out / 'capsule.txt', dtype=int),
                                  expected.numpy())
    colored = trimesh.load(out / 'capsule.ply', process=False)
    assert len(colored.faces) == len(capsule().faces)
    assert sorted(p.name for p in out.iterdir()) == [
        'capsule.ply', 'capsule.png', 'capsule.txt']
    # The task name may be left out, as for every command.
    monkeypatch.chdir(tmp_path)
    assert main(['predict', str(good)]) == 0
    assert (tmp_path / 'predictions' / 'capsule.txt').is_file()
    # A path that is neither a run folder nor a file.
    assert main(['predict', str(tmp_path / 'missing')]) == 1
    assert 'is no run folder and no input file' in capsys.readouterr().err


def test_a_segmenter_takes_only_the_inputs_it_knows():
    with pytest.raises(ValueError, match="'features' must be 'hks' or 'xyz'"):
        MeshSegmenter(torch.nn.Identity(), PREPROCESSING, BODY_PARTS, 'normals')
    with pytest.raises(TypeError, match="Linear names no 'mesh_inputs'"):
        MeshSegmenter(torch.nn.Linear(16, 8), PREPROCESSING, BODY_PARTS).segment(
            capsule().vertices, capsule().faces)


def test_a_trained_run_ships_with_the_numbers_of_the_shipped_file(tmp_path):
    """experiments/ship_model writes a run's best checkpoint as the shipped
    model and scores the file it wrote: the card's numbers are those of the
    loaded model on the validation, test and perturbed test meshes."""
    from pyg_metric_attn.experiments import ship_model
    from pyg_metric_attn.experiments.run_folder import load_run
    from pyg_metric_attn.geometry import PERTURBATIONS

    options = dict(processed_dir=tmp_path / 'synthetic', synthetic_train=3,
                   synthetic_test=2, num_workers=1, k=16, augment_copies=0,
                   val_fraction=0.34, former_hidden_channels=8,
                   former_num_layers=1, former_heads=2)
    run = tmp_path / 'run'
    assert main(['train', '--epochs', '2', '--out', str(run), '--no-progress',
                 *[arg for key, value in options.items()
                   for arg in ('-o', f'{key}={value}')]]) == 0
    out = tmp_path / 'shipped'
    out.mkdir()
    assert ship_model.main([str(run), '--commit', 'abc1234', '--draws', '1',
                            '--out', str(out), '--report',
                            str(tmp_path / 'report')]) == 0
    card = read_card('human_seg', out)
    segmenter = load_pretrained('human_seg', out)
    task, model, _ = load_run(run, 'human_seg', {})
    for key, value in model.state_dict().items():  # the best checkpoint
        assert torch.equal(segmenter.model.state_dict()[key], value), key
    readings = {split: task.evaluate_split(model, split)[0]['face_acc']
                for split in ('val', 'test')}
    assert readings['val'] != readings['test']  # so that a mix-up shows
    for split, reading in readings.items():
        assert card['metrics'][f'{split}_face_acc'] == reading
    assert set(card['metrics']['test_perturbed']) == set(PERTURBATIONS)
    report = json.loads((tmp_path / 'report' / 'results.json').read_text())
    rows = {row['perturbation']: row for row in report['runs'][0]['rows']}
    for kind, reading in card['metrics']['test_perturbed'].items():
        assert reading['face_acc'] == rows[kind]['face_acc']
    assert rows['original']['face_acc'] == card['metrics']['test_face_acc']
    assert (tmp_path / 'report' / 'human_seg_robust.png').stat().st_size > 0
    rotation = card['metrics']['test_perturbed']['rotation']
    assert rotation['agreement'] > 0.99 and rotation['seeds'] == [0]
    training = card['training']
    assert training['commit'] == 'abc1234' and training['seed'] == 0
    assert training['epochs'] == 2 and training['attention'] == 'metricformer'
    # No path of the training machine: where the data lie is the user's.
    assert training['command'].startswith(
        "pyg-metric-attn train human_seg --attention metricformer --seed 0 "
        "--epochs 2 -o")
    assert str(tmp_path) not in json.dumps(training)
    assert "-o val_fraction=0.34" in training['command']
    # human_seg keeps the last epoch's model (no metric chooses one).
    assert not (run / 'best.pt').exists() and training['checkpoint_epoch'] == 2
    assert "the model is the last epoch's" in card['data']['split']
    assert card['data']['split'].startswith('3 training meshes: 2 trained on, '
                                            '1 held out for validation')
