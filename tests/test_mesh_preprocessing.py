"""MeshPreprocessing, the one preprocessing path of the mesh models: its
output against the former path's, the data sets' items against a mesh file
pushed through it, its cache, and the processed folders of the data sets."""
from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
import trimesh
from torch_geometric.data import Batch, Data

from pyg_metric_attn.datasets import MeshFolder, mesh_data
from pyg_metric_attn.datasets.mesh_io import read_labels, read_mesh
from pyg_metric_attn.geometry import MeshError, heat_kernel_signature
from pyg_metric_attn.transforms import MeshPreprocessing
from pyg_metric_attn.utils.point_sets import farthest_point_ranks

pytestmark = pytest.mark.usefixtures('one_thread')

#: The output of the data sets' former preprocessing (``mesh_data`` and
#: ``compute_operators`` as of main at fc9edf1, k=16, hks_count=4,
#: spectral_basis=16, gradients=True) for :func:`bumpy_sphere`; the commit that
#: added MeshPreprocessing tested it equal to that path bit for bit.
FORMER_OUTPUT = Path(__file__).parent / 'data' / 'bumpy_sphere_operators.pt'


def bumpy_sphere(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """An icosphere (162 vertices) with seeded bumps, moved and scaled: no
    symmetric eigenspaces."""
    sphere = trimesh.creation.icosphere(2)
    bumps = np.random.default_rng(seed).uniform(0.9, 1.1,
                                                (len(sphere.vertices), 1))
    return np.asarray(sphere.vertices) * bumps * 3 + 1, np.asarray(sphere.faces)


def raw_data(pos: np.ndarray, face: np.ndarray, name: str = 'mesh') -> Data:
    return Data(pos=torch.from_numpy(pos), face=torch.from_numpy(face.T.copy()),
                name=name)


def assert_equal_data(data: Data, expected: Data) -> None:
    """The same attributes with equal values, dtypes and shapes."""
    assert sorted(data.keys()) == sorted(expected.keys())
    for key in expected.keys():
        value, reference = data[key], expected[key]
        if isinstance(reference, torch.Tensor):
            assert value.dtype == reference.dtype, key
            assert torch.equal(value, reference), key
        else:
            assert value == reference, key


def test_output_equals_the_former_preprocessing():
    former = torch.load(FORMER_OUTPUT)
    out = MeshPreprocessing(16, 4, 16, True)(raw_data(*bumpy_sphere()))
    assert sorted(out.keys()) == sorted(['pos', 'face', 'name', 'edge_index', 'x',
                                         *former.keys() - {'pos', 'edge_index'}])
    for key in ('edge_index', 'grad_index'):  # integers: exactly
        assert torch.equal(out[key], former[key]), key
    for key in former.keys() - {'edge_index', 'grad_index', 'evecs'}:
        assert out[key].dtype == torch.float32
        torch.testing.assert_close(out[key], former[key], rtol=1e-5, atol=1e-6)
    # Eigenvectors are defined up to sign (ARPACK on another BLAS may flip one).
    signs = torch.sign((out.evecs * former['evecs']).sum(0))
    torch.testing.assert_close(out.evecs * signs, former['evecs'], rtol=1e-5,
                               atol=1e-5)
    assert torch.equal(out.x, out.hks)


def test_settings_choose_the_fields_and_shapes():
    pos, face = bumpy_sphere()
    plain = MeshPreprocessing(16, 4)(raw_data(pos, face))
    assert sorted(plain.keys()) == ['edge_index', 'face', 'hks', 'mass', 'name',
                                    'pos', 'x']
    assert plain.hks.shape == (162, 4) and plain.mass.shape == (162,)
    assert plain.edge_index.shape == (2, 2 * 480)
    assert float(plain.pos.norm(dim=1).max()) == pytest.approx(1.0)
    full = MeshPreprocessing(16, 4, 10, True)(raw_data(pos, face))
    assert full.evals.shape == (1, 10) and full.evecs.shape == (162, 10)
    # The first 10 of the 16 eigenpairs; the HKS still from all 16.
    assert torch.equal(full.hks, plain.hks)
    assert full.grad_weight.shape == (162 + 2 * 480, 2)
    assert full.grad_index.shape == (2, 162 + 2 * 480)
    # The input is not changed.
    data = raw_data(pos, face)
    MeshPreprocessing(16, 4)(data)
    assert data.pos.dtype == torch.float64 and 'hks' not in data


def test_farthest_point_ranks_are_kept_with_the_operators(tmp_path):
    pos, face = bumpy_sphere()
    preprocess = MeshPreprocessing(16, 4, farthest_point_ranks=True,
                                   cache_dir=tmp_path)
    data = preprocess(raw_data(pos, face))
    # Of the positions the models see, so a former given them attends to
    # the vertices it would sample from 'pos'.
    assert torch.equal(data.farthest_point_rank, farthest_point_ranks(data.pos))
    assert preprocess.tag == 'v2_k16_hks4_auto_fps'
    assert MeshPreprocessing(16, 4, smoothing=2,
                             farthest_point_ranks=True).tag.endswith('_taubin2_fps')
    assert 'farthest_point_ranks' not in MeshPreprocessing(16, 4).settings
    # From the cache the same.
    again = preprocess(raw_data(pos, face))
    assert torch.equal(again.farthest_point_rank, data.farthest_point_rank)
    plain = MeshPreprocessing(16, 4)(raw_data(pos, face))
    assert 'farthest_point_rank' not in plain
    assert torch.equal(plain.hks, data.hks)


def test_meshes_with_fewer_vertices_than_eigenpairs_collate_with_others():
    preprocess = MeshPreprocessing(16, 4, spectral_basis=16)
    small = trimesh.creation.icosahedron()  # 12 vertices: 12 eigenpairs, not 16
    large = trimesh.creation.icosphere(subdivisions=1)  # 42 vertices
    meshes = [preprocess(raw_data(np.asarray(m.vertices), np.asarray(m.faces)))
              for m in (small, large)]
    batch = Batch.from_data_list(meshes)
    assert batch.evals.shape == (2, 16) and batch.evecs.shape == (54, 16)
    # Padded with zero eigenvectors: they add nothing to a diffusion or HKS.
    assert (meshes[0].evecs[:, 12:] == 0).all()
    evals, evecs = meshes[0].evals[0].double(), meshes[0].evecs.double()
    assert (evals[12:] == evals[11]).all()  # eigenvalues stay sorted
    hks = heat_kernel_signature(evals[:12].numpy(), evecs[:, :12].numpy(), 4)
    np.testing.assert_allclose(meshes[0].hks.numpy(), hks, rtol=1e-4, atol=1e-6)


def test_bad_settings_and_meshes_are_named():
    with pytest.raises(ValueError, match=r"'spectral_basis' must be in \[0, k=8\]"):
        MeshPreprocessing(8, spectral_basis=9)
    with pytest.raises(ValueError, match="Unknown Laplacian 'fancy'"):
        MeshPreprocessing(laplacian='fancy')
    pos, face = bumpy_sphere()
    preprocess = MeshPreprocessing(8)
    bad = pos.copy()
    bad[5, 1] = np.nan
    with pytest.raises(MeshError, match=r"ball\.obj: 1 vertices have NaN.*vertex 5"):
        preprocess(raw_data(bad, face, 'ball.obj'))
    with pytest.raises(MeshError, match=r"ball\.obj: 'face' must have shape "
                       r"\[3, F\], got \[320, 3\]"):
        preprocess(Data(pos=torch.from_numpy(pos), face=torch.from_numpy(face),
                        name='ball.obj'))
    with pytest.raises(MeshError, match="needs 'pos'"):
        preprocess(Data(face=torch.from_numpy(face.T.copy())))
    # A zero-area face (a collapsed triangle): the robust Laplacian.
    collapsed = preprocess(raw_data(pos, np.concatenate([face, [[0, 0, 1]]])))
    assert torch.isfinite(collapsed.hks).all()
    assert repr(preprocess) == ("MeshPreprocessing(k=8, hks_count=16, "
                                "spectral_basis=0, gradients=False, "
                                "laplacian='auto')")
    assert MeshPreprocessing(8, 4, 8, True).tag == 'v2_k8_hks4_auto_basis8_grad'


def test_operator_cache_hit_corruption_and_mismatch(tmp_path, monkeypatch):
    import pyg_metric_attn.transforms.mesh_preprocessing as module

    pos, face = bumpy_sphere()
    preprocess = MeshPreprocessing(9, 4, 9, True, cache_dir=tmp_path)
    first = preprocess(raw_data(pos, face))
    (path,) = tmp_path.rglob('*.pt')
    # An entry holds what the transform attaches, nothing else.
    assert sorted(preprocess.cache.load(path.stem)) == [
        'evals', 'evecs', 'grad_index', 'grad_weight', 'hks', 'mass']

    def fail(*args, **kwargs):
        raise AssertionError('recomputed although cached')
    with monkeypatch.context() as m:
        m.setattr(module, 'eigendecomposition', fail)
        hit = preprocess(raw_data(pos, face))
    assert_equal_data(hit, first)

    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match='checksum'):
        again = preprocess(raw_data(pos, face))
    assert_equal_data(again, first)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # rewritten: now a clean hit
        preprocess(raw_data(pos, face))

    # Other settings, another entry; one filed under the wrong key is not used.
    MeshPreprocessing(9, 4, 0, True, cache_dir=tmp_path)(raw_data(pos, face))
    (other,) = set(tmp_path.rglob('*.pt')) - {path}
    path.write_bytes(other.read_bytes())
    with pytest.warns(UserWarning, match='another mesh'):
        again = preprocess(raw_data(pos, face))
    assert_equal_data(again, first)
    # A moved and scaled copy has the same normalised positions: a hit.
    with monkeypatch.context() as m:
        m.setattr(module, 'eigendecomposition', fail)
        preprocess(raw_data(pos * 2 - 5, face))


