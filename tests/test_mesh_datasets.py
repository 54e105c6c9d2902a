"""Mesh data sets: MeshCNN human_seg on real meshes, the original layout on a
generated fixture, MeshFolder, SyntheticHumans, downloads and caches."""
from __future__ import annotations

import urllib.error
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import trimesh
from conftest import shared_dataset
from torch_geometric.loader import DataLoader

import pyg_metric_attn.datasets.human_segmentation as human_segmentation
from pyg_metric_attn.datasets import (
    HumanSegmentation,
    MeshFolder,
    SyntheticHumans,
    majority_label,
)
from pyg_metric_attn.datasets.human_segmentation import MIT_POSES, SHREC_IDS
from pyg_metric_attn.datasets.mesh_dataset import mesh_data
from pyg_metric_attn.datasets.mesh_io import read_labels, read_mesh
from pyg_metric_attn.datasets.synthetic_humans import synthetic_human
from pyg_metric_attn.experiments.tasks.human_seg import HumanSegTask
from pyg_metric_attn.geometry import MeshError, edge_face_counts
from pyg_metric_attn.nn.models import MetricMeshFormerConfig
from pyg_metric_attn.pretrained import MeshSegmenter
from pyg_metric_attn.transforms import MeshPreprocessing

#: Preprocessing with few eigenpairs (quick), by ``k``.
FEW = {k: MeshPreprocessing(k) for k in (8, 16, 32)}
REAL_MESHES = {'train': ['scape__mesh000', 'faust__tr_reg_077',
                         'MIT_animation__meshes_crane__meshes__mesh_0110'],
               'test': ['shrec__5']}


@pytest.fixture(scope='module')
def human_seg_root(tmp_path_factory):
    """A few real meshes of ../shared/datasets/human_seg, linked into a
    writable MeshCNN layout."""
    shared = shared_dataset('human_seg')
    root = tmp_path_factory.mktemp('human_seg')
    for folder in ('train', 'test', 'seg', 'sseg'):
        (root / folder).mkdir()
    for split, names in REAL_MESHES.items():
        for name in names:
            (root / split / f'{name}.obj').symlink_to(shared / split / f'{name}.obj')
            for folder, ext in (('seg', 'eseg'), ('sseg', 'seseg')):
                (root / folder / f'{name}.{ext}').symlink_to(
                    shared / folder / f'{name}.{ext}')
    return root


def test_meshcnn_layout_on_real_meshes(human_seg_root):
    train = HumanSegmentation(str(human_seg_root), 'train', pre_transform=FEW[32],
                              log=False, num_workers=1)
    test = HumanSegmentation(str(human_seg_root), 'test', pre_transform=FEW[32],
                             log=False)
    assert len(train) == 3 and len(test) == 1
    shared = shared_dataset('human_seg')
    for data in [*train, *test]:
        assert data.face.shape == (3, 1500)
        assert data.edge_label_index.shape == (2, 2250)
        assert data.edge_index.shape == (2, 4500)
        assert data.edge_label.shape == (2250,) and data.y.shape == (1500,)
        assert data.edge_label_soft.shape == (2250, 8)
        assert 0 <= int(data.y.min()) and int(data.y.max()) <= 7
        assert data.x.shape == (data.num_nodes, 16)
        assert float(data.edge_label_weight.sum()) == pytest.approx(1.0, abs=1e-5)
        # The hard edge label has a positive soft label (all but 393 of the
        # 897,750 edges of the benchmark, at most 0.27% of a mesh).
        agree = data.edge_label_soft.gather(1, data.edge_label[:, None]).float()
        assert agree.mean() >= 0.997
        # The face labels are the majority of the face's three edge labels,
        # computed here independently from the raw files.
        split = 'test' if data.name.startswith('shrec') else 'train'
        lines = (shared / split / f'{data.name}.obj').read_text().splitlines()
        faces = [[int(i) - 1 for i in line.split()[1:4]] for line in lines
                 if line.startswith('f ')]
        labels = np.loadtxt(shared / 'seg' / f'{data.name}.eseg', dtype=int) - 1
        ids = {}
        for f in faces:
            for i in range(3):
                ids.setdefault(tuple(sorted((f[i], f[(i + 1) % 3]))), len(ids))
        expected = []
        for f in faces:
            votes = [labels[ids[tuple(sorted((f[i], f[(i + 1) % 3])))]]
                     for i in range(3)]
            expected.append(min(set(votes), key=lambda v: (-votes.count(v), v)))
        assert data.y.tolist() == expected
    # The documented 3-way tie (labels 4, 3, 5 -> 0-based 3, 2, 4): smallest.
    crane = next(d for d in train if 'crane' in d.name)
    assert int(crane.y[913]) == 2
    # The vertex order is the file's: vertex 0 is the first 'v' line.
    assert train.num_classes == 8
    batch = next(iter(DataLoader(train, batch_size=3)))
    assert int(batch.edge_label_index.max()) == batch.num_nodes - 1


