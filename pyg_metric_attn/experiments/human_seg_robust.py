r"""``pyg-metric-attn experiment human_seg_robust RUN [RUN ...]``: how trained
human_seg models hold up when the test meshes are made differently.

Every test mesh (with ``--split val``: every validation mesh the runs held
out of the training meshes, so that choices made for robustness need not
read the test set) gets one copy per perturbation of
:data:`~pyg_metric_attn.geometry.PERTURBATIONS` (loop subdivision,
decimation to 50-70% of the faces, anisotropic scaling up to 1.3x on one
axis, vertex jitter of 1% of the bounding box, a random rotation, a random
renumbering; see :func:`~pyg_metric_attn.geometry.perturb_mesh`), labels
carried from the original's faces (by the nearest face centroid where the
connectivity changes). The copies are processed as the training meshes were
and cached (:class:`~pyg_metric_attn.datasets.PerturbedMeshes`: seeded,
written atomically, verified on load) under ``--variants-dir`` (default:
``PROCESSED/robustness``, beside the test set's processed files). One copy
of a set of 18 meshes is a noisy reading of a perturbation that draws at
random (decimation's share of faces, the stretched axis, the noise):
``--draws N`` scores ``N`` copies of each (seeds ``SEED`` to ``SEED + N -
1``) and reports their mean drop and the drop of every draw; the
deterministic loop subdivision is scored once.

Each run folder (written by ``pyg-metric-attn train human_seg ... --out
RUN``; best checkpoint) is scored on the original test meshes and on every
perturbed set: hard face accuracy, its drop from the original's in points,
and the agreement of the predictions with the original's (each face
compared with the original face it stems from; rotation and renumbering
should change no prediction). Where every original face has faces of the
copy stemming from it (all but decimation), the drop is also read at the
original faces: the copy's face logits averaged over the faces that stem
from each original face, against the original labels. Loop subdivision's
four faces per original face all carry its label, and a vertex model's
corner faces lean towards their corner: at segment borders that costs
accuracy even for a model that subdivision does not change at all (its
averaged logits are exactly the original's), so the drop at the original
faces is the one that measures how much the segmentation changes. That
cost is read as well, the **readout floor** of Loop subdivision and
decimation: the original meshes' vertex logits carried to the copies (an
added vertex takes the mean of the edge it splits; a decimated copy's
vertex, which moves, its nearest original vertex's, so there the floor is
approximate) and read out at their faces, what a model the perturbation
does not change at all would lose; the drop beyond it is the model's own.
Written to ``--out``: ``results.json``,
``summary.md`` (a table per run and one of the drops of all runs),
``human_seg_robust.png``, and, to see where the segmentation changes, per
run and perturbation the copy with the most changed predictions (of the
first draw) as ``meshes/RUN/PERTURBATION-MESH.ply`` (faces coloured by predicted
part, black where the prediction differs from that of the original face
they stem from; opens in MeshLab or Blender) and ``.png`` (its labels and
predictions).
"""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path
from statistics import fmean as mean
from typing import Any

import torch
from tqdm import tqdm

from pyg_metric_attn.training.device import add_placement_arguments
from pyg_metric_attn.utils.io import atomic_writer, write_results