def write_meshes(folder: Path, count: int) -> list[Path]:
    """``count`` bumpy spheres with per-face labels."""
    paths = []
    for i in range(count):
        pos, face = bumpy_sphere(i)
        path = folder / f'sphere{i}.obj'
        trimesh.Trimesh(pos, face, process=False).export(path)
        path.with_suffix('.txt').write_text(
            ''.join(f'{(i + f) % 8}\n' for f in range(len(face))))
        paths.append(path)
    return paths


@pytest.mark.slow
def test_a_mesh_file_through_the_transform_equals_the_data_set_item(tmp_path):
    # Eight meshes: the data set preprocesses them in two worker processes.
    paths = write_meshes(tmp_path, 8)
    preprocess = MeshPreprocessing(16, 4, 16, True)
    dataset = MeshFolder(str(tmp_path), pre_transform=preprocess, num_workers=2,
                         log=False)
    assert [data.name for data in dataset] == [path.name for path in paths]
    for path, item in zip(paths, dataset, strict=True):
        pos, face = read_mesh(path)
        mesh = preprocess(mesh_data(pos, face, path.name,
                                    face_labels=read_labels(path.with_suffix('.txt'))))
        assert_equal_data(mesh, item)
        assert sorted(item.keys()) == sorted([
            'pos', 'face', 'name', 'num_nodes', 'edge_index', 'edge_label_index',
            'edge_label_weight', 'y', 'x', 'hks', 'mass', 'evals', 'evecs',
            'grad_index', 'grad_weight'])