def test_a_benchmark_file_through_the_preprocessing_equals_the_item(
        human_seg_root, tmp_path, monkeypatch):
    """What ``predict`` (HumanSegTask.predict_files) and the Python API compute
    for a mesh file is the data set's item: every field, bit for bit (here
    with the former's operators), and so are the predicted labels."""
    former = MetricMeshFormerConfig(hidden_channels=8, num_layers=1, heads=2,
                                    global_stride=8, diffusion=True,
                                    gradients=True)
    task = HumanSegTask(root=str(human_seg_root), k=32, num_workers=1,
                        processed_dir=str(tmp_path / 'processed'),
                        former=former, progress=False)
    (item,) = task.meshes('test')
    path = human_seg_root / 'test' / 'shrec__5.obj'
    pos, face = read_mesh(path)
    mesh = task.preprocessing(mesh_data(
        pos, face, 'shrec__5',
        edge_labels=read_labels(human_seg_root / 'seg' / 'shrec__5.eseg') - 1,
        edge_soft_labels=read_labels(human_seg_root / 'sseg' / 'shrec__5.seseg',
                                     float)))
    assert sorted(mesh.keys()) == sorted(item.keys())
    assert {'evals', 'evecs', 'grad_index', 'grad_weight', 'edge_label',
            'edge_label_soft'} <= set(item.keys())
    assert_same_fields(mesh, item, item.keys())

    torch.manual_seed(0)
    model = task.build_model('metricformer')
    predicted = []

    def recorded_predict(segmenter, mesh):
        predicted.append(mesh)
        return predict(segmenter, mesh)

    predict = MeshSegmenter.predict
    monkeypatch.setattr(MeshSegmenter, 'predict', recorded_predict)
    out = tmp_path / 'predicted'
    out.mkdir()
    assert [str(p) for p, _ in task.predict_files(model, [path], out)] == [str(path)]
    (from_file,) = predicted
    labels = {'y', 'edge_label', 'edge_label_soft'}
    assert set(from_file.keys()) == set(item.keys()) - labels
    assert_same_fields(from_file, item, set(from_file.keys()) - {'name'})
    expected = task.predict(model, item)
    assert len(set(expected.tolist())) > 1  # not a constant prediction
    written = (out / 'shrec__5.txt').read_text().split()
    assert written == [str(label) for label in expected.tolist()]


def assert_same_fields(mesh, item, keys):
    """``mesh[key]`` equals ``item[key]`` bit for bit for each key."""
    for key in keys:
        if isinstance(item[key], torch.Tensor):
            assert mesh[key].dtype == item[key].dtype, key
            assert torch.equal(mesh[key], item[key]), key
        else:
            assert mesh[key] == item[key], key


def test_read_only_raw_folder_with_processed_dir(tmp_path):
    shared = shared_dataset('human_seg')
    # Processing the whole shared folder would be slow; pre-filter keeps one.
    dataset = HumanSegmentation(str(shared), 'test', pre_transform=FEW[16], log=False,
                                processed_dir=str(tmp_path / 'processed'),
                                pre_filter=lambda d: d.name == 'shrec__1',
                                num_workers=1)
    assert len(dataset) == 1 and dataset[0].name == 'shrec__1'
    assert not (shared / 'processed').exists()


def test_corrupt_processed_file_is_reprocessed(human_seg_root, tmp_path):
    kwargs = dict(pre_transform=FEW[16], log=False, processed_dir=str(tmp_path))
    first = HumanSegmentation(str(human_seg_root), 'test', **kwargs)
    path = Path(first.processed_paths[0])
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match='Re-processing'):
        again = HumanSegmentation(str(human_seg_root), 'test', **kwargs)
    assert torch.equal(again[0].y, first[0].y)
    assert torch.allclose(again[0].x, first[0].x)


def test_offline_download_says_where_to_put_files(tmp_path, monkeypatch):
    def offline(url, folder, log=True):
        raise urllib.error.URLError('no network')
    monkeypatch.setattr(human_segmentation, 'download_url', offline)
    with pytest.raises(RuntimeError, match=r"put its train/, test/, seg/, sseg/ "
                       r"into '.*empty'"):
        HumanSegmentation(str(tmp_path / 'empty'), log=False)
    with pytest.raises(RuntimeError, match=r'meshes/, segs/'):
        HumanSegmentation(str(tmp_path / 'empty2'), variant='original', log=False)