NAME = 'human_seg_robust'
#: The perturbations whose readout floor :func:`score` reads: those that
#: change the vertices and faces, where :func:`carried` takes the original
#: values to the copy (exactly for Loop subdivision; for decimation, whose
#: vertices move, each vertex takes its nearest original vertex's). The
#: others keep the faces, so a model they do not change loses nothing.
READOUT_FLOORS = ('subdivision', 'decimation')
#: The meshes a ``--split`` perturbs, in words.
SPLIT_NAMES = {'test': 'test meshes', 'val': 'validation meshes'}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument('runs', nargs='+', metavar='RUN',
                        help='run folders written by train human_seg')
    parser.add_argument('--root', help="the runs' human_seg folder, where it "
                        'moved (default: as each run recorded it)')
    parser.add_argument('--processed-dir', help="the runs' processed files, "
                        'where they moved (default: as recorded)')
    parser.add_argument('--variants-dir', help='where the perturbed '
                        'meshes are cached (default: PROCESSED/robustness)')
    parser.add_argument('--split', choices=('test', 'val'), default='test',
                        help="the meshes to perturb: the test split, or the "
                        "validation meshes the runs held out of the training "
                        "meshes (default: test)")
    parser.add_argument('--perturbations', help='comma-separated, of '
                        'subdivision, decimation, anisotropic_scaling, '
                        'jitter, rotation, renumbering (default: all)')
    parser.add_argument('--seed', type=int, default=0,
                        help='seed of the perturbations')
    parser.add_argument('--draws', type=int, default=1,
                        help='copies of the meshes per perturbation that '
                        'draws at random (seeds SEED, SEED+1, ...), scored '
                        'and averaged: a steadier drop than one draw '
                        '(default: 1)')
    parser.add_argument('--out', help=f'output folder (default: runs/{NAME})')
    parser.add_argument('--no-progress', action='store_true')
    add_placement_arguments(parser)


def split_meshes(task: Any, split: str) -> Any:
    """The processed meshes to perturb: the ``'test'`` split, or the
    ``'val'`` meshes the task holds out of the training meshes."""
    if split not in SPLIT_NAMES:
        raise ValueError(f"'split' must be 'test' or 'val', got {split!r}")
    return task.meshes(split)


def score(task: Any, model: torch.nn.Module, perturbations: list[str],
          seed: int, variants_dir: str | Path | None = None,
          progress: bool = False, split: str = 'test',
          draws: int = 1, examples_dir: str | Path | None = None
          ) -> list[dict[str, Any]]:
    """One row per mesh set, the original meshes of ``split`` (``'test'`` or
    ``'val'``) first, then each perturbation's copies: ``faces``,
    ``face_acc``, ``drop`` (points below the original's), ``source_drop``
    (the drop read at the original faces, :func:`at_original_faces`;
    :obj:`None` where a copy leaves some original face without faces),
    ``agreement``
    (share of faces predicted as the original face they stem from),
    ``mesh_face_acc`` (per mesh) and, for the perturbations of
    :data:`READOUT_FLOORS`, ``readout_floor``: the drop of the original
    meshes' vertex logits carried to the copies (:func:`carried`) and read
    out at their faces, what a model that the perturbation does not change
    at all loses (:obj:`None` for the others).

    A perturbation that draws at random (all but
    :data:`~pyg_metric_attn.geometry.DETERMINISTIC_PERTURBATIONS`) is scored
    on ``draws`` copies of the meshes, made with the seeds ``seed``,
    ``seed + 1``, ...: its row holds the means over the draws (``faces``:
    their total), the ``seeds`` and the ``draw_drops``, one per draw.

    With ``examples_dir``, each perturbation's row also holds its
    ``example`` (:func:`write_example`, of the first draw; none where no
    prediction changed), written into that folder."""
    from pyg_metric_attn.datasets import PerturbedMeshes
    from pyg_metric_attn.geometry.perturbations import distinct_copy_seeds
    from pyg_metric_attn.training.segmentation import face_logits

    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 1:
        raise ValueError(f"'draws' must be a positive integer, got {draws!r}")
    meshes = split_meshes(task, split)
    if variants_dir is None:
        variants_dir = Path(meshes.processed_root) / 'robustness'
    vertex_logits = [task.vertex_scores(model, mesh) for mesh in meshes]
    originals = [face_logits(logits, mesh.face).argmax(-1)
                 for logits, mesh in zip(vertex_logits, meshes, strict=True)]
    sets = [(name, distinct_copy_seeds(name, seed, draws))
            for name in perturbations]
    bar = tqdm(total=1 + sum(len(seeds) for _, seeds in sets), desc=NAME,
               disable=not progress)
    original_labels = [mesh.y for mesh in meshes]
    original = score_set(task, model, meshes, originals, False)
    del original['predictions']
    rows = [dict(perturbation='original', drop=0.0, source_drop=0.0,
                 readout_floor=0.0, **original)]
    bar.update()
    for name, seeds in sets:
        scored, first_draw, floors = [], None, []
        for draw_seed in seeds:
            copies = PerturbedMeshes(variants_dir, meshes, name, draw_seed,
                                     pre_transform=task.preprocessing,
                                     num_workers=task.config.num_workers,
                                     log=progress)
            scored.append(score_set(task, model, copies, originals, True,
                                    original_labels))
            if name in READOUT_FLOORS:
                floors.append(100 * (rows[0]['face_acc'] - carried_accuracy(
                    vertex_logits, meshes, copies)))
            if first_draw is None:  # its copies and their predictions
                first_draw = copies, scored[-1].pop('predictions')
            bar.update()
        drops = [100 * (rows[0]['face_acc'] - draw['face_acc'])
                 for draw in scored]
        source_drops = [None if draw['source_face_acc'] is None else
                        100 * (rows[0]['face_acc'] - draw['source_face_acc'])
                        for draw in scored]
        rows.append(dict(
            perturbation=name, seeds=seeds,
            faces=sum(draw['faces'] for draw in scored),
            face_acc=mean(draw['face_acc'] for draw in scored),
            agreement=mean(draw['agreement'] for draw in scored),
            mesh_face_acc=[mean(accs) for accs in zip(
                *(draw['mesh_face_acc'] for draw in scored), strict=True)],
            # the mean of the draws' drops: exactly 0 where every draw is
            drop=mean(drops), draw_drops=drops,
            source_drop=(None if None in source_drops else mean(source_drops)),
            readout_floor=mean(floors) if floors else None))
        if examples_dir is not None:
            copies, predictions = first_draw
            example = write_example(copies, originals, predictions,
                                    Path(examples_dir), name)
            if example is not None:
                rows[-1]['example'] = example
    bar.close()
    return rows