def test_settings_keep_their_own_processed_folders(tmp_path):
    write_meshes(tmp_path, 2)
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # no PyG warning about another pre_transform
        for preprocess in (MeshPreprocessing(8, 4), MeshPreprocessing(8, 4, 8),
                           MeshPreprocessing(8, 4)):
            dataset = MeshFolder(str(tmp_path), pre_transform=preprocess,
                                 log=False, num_workers=1)
            assert Path(dataset.processed_dir).name == preprocess.tag
            assert ('evals' in dataset[0]) == bool(preprocess.spectral_basis)
    raw = MeshFolder(str(tmp_path), pre_transform=None, log=False)
    assert Path(raw.processed_dir).name == 'raw' and 'hks' not in raw[0]
    assert raw[0].pos.dtype == torch.float64  # as read
    assert sorted(p.name for p in (tmp_path / 'processed').iterdir()) == [
        'raw', 'v2_k8_hks4_auto', 'v2_k8_hks4_auto_basis8']


def test_processed_files_of_an_older_version_are_named_and_not_read(tmp_path):
    write_meshes(tmp_path, 2)
    processed = tmp_path / 'processed'
    (processed / 'operators' / 'ab').mkdir(parents=True)  # version 1 layout
    (processed / 'meshes_auto0_k8_hks4_auto.pt').write_bytes(b'old')
    (processed / 'v1_k8_hks4_auto').mkdir()
    with pytest.warns(UserWarning, match=r"holds processed files of an older "
                      r"version of pyg_metric_attn \(meshes_auto0_k8_hks4_auto"
                      r"\.pt, v1_k8_hks4_auto, operators\), which are not read"):
        dataset = MeshFolder(str(tmp_path), pre_transform=MeshPreprocessing(8, 4),
                             log=False)
    assert len(dataset) == 2
    assert Path(dataset.processed_paths[0]).parent == processed / 'v2_k8_hks4_auto'


def test_a_pre_transform_for_worker_processes_must_be_picklable(tmp_path):
    write_meshes(tmp_path, 8)
    with pytest.raises(ValueError, match=r"cannot be sent to 2 worker processes"
                       r".*num_workers=1"):
        MeshFolder(str(tmp_path), pre_transform=lambda data: data,
                   num_workers=2, log=False)