def test_a_download_without_answer_times_out(tmp_path, silent_server,
                                             monkeypatch):
    monkeypatch.setitem(HumanSegmentation.urls, 'meshcnn',
                        f'{silent_server}/human_seg.tar.gz')
    with pytest.raises(RuntimeError, match=r"no answer within 0\.5 s.*put its "
                       r"train/, test/, seg/, sseg/ into"):
        HumanSegmentation(str(tmp_path), log=False)


def test_present_raw_files_are_never_downloaded(human_seg_root, monkeypatch,
                                                tmp_path):
    def fail(*args, **kwargs):
        raise AssertionError('download attempted')
    monkeypatch.setattr(human_segmentation, 'download_url', fail)
    HumanSegmentation(str(human_seg_root), 'test', pre_transform=FEW[16], log=False,
                      processed_dir=str(tmp_path))


def small_mesh(seed: int):
    """A small closed mesh (a randomly scaled icosphere, 42 vertices)."""
    mesh = trimesh.creation.icosphere(1)
    scale = np.random.default_rng(seed).uniform(0.5, 2.0, size=3)
    return mesh.vertices * scale, mesh.faces


def write_original_layout(root: Path) -> dict[str, list[int]]:
    """DiffusionNet's sig17_seg_benchmark layout with tiny meshes; returns the
    per-face labels written for each mesh (by path below meshes/)."""
    written = {}

    def mesh(relative: str, seed: int, fmt: str = 'off'):
        pos, face = small_mesh(seed)
        path = root / 'meshes' / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        trimesh.Trimesh(pos, face, process=False).export(path, file_type=fmt)
        return len(face)

    def labels(relative: str, values) -> None:
        path = root / 'segs' / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(''.join(f'{v + 1}\n' for v in values))

    seed = 0
    for name in ('FemaleFitA_tri', 'MaleFitB_tri'):
        num_faces = mesh(f'train/adobe/{name}.off', seed)
        values = [(seed + i) % 8 for i in range(num_faces)]
        labels(f'train/adobe/{name}.txt', values)
        written[f'train/adobe/{name}.off'] = values
        seed += 1
    shared_labels = {'faust': 'train/faust/faust_corrected.txt',
                     'scape': 'train/scape/scape_corrected.txt'}
    shared_labels.update({f'MIT_animation/meshes_{pose}/meshes':
                          f'train/mit/mit_{pose}_corrected.txt'
                          for pose in MIT_POSES})
    for folder, label_file in shared_labels.items():
        values = [(seed * 3 + i) % 8 for i in range(80)]
        labels(label_file, values)
        for name in ('mesh_000.obj', 'mesh_001.obj'):
            mesh(f'train/{folder}/{name}', seed, fmt='obj')
            written[f'train/{folder}/{name}'] = values
        seed += 1
    for i in SHREC_IDS:
        name = '12_fix_orientation.off' if i == 12 else f'{i}.off'
        mesh(f'test/shrec/{name}', seed)
        values = [(i + j) % 8 for j in range(80)]
        labels(f'test/shrec/shrec_{i}_full.txt', values)
        written[f'test/shrec/{name}'] = values
        seed += 1
    return written


def test_original_layout_fixture(tmp_path):
    written = write_original_layout(tmp_path)
    train = HumanSegmentation(str(tmp_path), 'train', 'original',
                              pre_transform=FEW[8], log=False, num_workers=1)
    test = HumanSegmentation(str(tmp_path), 'test', 'original',
                             pre_transform=FEW[8], log=False, num_workers=1)
    assert len(train) == 2 + 2 * (2 + len(MIT_POSES)) and len(test) == 18
    assert [d.name for d in test][:3] == ['test/shrec/1.off', 'test/shrec/2.off',
                                         'test/shrec/3.off']
    assert 'test/shrec/12_fix_orientation.off' in [d.name for d in test]
    for data in [*train, *test]:
        assert data.y.tolist() == written[data.name]
        assert data.face.shape == (3, 80) and data.x.shape == (42, 16)
        assert not hasattr(data, 'edge_label')
    # The vertex order of the file is kept: positions are the normalised file's.
    pos, _ = small_mesh(0)
    expected = pos - pos.mean(0)
    expected /= np.linalg.norm(expected, axis=1).max()
    adobe = next(d for d in train if d.name == 'train/adobe/FemaleFitA_tri.off')
    np.testing.assert_allclose(adobe.pos.numpy(), expected, atol=1e-5)