def at_original_faces(face_values: torch.Tensor, source_face: torch.Tensor,
                      num_faces: int) -> torch.Tensor | None:
    """Per-face values of a perturbed copy averaged over the faces that stem
    from each of the original mesh's ``num_faces`` faces (``source_face``:
    the original face of each of the copy's); :obj:`None` where some
    original face has none (a decimated copy)."""
    from torch_geometric.utils import scatter

    if int(torch.bincount(source_face, minlength=num_faces).min()) == 0:
        return None
    return scatter(face_values, source_face, dim=0, dim_size=num_faces,
                   reduce='mean')


def carried_accuracy(vertex_logits: list[torch.Tensor], meshes: Any,
                     copies: Any) -> float:
    """Face accuracy on the perturbed ``copies`` of the original
    ``meshes``' ``vertex_logits`` carried to the copies' vertices
    (:func:`carried`) and averaged at their faces: the accuracy of a model
    that the perturbation does not change at all."""
    from pyg_metric_attn.training.segmentation import face_logits

    correct = faces = 0
    for logits, mesh, copy in zip(vertex_logits, meshes, copies, strict=True):
        predicted = face_logits(carried(logits, copy, mesh), copy.face).argmax(-1)
        correct += int((predicted == copy.y).sum())
        faces += copy.y.numel()
    return correct / faces


def original_frame(copy, mesh) -> torch.Tensor:
    """The copy's vertex positions in the original ``mesh``'s frame: each
    mesh is centred and scaled on its own when processed
    (:func:`~pyg_metric_attn.geometry.normalize_positions`), so the copy is
    scaled and shifted by the least-squares fit that carries its face
    centroids onto those of the faces they stem from (``copy.source_face``)."""
    ours = copy.pos[copy.face].mean(dim=0).double()
    theirs = mesh.pos[mesh.face].mean(dim=0).double()[copy.source_face]
    ours_mean, theirs_mean = ours.mean(dim=0), theirs.mean(dim=0)
    scale = (((ours - ours_mean) * (theirs - theirs_mean)).sum()
             / (ours - ours_mean).square().sum())
    return scale * (copy.pos.double() - ours_mean) + theirs_mean


