"""The robustness set: perturbed copies of meshes with their labels carried
and the correspondence stored, cached and seeded, and the
``experiment human_seg_robust`` command that scores trained runs on them."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import trimesh

from pyg_metric_attn.cli import main
from pyg_metric_attn.datasets import PerturbedMeshes, SyntheticHumans, mesh_data
from pyg_metric_attn.geometry import PERTURBATIONS, perturb_mesh
from pyg_metric_attn.geometry.perturbations import (
    DETERMINISTIC_PERTURBATIONS,
    JITTER,
    MAX_STRETCH,
    PERTURBATION_VERSIONS,
    decimate,
    distinct_copy_seeds,
)
from pyg_metric_attn.transforms import MeshPreprocessing

pytestmark = pytest.mark.usefixtures('one_thread')

PREPROCESS = MeshPreprocessing(16, 4)


def labelled_capsule() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A capsule along z with faces labelled by height (three bands)."""
    mesh = trimesh.creation.capsule(height=2.0, radius=0.5, count=[16, 16])
    pos, face = np.asarray(mesh.vertices), np.asarray(mesh.faces)
    labels = np.digitize(pos[face].mean(axis=1)[:, 2], [-0.5, 0.5])
    return pos, face, labels


@pytest.mark.parametrize('kind', PERTURBATIONS)
def test_perturbations_keep_the_surface_and_map_faces_back(kind):
    pos, face, labels = labelled_capsule()
    new_pos, new_face, source = perturb_mesh(pos, face, kind,
                                             np.random.default_rng(0))
    assert source.shape == (len(new_face),) and source.max() < len(face)
    assert np.isin(np.arange(len(new_pos)), new_face).all()  # no loose vertex
    # Carried labels: the label of the height band the new face lies in,
    # except near the band borders (or after the stretch of one axis).
    centroid_z = new_pos[new_face].mean(axis=1)[:, 2]
    if kind == 'anisotropic_scaling':
        centroid_z = centroid_z / (new_pos[:, 2].max() / pos[:, 2].max())
    if kind != 'rotation':
        bands = np.digitize(centroid_z, [-0.5, 0.5])
        assert (labels[source] == bands).mean() > 0.9
    expected_faces = {'subdivision': (4 * len(face),) * 2,
                      'decimation': (0.45 * len(face), 0.75 * len(face))}
    low, high = expected_faces.get(kind, (len(face), len(face)))
    assert low <= len(new_face) <= high
    if kind in ('rotation', 'renumbering'):  # the same triangles, moved
        old_corners = np.sort(np.linalg.norm(pos[face[source]], axis=2), axis=1)
        new_corners = np.sort(np.linalg.norm(new_pos[new_face], axis=2), axis=1)
        np.testing.assert_allclose(new_corners, old_corners, atol=1e-12)
    if kind == 'jitter':
        diagonal = np.linalg.norm(np.ptp(pos, axis=0))
        rms = np.sqrt(np.square(new_pos - pos).sum(axis=1).mean())
        assert 0.8 * JITTER * diagonal < rms < 1.2 * JITTER * diagonal
    if kind == 'anisotropic_scaling':
        stretch = np.ptp(new_pos, axis=0) / np.ptp(pos, axis=0)
        assert (np.sort(stretch)[:2] == 1).all()
        assert 1 <= stretch.max() <= MAX_STRETCH
    with pytest.raises(ValueError, match="Unknown perturbation 'twist'"):
        perturb_mesh(pos, face, 'twist', np.random.default_rng(0))


@pytest.mark.parametrize('kind', PERTURBATIONS)
def test_only_the_deterministic_perturbations_ignore_the_seed(kind):
    # The robustness experiment scores these once however many draws it makes.
    pos, face, _ = labelled_capsule()
    first, second = (perturb_mesh(pos, face, kind, np.random.default_rng(seed))
                     for seed in (0, 1))
    same = all(np.array_equal(a, b) for a, b in zip(first, second, strict=True))
    assert same == (kind in DETERMINISTIC_PERTURBATIONS)


