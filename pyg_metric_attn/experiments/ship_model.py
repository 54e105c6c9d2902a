r"""Ship a trained human_seg run as the package's model, with its card:

    python -m pyg_metric_attn.experiments.ship_model RUN --commit SHA \
        [--root PATH] [--processed-dir PATH] [--draws 3] \
        [--out pyg_metric_attn/pretrained] [--report FOLDER]

The run's best checkpoint is written as the shipped model ``human_seg``
(:func:`~pyg_metric_attn.pretrained.write_pretrained`), read back through
:func:`~pyg_metric_attn.pretrained.load_pretrained` (the SHA-256 checked),
and that model is scored: on the validation meshes the run held out, on the
test meshes, and on perturbed copies of the test meshes (``experiment
human_seg_robust``'s perturbations, ``--draws`` copies of each that draws at
random). The card records the data and split, the run's command with the
commit it was trained at (``--commit``), its seed, epochs, wall time and
device, and those numbers: so every number of the card comes from the file
it describes. With ``--report``, the perturbed readings are also written
there as ``experiment human_seg_robust`` writes them (``summary.md``,
``results.json``, ``human_seg_robust.png``, the most changed copies in
``meshes/``).
"""
from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path
from typing import Any

from pyg_metric_attn.utils.io import atomic_write_json

#: Where the meshes and labels come from.
DATA = {
    'name': "MeshCNN's human_seg (Maron et al. 2017, 'Convolutional Neural "
            "Networks on Surfaces via Seamless Toric Covers'; meshes "
            "simplified to 1500 faces by Hanocka et al. 2019, MeshCNN)",
    'source': 'the MeshCNN download of human_seg (train/, test/, seg/ .eseg '
              'edge labels, sseg/ soft labels); a face takes the majority of '
              'its three edge labels',
    'classes': 'head, hand, lower arm, upper arm, torso, upper leg, lower leg, '
               'foot',
}


def training_record(run: Path, commit: str) -> dict[str, Any]:
    """How the run was trained: its command, commit, seed, epochs, wall time
    and device, from its config.json and metrics.json, and the epoch of the
    checkpoint shipped (:func:`~pyg_metric_attn.training.load_checkpoint`:
    the last epoch's where no metric chose one, as in human_seg)."""
    from pyg_metric_attn.training import load_checkpoint

    config = json.loads((run / 'config.json').read_text())
    history = json.loads((run / 'metrics.json').read_text())
    # Where the data lay on the training machine is no option of the recipe.
    options = {key: value for key, value in config['options'].items()
               if key not in ('root', 'processed_dir')}
    flags = ['--root ROOT'] if config['options'].get('root') else []
    command = ' '.join(
        ['pyg-metric-attn train', config['task'], *flags,
         f"--attention {config['attention']}", f"--seed {config['seed']}",
         f"--epochs {config['epochs']}",
         *(f'-o {shlex.quote(f"{key}={value}")}' for key, value in options.items())])
    return {'command': command, 'commit': commit, 'seed': config['seed'],
            'epochs': config['epochs'], 'attention': config['attention'],
            'options': options,
            'config_version': config.get('config_version', 1),
            'device': config['device'],
            'wall_time_hours': round(sum(row['epoch_seconds']
                                         for row in history) / 3600, 2),
            'checkpoint_epoch': load_checkpoint(run)['epoch']}


def perturbed_accuracy(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per perturbation of ``human_seg_robust.score``'s rows: face accuracy,
    drop (points), agreement with the original's predictions, seeds."""
    return {row['perturbation']: {
        'face_acc': row['face_acc'], 'drop': row['drop'],
        'agreement': row['agreement'],
        **({'seeds': row['seeds']} if 'seeds' in row else {})}
        for row in rows[1:]}


def main(argv: list[str] | None = None) -> int:
    from pyg_metric_attn.datasets import BODY_PARTS
    from pyg_metric_attn.experiments.human_seg_robust import score, write
    from pyg_metric_attn.experiments.run_folder import load_run
    from pyg_metric_attn.geometry import PERTURBATIONS
    from pyg_metric_attn.pretrained import load_pretrained, write_pretrained
    from pyg_metric_attn.pretrained.card import PRETRAINED_DIR

    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('run', type=Path)
    parser.add_argument('--commit', required=True,
                        help='the commit the run was trained at')
    parser.add_argument('--root', help="the human_seg folder, where it moved")
    parser.add_argument('--processed-dir', help='its processed files, where '
                        'they moved')
    parser.add_argument('--draws', type=int, default=3)
    parser.add_argument('--out', type=Path, default=PRETRAINED_DIR)
    parser.add_argument('--report', type=Path, help='also write the perturbed '
                        'readings here as experiment human_seg_robust does')
    args = parser.parse_args(argv)
    moved = {key: value for key, value in (('root', args.root),
                                           ('processed_dir', args.processed_dir))
             if value}
    task, model, description = load_run(args.run, 'human_seg', moved)
    print(description)
    card = write_pretrained('human_seg', model, task.preprocessing, BODY_PARTS,
                            task.config.features, args.out,
                            data={**DATA, 'split': _split(task)},
                            training=training_record(args.run, args.commit))
    shipped = load_pretrained('human_seg', args.out).model  # what users get
    metrics: dict[str, Any] = {}
    for split in ('val', 'test'):
        result, report = task.evaluate_split(shipped, split)
        print(f'{split}:\n{report}')
        metrics.update({f'{split}_{key}': result[key] for key in
                        ('face_acc', 'edge_acc', 'soft_edge_acc', 'class_acc')
                        if key in result})  # edges: where the meshes have labels
    rows = score(task, shipped, list(PERTURBATIONS), 0, split='test',
                 draws=args.draws, progress=True,
                 examples_dir=args.report and args.report / 'meshes' / 'shipped')
    metrics['test_perturbed'] = perturbed_accuracy(rows)
    if args.report:
        write(dict(seed=0, draws=args.draws, split='test',
                   perturbations=list(PERTURBATIONS),
                   meshes=len(rows[0]['mesh_face_acc']),
                   runs=[dict(run='shipped', description='the shipped model',
                              rows=rows, examples='shipped')]), args.report)
    card['metrics'] = metrics
    atomic_write_json(args.out / 'human_seg.json', card)
    print(json.dumps(metrics, indent=2))
    return 0


def _split(task: Any) -> str:
    train, val, test = (len(task.meshes(split)) for split in
                        ('train', 'val', 'test'))
    c = task.config
    return (f'{train + val} training meshes: {train} trained on, {val} held out '
            f'for validation (val_fraction={c.val_fraction}, '
            f'data_seed={c.data_seed}; read after every epoch, the model is '
            "the last epoch's); "
            f'{test} test meshes (SHREC), read once, by this script')


if __name__ == '__main__':
    raise SystemExit(main())