def carried(values: torch.Tensor, copy, mesh) -> torch.Tensor:
    """Per-vertex ``values`` of the original ``mesh`` on the copy's
    vertices: where the copy has as many vertices they are the original's;
    where it has more (Loop subdivision) the original vertices (the copy's
    first) keep theirs and every added vertex takes the mean over its
    neighbours among the original vertices (the two ends of the edge it
    split); where it has fewer (decimation, whose vertices move) every
    vertex takes the value of the original vertex nearest to it, in the
    original's frame (:func:`original_frame`)."""
    count = values.size(0)
    if copy.num_nodes == count:
        return values
    if copy.num_nodes < count:
        from scipy.spatial import cKDTree

        _, nearest = cKDTree(mesh.pos.double().numpy()).query(
            original_frame(copy, mesh).numpy())
        return values[torch.from_numpy(nearest)]
    src, dst = copy.edge_index
    added = (dst >= count) & (src < count)
    sums = values.new_zeros(copy.num_nodes, values.size(1))
    sums.index_add_(0, dst[added], values[src[added]])
    ends = torch.bincount(dst[added], minlength=copy.num_nodes)
    if not bool((ends[count:] == 2).all()):
        raise ValueError(f"{copy.name}: an added vertex is not on one edge "
                         f"of two original vertices; not a Loop subdivision")
    carried_values = sums / ends.clamp(min=1).unsqueeze(-1).to(sums.dtype)
    carried_values[:count] = values
    return carried_values


def score_set(task: Any, model: torch.nn.Module, meshes: Any,
              originals: list[torch.Tensor], perturbed: bool,
              original_labels: list[torch.Tensor] | None = None
              ) -> dict[str, Any]:
    """Face accuracy of ``model`` on one set of ``meshes``, the perturbed
    copies of the originals (``perturbed``) or the originals themselves, and
    the agreement with the originals' predictions ``originals``. Of copies,
    with the originals' face labels ``original_labels``, also
    ``source_face_acc``: the accuracy read at the original faces
    (:func:`at_original_faces` of the copies' face logits), :obj:`None`
    where a copy leaves an original face without faces. ``predictions``:
    the predicted face labels per mesh."""
    correct = agree = faces = 0
    per_mesh, predictions = [], []
    # Per copy, the hits at the original faces (None: one has no faces).
    source_hits: list[int | None] = []
    for index, (mesh, original) in enumerate(zip(meshes, originals,
                                                  strict=True)):
        if perturbed:
            scores = task.face_scores(model, mesh)
            predicted, source = scores.argmax(-1), mesh.source_face
        else:
            predicted, source = original, slice(None)
        hits = int((predicted == mesh.y).sum())
        correct += hits
        agree += int((predicted == original[source]).sum())
        faces += mesh.y.numel()
        per_mesh.append(hits / mesh.y.numel())
        predictions.append(predicted)
        if perturbed and original_labels is not None:
            labels = original_labels[index]
            pooled = at_original_faces(scores, source, labels.numel())
            source_hits.append(None if pooled is None else
                               int((pooled.argmax(-1) == labels).sum()))
    result = dict(faces=faces, face_acc=correct / faces,
                  agreement=agree / faces, mesh_face_acc=per_mesh,
                  predictions=predictions)
    if perturbed and original_labels is not None:
        result['source_face_acc'] = (
            None if None in source_hits else
            sum(source_hits) / sum(labels.numel() for labels in original_labels))
    return result