@pytest.mark.parametrize('kind', PERTURBATIONS)
def test_the_same_seed_makes_the_same_copy(kind):
    """A copy is a function of its seed (the cache and the robustness
    scores rely on it): the rotation too, whose draw goes through a torch
    generator seeded from ``rng``, not torch's global one."""
    pos, face, _ = labelled_capsule()
    torch.manual_seed(1)
    first = perturb_mesh(pos, face, kind, np.random.default_rng(7))
    torch.manual_seed(2)
    again = perturb_mesh(pos, face, kind, np.random.default_rng(7))
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)


def test_distinct_copy_seeds_count_from_the_seed():
    assert distinct_copy_seeds('jitter', 3, 2) == [3, 4]
    assert distinct_copy_seeds('rotation', 0, 3) == [0, 1, 2]
    assert distinct_copy_seeds('subdivision', 3, 2) == [3]


def test_jitter_moves_vertices_by_its_rms_length():
    """Over eight draws (2064 vertex moves) the RMS displacement is
    ``JITTER`` times the bounding box diagonal to within 5% (its standard
    error here is under 1%)."""
    pos, face, _ = labelled_capsule()
    diagonal = np.linalg.norm(np.ptp(pos, axis=0))
    moves = np.concatenate([
        perturb_mesh(pos, face, 'jitter', np.random.default_rng(seed))[0] - pos
        for seed in range(8)])
    rms = np.sqrt(np.square(moves).sum(axis=1).mean())
    assert abs(rms / (JITTER * diagonal) - 1) < 0.05, rms / (JITTER * diagonal)


def test_decimate_keeps_a_share_in_0_to_1():
    pos, face, _ = labelled_capsule()
    new_pos, new_face = decimate(pos, face, 1.0)  # everything kept
    assert new_face.shape == face.shape and new_pos.shape == pos.shape
    for kept in (0.0, 1.5):
        with pytest.raises(ValueError, match=f"'kept' must be in \\(0, 1\\], "
                                             f"got {kept}"):
            decimate(pos, face, kept)


def test_subdivided_faces_stem_from_the_face_they_split():
    """Loop subdivision splits every face in four: each new face's source is
    that face, not the nearest centroid after Loop's smoothing (which is a
    neighbour for many faces, and carries its label across segment borders)."""
    pos, face, labels = labelled_capsule()
    rng = np.random.default_rng(0)
    pos = pos + rng.normal(0, 0.02, pos.shape)  # uneven triangles
    new_pos, new_face, source = perturb_mesh(pos, face, 'subdivision', rng)
    np.testing.assert_array_equal(source, np.repeat(np.arange(len(face)), 4))
    # Each corner of a new face is a corner of its source or the midpoint
    # of one of the source's edges (before smoothing: the new face lies in it).
    for f in range(0, len(new_face), 97):
        corners = [c for c in new_face[f] if c < len(pos)]
        assert set(corners) <= set(face[source[f]])


def test_perturbed_meshes_are_seeded_cached_and_carry_labels(tmp_path,
                                                            monkeypatch):
    pos, face, labels = labelled_capsule()
    meshes = [PREPROCESS(mesh_data(pos, face, 'capsule', face_labels=labels))]
    first = PerturbedMeshes(tmp_path, meshes, 'decimation', seed=3,
                            pre_transform=PREPROCESS, num_workers=1, log=False)
    copy = first[0]
    assert torch.equal(copy.y, meshes[0].y[copy.source_face])
    files = sorted(tmp_path.rglob('decimation-v1_seed3_*.pt'))
    assert len(files) == 1
    written = files[0].stat().st_mtime_ns
    again = PerturbedMeshes(tmp_path, meshes, 'decimation', seed=3,
                            pre_transform=PREPROCESS, num_workers=1, log=False)
    assert files[0].stat().st_mtime_ns == written  # read, not made again
    assert torch.equal(again[0].pos, copy.pos)
    other = PerturbedMeshes(tmp_path, meshes, 'decimation', seed=4,
                            pre_transform=PREPROCESS, num_workers=1, log=False)
    assert other[0].face.shape != copy.face.shape or not torch.equal(
        other[0].pos, copy.pos)
    files[0].write_bytes(files[0].read_bytes()[:-10])  # a torn file
    with pytest.warns(UserWarning, match='Re-processing'):
        repaired = PerturbedMeshes(tmp_path, meshes, 'decimation', seed=3,
                                   pre_transform=PREPROCESS, num_workers=1,
                                   log=False)
    repaired_at = files[0].stat().st_mtime_ns
    assert torch.equal(repaired[0].pos, copy.pos)
    # A new version of the perturbation is made anew beside the old cache.
    monkeypatch.setitem(PERTURBATION_VERSIONS, 'decimation', 2)
    PerturbedMeshes(tmp_path, meshes, 'decimation', seed=3,
                    pre_transform=PREPROCESS, num_workers=1, log=False)
    assert len(list(tmp_path.rglob('decimation-v2_seed3_*.pt'))) == 1
    assert files[0].stat().st_mtime_ns == repaired_at
    with pytest.raises(ValueError, match="Unknown perturbation 'twist'"):
        PerturbedMeshes(tmp_path, meshes, 'twist')