def test_mesh_folder_face_and_vertex_labels(tmp_path):
    pos, face = small_mesh(0)
    trimesh.Trimesh(pos, face, process=False).export(tmp_path / 'a.ply')
    (tmp_path / 'a.txt').write_text(''.join(f'{i % 3 + 1}\n' for i in range(80)))
    sub = tmp_path / 'sub'
    sub.mkdir()
    trimesh.Trimesh(pos, face, process=False).export(sub / 'b.obj')
    vertex_labels = (pos[:, 0] > 0).astype(int) + 1
    (sub / 'b.txt').write_text(''.join(f'{v}\n' for v in vertex_labels))
    vertex = MeshFolder(str(sub), first_label=1, pre_transform=FEW[8], log=False)
    assert vertex[0].vertex_y.tolist() == (vertex_labels - 1).tolist()
    assert vertex[0].y.tolist() == majority_label(vertex_labels[face] - 1).tolist()
    with pytest.raises(ValueError, match=r"different labels \(y vs y, vertex_y\)"):
        MeshFolder(str(tmp_path), first_label=1, pre_transform=FEW[8], log=False)
    (sub / 'b.txt').unlink()
    trimesh.Trimesh(pos, face, process=False).export(sub / 'c.off')
    (sub / 'c.txt').write_text(''.join(f'{i % 5 + 1}\n' for i in range(80)))
    (sub / 'b.txt').write_text(''.join(f'{i % 2 + 1}\n' for i in range(80)))
    dataset = MeshFolder(str(tmp_path), first_label=1, pre_transform=FEW[8], log=False,
                         force_reload=True)
    assert [d.name for d in dataset] == ['a.ply', 'sub/b.obj', 'sub/c.off']
    a, b, c = dataset
    assert a.y.tolist() == [i % 3 for i in range(80)]
    assert c.y.tolist() == [i % 5 for i in range(80)]
    assert a.x.shape == (42, 16)
    (tmp_path / 'sub' / 'c.txt').write_text('1\n2\n')
    with pytest.raises(MeshError, match=r"c\.off: 2 labels for 80 faces"):
        MeshFolder(str(tmp_path), first_label=1, pre_transform=FEW[8], log=False,
                   force_reload=True)


def test_majority_label_tie_goes_to_smallest():
    labels = np.array([[3, 2, 4], [1, 1, 0], [5, 6, 6], [7, 7, 7]])
    assert majority_label(labels).tolist() == [2, 1, 6, 7]


def test_synthetic_humans_properties(tmp_path):
    pos, face, labels = synthetic_human(np.random.default_rng(3))
    assert 1000 <= len(face) <= 3000
    counts = edge_face_counts(face)
    assert (counts == 2).all()  # watertight, edge-manifold
    mesh = trimesh.Trimesh(pos, face, process=False)
    assert mesh.is_watertight and len(mesh.split(only_watertight=False)) == 1
    assert sorted(set(labels.tolist())) == list(range(8))
    # Parts share the surface: some edges join faces of different parts.
    adjacent = labels[mesh.face_adjacency]
    assert (adjacent[:, 0] != adjacent[:, 1]).any()

    dataset = SyntheticHumans(str(tmp_path), 'train', num_meshes=2, seed=5,
                              num_workers=1, pre_transform=FEW[32], log=False)
    test = SyntheticHumans(str(tmp_path), 'test', num_meshes=1, seed=5,
                           num_workers=1, pre_transform=FEW[32], log=False)
    assert len(dataset) == 2 and dataset[0].y.max() == 7
    assert dataset[0].num_nodes != test[0].num_nodes or not torch.equal(
        dataset[0].pos, test[0].pos)
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        again = SyntheticHumans(str(tmp_path / 'again'), 'train', num_meshes=1,
                                seed=5, num_workers=1, pre_transform=FEW[32], log=False)
    assert torch.equal(again[0].pos, dataset[0].pos)  # mesh i depends on i only


def test_stl_triangle_soup_is_merged_into_a_connected_mesh(tmp_path):
    sphere = trimesh.creation.icosphere(subdivisions=3)  # 642 vertices
    sphere.export(tmp_path / 'sphere.stl')
    pos, face = read_mesh(tmp_path / 'sphere.stl')
    assert pos.shape == (642, 3) and face.shape == (1280, 3)
    # Same triangles in the same order (STL stores float32 corners).
    np.testing.assert_allclose(pos[face], sphere.vertices[sphere.faces], atol=1e-6)