def write_example(copies: Any, originals: list[torch.Tensor],
                  predictions: list[torch.Tensor], out_dir: Path,
                  perturbation: str) -> dict[str, Any] | None:
    """The copy among ``copies`` with the most faces predicted otherwise
    than the original face they stem from (``predictions``: the copies'
    predicted face labels, ``originals``: the original meshes'), written to
    ``out_dir`` as ``PERTURBATION-MESH.ply``, its faces coloured by
    predicted part and black
    (:data:`~pyg_metric_attn.visualization.MARK_COLOR`) where the
    prediction changed, and ``PERTURBATION-MESH.png``, its labels and
    predictions; returns its ``mesh`` name, ``faces``, ``changed_faces`` and
    ``files``, or :obj:`None` where no copy changed a prediction."""
    from pyg_metric_attn.datasets.mesh_io import write_segmented_ply
    from pyg_metric_attn.datasets.synthetic_humans import BODY_PARTS
    from pyg_metric_attn.visualization import label_colors, render_segmentations

    changed = [(predicted != original[copy.source_face]).numpy()
               for copy, original, predicted in zip(copies, originals,
                                                    predictions, strict=True)]
    index = max(range(len(changed)), key=lambda i: int(changed[i].sum()))
    if not changed[index].any():
        return None
    mesh, changed, predicted = copies[index], changed[index], predictions[index]
    predicted = predicted.numpy()
    pos, face = mesh.pos.numpy(), mesh.face.t().numpy()
    stem = f"{perturbation}-{Path(str(mesh.name)).stem}"
    write_segmented_ply(out_dir / f'{stem}.ply', pos, face,
                        label_colors(predicted, marked=changed))
    render_segmentations(out_dir / f'{stem}.png', pos, face,
                         [mesh.y.numpy(), predicted],
                         [f'{perturbation}: labels',
                          f'prediction ({int(changed.sum())} changed: black)'],
                         BODY_PARTS, marked=[None, changed])
    return dict(mesh=str(mesh.name), faces=len(face),
                changed_faces=int(changed.sum()),
                files=[f'{stem}.ply', f'{stem}.png'])


def seeds_text(results: dict[str, Any]) -> str:
    """The perturbations' seeds, in words."""
    seed, draws = results['seed'], results.get('draws', 1)
    if draws == 1:
        return f'seed {seed}'
    return (f'seeds {seed}-{seed + draws - 1}: {draws} draws of each random '
            f'perturbation, accuracy and drop their mean')


def summary_table(results: dict[str, Any]) -> str:
    draws = results.get('draws', 1) > 1
    lines = [f"Face accuracy of trained human_seg runs on perturbed copies of "
             f"the {results['meshes']} {SPLIT_NAMES[results['split']]} "
             f"({seeds_text(results)}); "
             f"drop: points below the original; drop at the original "
             f"faces: the same, of the copy's face logits averaged over the "
             f"faces that stem from each original face ('-': a copy that "
             f"leaves some without); readout floor: the drop of the original "
             f"meshes' vertex logits carried to the copies and read out at "
             f"their faces, what a model the perturbation does not change "
             f"loses (for decimation approximately: each vertex takes its "
             f"nearest original vertex's; '-': a perturbation that keeps the "
             f"faces, where it is 0); agreement: faces predicted as the "
             f"original face they stem from.", '']
    for run in results['runs']:
        lines += [run['description'], '',
                  '| mesh set | faces | face acc % | drop (points) | '
                  'drop at the original faces | readout floor | agreement % |'
                  + (' drop per draw |' if draws else ''),
                  '|---|---|---|---|---|---|---|' + ('---|' if draws else '')]
        for row in run['rows']:
            line = (f"| {row['perturbation']} | {row['faces']} | "
                    f"{100 * row['face_acc']:.2f} | {row['drop']:.2f} | "
                    + ' | '.join('-' if row.get(key) is None else
                                 f'{row[key]:.2f}'
                                 for key in ('source_drop', 'readout_floor'))
                    + f" | {100 * row['agreement']:.2f} |")
            if draws:
                line += ' ' + ' / '.join(
                    f'{drop:.2f}' for drop in row.get('draw_drops', [0.0])) + ' |'
            lines.append(line)
        lines.append('')
        examples = [row for row in run['rows'] if 'example' in row]
        if examples:
            lines += [f"The copy with the most changed predictions, per "
                      f"perturbation (first draw), in "
                      f"`meshes/{run['examples']}/`:", '',
                      '| perturbation | mesh | faces | predictions changed | '
                      'files |', '|---|---|---|---|---|']
            lines += [f"| {row['perturbation']} | "
                      f"{row['example']['mesh'].replace('|', '/')} | "
                      f"{row['example']['faces']} | "
                      f"{row['example']['changed_faces']} | "
                      + ', '.join(row['example']['files']) + ' |'
                      for row in examples]
            lines.append('')
    names = [row['perturbation'] for row in results['runs'][0]['rows'][1:]]
    lines += ['Drop in points per perturbation (worst: the largest):', '',
              '| run | original % | ' + ' | '.join(names) + ' | worst |',
              '|' + '---|' * (len(names) + 3)]
    for run in results['runs']:
        drops = [row['drop'] for row in run['rows'][1:]]
        lines.append(f"| {run['run']} | {100 * run['rows'][0]['face_acc']:.2f}"
                     f" | " + ' | '.join(f'{d:.2f}' for d in drops)
                     + f' | {max(drops):.2f} |')
    return '\n'.join(lines) + '\n'