def test_an_invariant_model_loses_nothing_at_the_original_faces():
    """Vertex values carried to a Loop subdivision (human_seg_robust.carried:
    an added vertex takes the mean of the edge it splits) and read out at
    the new faces differ from the original faces' values (the corner faces
    lean to their corner), but averaged over the four faces of each original
    face (human_seg_robust's drop at the original faces) they give those
    values back exactly: the readout that tells a model's change from the
    labels' resolution."""
    from pyg_metric_attn.experiments.human_seg_robust import (
        at_original_faces,
        carried,
    )
    from pyg_metric_attn.training.segmentation import face_logits

    pos, face, _ = labelled_capsule()
    new_pos, new_face, source = perturb_mesh(pos, face, 'subdivision',
                                             np.random.default_rng(0))
    copy = PREPROCESS(mesh_data(new_pos, new_face, 'subdivided',
                                source_face=source))
    values = torch.randn(len(pos), 5, dtype=torch.float64)
    mesh = PREPROCESS(mesh_data(pos, face, 'capsule'))
    fine = face_logits(carried(values, copy, mesh), copy.face)
    original = face_logits(values, torch.from_numpy(face.T.copy()))
    assert not torch.allclose(fine, original[copy.source_face])
    torch.testing.assert_close(
        at_original_faces(fine, copy.source_face, len(face)), original)
    # A copy that left an original face without faces is not read there.
    assert at_original_faces(fine[4:], copy.source_face[4:], len(face)) is None
    # An added vertex linked to one original vertex only splits no edge.
    src, dst = copy.edge_index
    ends = torch.nonzero((dst == len(pos)) & (src < len(pos))).flatten()
    broken = copy.clone()
    broken.edge_index = torch.cat([copy.edge_index[:, :ends[0]],
                                   copy.edge_index[:, ends[0] + 1:]], dim=1)
    with pytest.raises(ValueError, match='not a Loop subdivision'):
        carried(values, broken, mesh)


def test_a_model_remeshing_does_not_change_loses_its_readout_floor(
        monkeypatch, tmp_path):
    """human_seg_robust reads, for Loop subdivision and decimation, the
    readout floor: what the original meshes' vertex logits carried to the
    copies lose at the copies' faces. A model that the perturbation does not
    change (its logits on a copy are the carried ones) loses exactly that,
    and nothing at the original faces; a perturbation that keeps the faces
    has none."""
    from types import SimpleNamespace

    import pyg_metric_attn.datasets as datasets
    from pyg_metric_attn.experiments.human_seg_robust import carried, score
    from pyg_metric_attn.training.segmentation import face_logits

    pos, face, labels = labelled_capsule()
    mesh = PREPROCESS(mesh_data(pos, face, 'capsule', face_labels=labels,
                                source_face=np.arange(len(face))))
    new_pos, new_face, source = perturb_mesh(pos, face, 'subdivision',
                                             np.random.default_rng(0))
    subdivided = PREPROCESS(mesh_data(new_pos, new_face, 'subdivided',
                                      face_labels=labels[source],
                                      source_face=source))
    generator = torch.Generator().manual_seed(0)
    # logits that follow the bands, with noise, so that some corner faces lean
    logits = (10 * torch.nn.functional.one_hot(torch.from_numpy(
        np.digitize(pos[:, 2], [-0.5, 0.5])), 3).double()
        + 8 * torch.randn(len(pos), 3, generator=generator, dtype=torch.float64))

    def vertex_scores(model, scored):
        return logits if scored is mesh else carried(logits, scored, mesh)

    task = SimpleNamespace(
        meshes=lambda split: [mesh], preprocessing=None,
        config=SimpleNamespace(num_workers=1), vertex_scores=vertex_scores,
        face_scores=lambda model, scored: face_logits(
            vertex_scores(model, scored), scored.face))
    monkeypatch.setattr(datasets, 'PerturbedMeshes',
                        lambda root, meshes, kind, *args, **kwargs:
                        [subdivided] if kind == 'subdivision' else meshes)
    original, row, jitter = score(task, None, ['subdivision', 'jitter'], 0,
                                  tmp_path)
    assert row['drop'] > 0.5  # the corner faces lean towards their corner
    assert row['readout_floor'] == pytest.approx(row['drop'])
    assert row['source_drop'] == pytest.approx(0.0, abs=1e-9)
    assert jitter['readout_floor'] is None and original['readout_floor'] == 0