def write(results: dict[str, Any], out: Path) -> None:
    from pyg_metric_attn.visualization import file_figure

    write_results(out, results, summary_table(results))
    runs = results['runs']
    names = [row['perturbation'] for row in runs[0]['rows'][1:]]
    figure = file_figure(figsize=(12, 4.2))
    width = 0.8 / len(runs)
    for panel, (key, scale, label) in enumerate((
            ('drop', 1, 'face accuracy drop (points)'),
            ('agreement', 100, 'agreement with the original (%)'))):
        ax = figure.add_subplot(1, 2, panel + 1)
        for index, run in enumerate(runs):
            rows = run['rows'][1:]
            heights = [scale * row[key] for row in rows]
            # the spread of the draws around their mean drop (round-off
            # may put the mean of one draw a hair outside it)
            spread = ([[max(0.0, drop - min(row['draw_drops'])) for drop, row
                        in zip(heights, rows, strict=True)],
                       [max(0.0, max(row['draw_drops']) - drop) for drop, row
                        in zip(heights, rows, strict=True)]]
                      if key == 'drop' and results.get('draws', 1) > 1
                      else None)
            ax.bar([i + (index - (len(runs) - 1) / 2) * width
                    for i in range(len(names))], heights, width, yerr=spread,
                   capsize=2, label=Path(run['run']).name)
        ax.set_xticks(range(len(names)), names, rotation=30, ha='right')
        ax.set_ylabel(label)
        ax.grid(alpha=0.3, axis='y')
    ax.set_ylim(min(100 * row['agreement'] for run in runs
                    for row in run['rows']) - 2, 100.5)
    ax.legend(fontsize=8)
    figure.suptitle(f"human_seg {SPLIT_NAMES[results['split']]}, perturbed "
                    f"({seeds_text(results)})")
    figure.tight_layout()
    with atomic_writer(out / f'{NAME}.png') as file:
        figure.savefig(file, format='png', dpi=110)


def main(args: argparse.Namespace) -> int:
    from pyg_metric_attn.experiments.heat_limit import parse_names
    from pyg_metric_attn.experiments.run_folder import load_run
    from pyg_metric_attn.geometry import PERTURBATIONS

    perturbations = (parse_names(args.perturbations, PERTURBATIONS,
                                 'perturbation')
                     if args.perturbations else list(PERTURBATIONS))
    overrides = {key: getattr(args, key) for key in ('root', 'processed_dir')
                 if getattr(args, key) is not None}
    out = Path(args.out or Path('runs') / NAME)
    results: dict[str, Any] = dict(seed=args.seed, draws=args.draws,
                                   split=args.split,
                                   perturbations=perturbations, runs=[])
    # the example meshes of this reading only, none of an earlier one
    shutil.rmtree(out / 'meshes', ignore_errors=True)
    example_folders: list[str] = []
    for run in args.runs:
        task, model, description = load_run(run, 'human_seg', overrides,
                                             f'experiment {NAME}',
                                             device=args.device,
                                             precision=args.precision)
        print(description)
        # the run folder's name, numbered where two runs share it
        name = examples = Path(run).resolve().name
        number = 1
        while examples in example_folders:
            number += 1
            examples = f'{name}-{number}'
        example_folders.append(examples)
        rows = score(task, model, perturbations, args.seed, args.variants_dir,
                     not args.no_progress, args.split, args.draws,
                     out / 'meshes' / examples)
        results['meshes'] = len(rows[0]['mesh_face_acc'])
        results['runs'].append(dict(run=str(run), description=description,
                                    rows=rows, examples=examples))
    write(results, out)
    print(f'\n{NAME}: results in {out}/\n')
    print(summary_table(results))
    return 0