def test_values_carried_to_a_decimated_copy_come_from_the_nearest_vertex():
    """A decimated copy's vertices move and the copy is centred and scaled
    on its own: human_seg_robust.carried puts it back into the original's
    frame and gives each vertex its nearest original vertex's values."""
    from pyg_metric_attn.experiments.human_seg_robust import (
        carried,
        original_frame,
    )

    pos, face, _ = labelled_capsule()
    mesh = PREPROCESS(mesh_data(pos, face, 'capsule'))
    new_pos, new_face, source = perturb_mesh(
        mesh.pos.double().numpy(), mesh.face.t().numpy(), 'decimation',
        np.random.default_rng(0))
    copy = PREPROCESS(mesh_data(new_pos, new_face, 'decimated',
                                source_face=source))
    in_frame = torch.from_numpy(new_pos)
    assert (copy.pos.double() - in_frame).abs().max() > 0.01
    torch.testing.assert_close(original_frame(copy, mesh), in_frame,
                               atol=2e-3, rtol=0)
    values = mesh.pos.double()  # each vertex's position as its value
    moved = carried(values, copy, mesh)
    assert moved.shape == (copy.num_nodes, 3)
    torch.testing.assert_close((moved - in_frame).norm(dim=1),
                               torch.cdist(in_frame, values).min(dim=1).values,
                               atol=2e-3, rtol=0)


def train_small_run(tmp_path: Path, **options) -> tuple[Path, Path]:
    """``(run folder, synthetic root)`` of a one-epoch DiffusionNet of 8
    channels trained on one synthetic humanoid (one more to test on), with
    the task ``options`` besides."""
    root = tmp_path / 'synthetic'
    SyntheticHumans(str(root), 'test', 1, num_workers=1,
                    pre_transform=MeshPreprocessing(32, 16, 32, True), log=False)
    arguments = [arg for key, value in dict(
        processed_dir=root, synthetic_train=1, synthetic_test=1,
        num_workers=1, k=32, batch_size=1, diffusionnet_hidden_channels=8,
        diffusionnet_num_layers=1, augment_copies=0, mesh_smoothing=0,
        val_fraction=0.0, **options).items()
        for arg in ('-o', f'{key}={value}')]
    run = tmp_path / 'run'
    assert main(['train', '--attention', 'diffusionnet', '--epochs', '1',
                 '--out', str(run), '--no-progress', *arguments]) == 0
    return run, root


def test_robustness_experiment_scores_a_trained_run(tmp_path, capsys):
    run, root = train_small_run(tmp_path)
    out = tmp_path / 'robust'
    assert main(['experiment', 'human_seg_robust', str(run), '--out', str(out),
                 '--no-progress']) == 0
    results = json.loads((out / 'results.json').read_text())
    rows = {row['perturbation']: row for row in results['runs'][0]['rows']}
    assert list(rows) == ['original', *PERTURBATIONS]
    assert rows['original']['drop'] == 0 and rows['original']['agreement'] == 1
    # Read at the original faces: wherever every original face has a copy's
    # faces (the same faces but for subdivision's four), not after decimation.
    assert rows['decimation']['source_drop'] is None
    assert isinstance(rows['subdivision']['source_drop'], float)
    for kind in ('jitter', 'rotation', 'renumbering', 'anisotropic_scaling'):
        assert rows[kind]['source_drop'] == pytest.approx(rows[kind]['drop'])
    assert rows['subdivision']['faces'] == 4 * rows['original']['faces']
    # The readout floor where remeshing changes the faces, none elsewhere.
    for kind, row in rows.items():
        assert isinstance(row['readout_floor'], float) == (
            kind in ('original', 'subdivision', 'decimation'))
    assert '| readout floor |' in (out / 'summary.md').read_text()
    # DiffusionNet on HKS sees neither the pose nor the numbering.
    assert rows['renumbering']['agreement'] > 0.99
    assert rows['rotation']['agreement'] > 0.99
    for row in rows.values():
        assert row['drop'] == pytest.approx(
            100 * (rows['original']['face_acc'] - row['face_acc']))
    assert (out / 'human_seg_robust.png').stat().st_size > 0
    # Where the predictions changed: per perturbation that changed any, its
    # copy that changed most (here the one test mesh) as a mesh file, the
    # changed faces black, and a picture.
    examples = {kind: row['example'] for kind, row in rows.items()
                if 'example' in row}
    assert 'original' not in examples and 'jitter' in examples
    for kind, row in rows.items():
        if kind not in examples:
            assert kind == 'original' or row['agreement'] == 1
            continue
        example = examples[kind]
        ply, png = (out / 'meshes' / 'run' / name for name in example['files'])
        colored = trimesh.load(ply, process=False)
        black = (colored.visual.face_colors[:, :3] == 0).all(axis=1)
        assert len(colored.faces) == example['faces'] == row['faces']
        assert int(black.sum()) == example['changed_faces'] == round(
            (1 - row['agreement']) * row['faces'])
        assert png.stat().st_size > 0
    # Of several draws, the example is a copy of the first (its seed's).
    again = tmp_path / 'again'
    (again / 'meshes' / 'run').mkdir(parents=True)
    (again / 'meshes' / 'run' / 'stale.ply').write_text('an earlier reading')
    assert main(['experiment', 'human_seg_robust', str(run), '--out', str(again),
                 '--perturbations', 'jitter', '--draws', '2', '--seed', '5',
                 '--no-progress']) == 0
    (row,) = json.loads((again / 'results.json').read_text())['runs'][0]['rows'][1:]
    from pyg_metric_attn.experiments.human_seg_robust import split_meshes
    from pyg_metric_attn.experiments.run_folder import load_run
    task, model, _ = load_run(str(run), 'human_seg', {})
    meshes = split_meshes(task, 'test')
    first = PerturbedMeshes(Path(meshes.processed_root) / 'robustness', meshes,
                            'jitter', row['seeds'][0],
                            pre_transform=task.preprocessing, log=False)[0]
    colored = trimesh.load(again / 'meshes' / 'run' / row['example']['files'][0],
                           process=False)
    np.testing.assert_allclose(colored.vertices, first.pos.numpy(), atol=1e-6)
    # and its black faces are where the model's prediction on that copy
    # differs from its prediction on the original
    changed = task.predict(model, first) != task.predict(model, meshes[0])[
        first.source_face]
    np.testing.assert_array_equal(
        (colored.visual.face_colors[:, :3] == 0).all(axis=1), changed.numpy())
    assert not (again / 'meshes' / 'run' / 'stale.ply').exists()
    assert f"| jitter | {examples['jitter']['mesh']} |" in \
        (out / 'summary.md').read_text()
    # Two runs of one folder name keep their example meshes apart.
    twice = tmp_path / 'twice'
    assert main(['experiment', 'human_seg_robust', str(run), str(run), '--out',
                 str(twice), '--perturbations', 'jitter', '--no-progress']) == 0
    folders = [entry['examples'] for entry in
               json.loads((twice / 'results.json').read_text())['runs']]
    assert folders == ['run', 'run-2']
    assert all(any((twice / 'meshes' / folder).glob('jitter-*.ply'))
               for folder in folders)
    assert '| renumbering |' in (out / 'summary.md').read_text()
    assert 'drop at the original faces' in (out / 'summary.md').read_text()
    assert sorted(p.name.split('_seed')[0] for p in
                  (root / 'processed').rglob('robustness/*/*_seed0_*.pt')) == \
        sorted(f'{kind}-v{PERTURBATION_VERSIONS[kind]}' for kind in PERTURBATIONS)
    assert 'worst' in capsys.readouterr().out
    # What denormals cost the same run's steps: both settings measured.
    from benchmarks.denormal_steps import denormal_count, markdown, measure
    cost = measure(str(run), meshes=1, repeats=1, progress=False)
    assert cost['denormal_weights'][1] > 0
    for kind in ('train', 'eval'):  # the ratio of the two settings' medians
        ms = cost[kind]['ms_per_mesh']
        assert set(ms) == {'flushed', 'not flushed'}
        assert cost[kind]['slowdown'] == pytest.approx(
            ms['not flushed'] / ms['flushed'])
    assert '| training step |' in markdown(cost)
    assert denormal_count([torch.tensor([1e-39, 1e-30, 0.0, -1e-40]),
                           torch.tensor([1, 2])]) == (2, 4)


def test_robustness_experiment_scores_the_validation_meshes(tmp_path, capsys):
    # Choices made for robustness read the meshes a run held out of its
    # training meshes, not the test split: '--split val' perturbs exactly
    # the meshes the run was validated on.
    options = [arg for key, value in dict(
        processed_dir=tmp_path / 'synthetic', synthetic_train=3,
        synthetic_test=1, num_workers=1, k=16, batch_size=1,
        diffusionnet_hidden_channels=8, diffusionnet_num_layers=1,
        augment_copies=0, mesh_smoothing=0).items()
        for arg in ('-o', f'{key}={value}')]
    run = tmp_path / 'run'
    assert main(['train', '--attention', 'diffusionnet', '--epochs', '1',
                 '--out', str(run), '--no-progress', '-o', 'val_fraction=0.34',
                 *options]) == 0
    validation = json.loads((run / 'metrics.json').read_text())[-1]
    out = tmp_path / 'robust'
    assert main(['experiment', 'human_seg_robust', str(run), '--split', 'val',
                 '--perturbations', 'rotation', '--out', str(out),
                 '--no-progress']) == 0
    results = json.loads((out / 'results.json').read_text())
    assert results['split'] == 'val' and results['meshes'] == 1
    original, rotated = results['runs'][0]['rows']
    assert original['face_acc'] == pytest.approx(validation['val_face_acc'])
    assert rotated['agreement'] > 0.99
    assert 'validation meshes' in (out / 'summary.md').read_text()
    # Several draws of a random perturbation, one of a deterministic one.
    drawn = tmp_path / 'drawn'
    assert main(['experiment', 'human_seg_robust', str(run), '--split', 'val',
                 '--perturbations', 'subdivision,jitter', '--seed', '3',
                 '--draws', '3', '--out', str(drawn), '--no-progress']) == 0
    results = json.loads((drawn / 'results.json').read_text())
    assert results['draws'] == 3
    original, subdivided, jittered = results['runs'][0]['rows']
    assert subdivided['seeds'] == [3] and len(subdivided['draw_drops']) == 1
    assert jittered['seeds'] == [3, 4, 5]
    assert jittered['drop'] == pytest.approx(np.mean(jittered['draw_drops']))
    assert jittered['faces'] == 3 * original['faces']
    variants = run.parent / 'synthetic' / 'processed'
    assert sorted(p.name.split('_')[1] for p in
                  variants.rglob('robustness/*/jitter-*.pt')) == \
        ['seed3', 'seed4', 'seed5']
    assert len(list(variants.rglob('robustness/*/subdivision-*.pt'))) == 1
    assert 'seeds 3-5: 3 draws' in (drawn / 'summary.md').read_text()
    assert main(['experiment', 'human_seg_robust', str(run), '--split', 'val',
                 '--draws', '0', '--out', str(tmp_path / 'no-draws'),
                 '--no-progress']) != 0
    assert "'draws' must be a positive integer" in capsys.readouterr().err
    # A run without validation meshes has none to score.
    bare = tmp_path / 'bare'
    assert main(['train', '--attention', 'diffusionnet', '--epochs', '1',
                 '--out', str(bare), '--no-progress', *options,
                 '-o', 'val_fraction=0']) == 0
    assert main(['experiment', 'human_seg_robust', str(bare), '--split', 'val',
                 '--out', str(tmp_path / 'none'), '--no-progress']) != 0
    assert 'No validation meshes' in capsys.readouterr().err


def test_robustness_plot_takes_draws_that_all_agree(tmp_path):
    # Three draws of the same accuracy: their mean drop may differ from each
    # by round-off, which must not make a negative error bar.
    from pyg_metric_attn.experiments.human_seg_robust import write
    row = dict(perturbation='rotation', faces=3, face_acc=0.7, agreement=1.0,
               mesh_face_acc=[0.7], seeds=[0, 1, 2], drop=0.30000000000000004,
               draw_drops=[0.3, 0.3, 0.3])
    original = dict(perturbation='original', faces=1, face_acc=0.703,
                    agreement=1.0, mesh_face_acc=[0.703], drop=0.0)
    results = dict(seed=0, draws=3, split='test', meshes=1,
                   perturbations=['rotation'],
                   runs=[dict(run='run', description='run',
                              rows=[original, row])])
    write(results, tmp_path)
    assert (tmp_path / 'human_seg_robust.png').stat().st_size > 0
    assert '0.30 / 0.30 / 0.30' in (tmp_path / 'summary.md').read_text()


def test_draws_that_change_nothing_drop_nothing(monkeypatch, tmp_path):
    # The mean accuracy of three equal draws can differ from each by
    # round-off; the drop must still be 0 (not -0.00) where no draw drops.
    from types import SimpleNamespace

    from torch_geometric.data import Data

    import pyg_metric_attn.datasets as datasets
    from pyg_metric_attn.experiments.human_seg_robust import score

    mesh = Data(y=torch.arange(10), source_face=torch.arange(10),
                face=torch.arange(30).view(3, 10))
    task = SimpleNamespace(
        meshes=lambda split: [mesh], preprocessing=None,
        config=SimpleNamespace(num_workers=1),
        vertex_scores=lambda model, mesh: torch.zeros(30, 8),
        face_scores=lambda model, mesh: torch.zeros(10, 8))
    monkeypatch.setattr(datasets, 'PerturbedMeshes',
                        lambda root, meshes, *args, **kwargs: meshes)
    original, rotated = score(task, None, ['rotation'], 0, tmp_path, draws=3)
    assert original['face_acc'] == 0.1 and rotated['draw_drops'] == [0.0] * 3
    assert rotated['drop'] == 0.0 and rotated['agreement'] == 1.0
    assert rotated['source_drop'] == 0.0


def test_the_example_is_the_copy_with_the_most_changed_predictions(tmp_path):
    from torch_geometric.data import Data

    from pyg_metric_attn.experiments.human_seg_robust import write_example

    sphere = trimesh.creation.icosphere(subdivisions=1)
    faces = len(sphere.faces)
    originals = [torch.zeros(faces, dtype=torch.long) for _ in range(3)]
    copies, predictions = [], []
    for index, changed in enumerate((3, 7, 0)):
        predicted = torch.zeros(faces, dtype=torch.long)
        predicted[:changed] = 2
        predictions.append(predicted)
        copies.append(Data(pos=torch.from_numpy(sphere.vertices).float(),
                           face=torch.from_numpy(sphere.faces.T.copy()),
                           y=torch.zeros(faces, dtype=torch.long),
                           source_face=torch.arange(faces), name=f'mesh{index}.obj'))
    example = write_example(copies, originals, predictions, tmp_path, 'jitter')
    assert example == dict(mesh='mesh1.obj', faces=faces, changed_faces=7,
                           files=['jitter-mesh1.ply', 'jitter-mesh1.png'])
    colored = trimesh.load(tmp_path / 'jitter-mesh1.ply', process=False)
    black = (colored.visual.face_colors[:, :3] == 0).all(axis=1)
    np.testing.assert_array_equal(np.flatnonzero(black), np.arange(7))
    assert (tmp_path / 'jitter-mesh1.png').stat().st_size > 0
    # Where no copy changed a prediction there is nothing to show.
    assert write_example(copies[2:], originals[2:], predictions[2:], tmp_path,
                         'rotation') is None
