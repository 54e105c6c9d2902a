"""Command line: ``pyg-metric-attn COMMAND ...`` (or ``python -m pyg_metric_attn``).

Errors the user can fix (a bad mesh, a missing run folder, an unknown option)
are printed as one line; ``--debug`` shows the traceback instead.
"""
from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from pyg_metric_attn.experiments.task import Task


def _option(text: str) -> tuple[str, Any]:
    """Parse ``KEY=VALUE``; VALUE as a Python literal when it is one."""
    key, sep, value = text.partition('=')
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got '{text}'")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


def _task_option(task_cls: type[Task]) -> Callable[[str], tuple[str, Any]]:
    """:func:`_option`, checked against the task's options and their
    defaults' kinds (where the task declares them) while parsing."""
    def parse(text: str) -> tuple[str, Any]:
        key, value = _option(text)
        if task_cls.defaults is not None:
            try:
                task_cls.with_defaults(task_cls.defaults, {key: value})
            except ValueError as error:
                raise argparse.ArgumentTypeError(str(error)) from error
        return key, value
    return parse


def _positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(
            f"must be a positive integer, got '{text}'")
    return value


def _experiment(args: argparse.Namespace) -> int:
    from pyg_metric_attn.experiments import TASKS, run_experiment
    from pyg_metric_attn.experiments.report import summary_table

    task_cls = TASKS[args.name]
    flags = {dest: getattr(args, dest) for dest in args.task_flags
             if getattr(args, dest) is not None}
    task = task_cls(epochs=args.epochs, progress=not args.no_progress,
                    **dict(args.option), **flags)
    attentions = (args.attention.split(',') if args.attention
                  else list(task_cls.default_attentions))
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    out = Path(args.out or Path('runs') / args.name)
    summary = run_experiment(task, attentions, seeds, out,
                             progress=not args.no_progress)
    print(f'\n{args.name}: {len(seeds)} seeds, results in {out}/\n')
    print(summary_table(task, summary))
    failed = sum(len(s['failed_seeds']) for s in summary.values())
    if failed:  # each error was printed when its run failed
        print(f'{failed} runs failed: errors and tracebacks in '
              f'{out}/runs/ATTENTION-seedSEED.json')
    return 1 if failed else 0


def _segmentation_task(options: dict[str, Any], epochs: int | None = None,
                       progress: bool = True):
    from pyg_metric_attn.experiments.tasks.human_seg import HumanSegTask
    return HumanSegTask(epochs=epochs, progress=progress, **options)


def _mesh_options(args: argparse.Namespace) -> dict[str, Any]:
    """Task options from ``-o`` and the data flags of train/evaluate/predict."""
    options = dict(args.option)
    for flag in ('root', 'processed_dir', 'features'):
        if getattr(args, flag, None) is not None:
            options[flag] = getattr(args, flag)
    return options


def _load_run(args: argparse.Namespace):
    """``(task, model, config)`` of a run folder written by ``train``."""
    import json

    from pyg_metric_attn.training import load_best_model

    run = Path(args.run)
    if not (run / 'config.json').is_file():
        raise FileNotFoundError(f"'{run}' is no run folder of train (no "
                                f"config.json); give the --out folder of a "
                                f"train command")
    config = json.loads((run / 'config.json').read_text())
    task = _segmentation_task({**config['options'], **_mesh_options(args)},
                              config['epochs'], progress=False)
    model = task.build_model(config['attention'])
    state = load_best_model(model, run)
    print(f"{run}: {config['attention']} (seed {config['seed']}), checkpoint of "
          f"epoch {state.get('epoch') or len(state.get('history', []))}")
    return task, model, config


def _train(args: argparse.Namespace) -> int:
    from contextlib import nullcontext

    from pyg_metric_attn.training import process_group
    from pyg_metric_attn.utils.io import atomic_write_json, locked_folder

    options = _mesh_options(args)
    task = _segmentation_task(options, args.epochs, not args.no_progress)
    out = Path(args.out or Path('runs') / 'train' / f'{args.attention}-seed{args.seed}')
    config = {'attention': args.attention, 'seed': args.seed, 'epochs': task.epochs,
              'options': {k: v for k, v in options.items() if k != 'artifacts'}}
    # Under torchrun: one of several processes (gloo: the task runs on CPUs);
    # rank 0 prepares the meshes first and alone writes into `out`.
    with process_group(backend='gloo') as ctx:
        def write_config() -> None:
            if ctx.is_main:
                atomic_write_json(out / 'config.json', config)

        # A second train into the same folder is refused.
        with locked_folder(out) if ctx.is_main else nullcontext():
            with ctx.main_first():
                task.datasets()
            model, trainer = task.fit(args.attention, args.seed, out,
                                      resume=args.resume,
                                      before_training=write_config,
                                      distributed=ctx)
            if ctx.is_main:
                task.save_example(model, out)
    if not ctx.is_main:
        return 0
    row = trainer.history[-1]
    print('\n'.join(f'{key}: {value:.4f}' for key, value in row.items()))
    print(f'checkpoints, metrics and segmentation.png in {out}/')
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from pyg_metric_attn.datasets import BODY_PARTS
    from pyg_metric_attn.utils.io import atomic_write_json

    task, model, _ = _load_run(args)
    train, test = task.datasets()
    meter = task.evaluate(model, train if args.split == 'train' else test)
    result = {**meter.compute(), **meter.details()}
    width = max(len(name) for name in BODY_PARTS)
    lines = [f'{key}: {100 * result[key]:.2f}%' for key in
             ('face_acc', 'edge_acc', 'soft_edge_acc') if key in result]
    lines += [f'  {name:<{width}} {100 * acc:6.2f}%'
              for name, acc in zip(BODY_PARTS, result['class_acc'], strict=True)]
    lines.append('confusion (rows: true, columns: predicted):')
    lines += ['  ' + ' '.join(f'{count:6d}' for count in row)
              for row in result['confusion']]
    print('\n'.join(lines))
    atomic_write_json(Path(args.run) / f'evaluation-{args.split}.json', result)
    return 0


def _output_names(paths: Sequence[Path]) -> list[str]:
    """Distinct output names of mesh files: the file's stem, with its
    extension where stems repeat (``a.obj``, ``a.stl`` -> ``a-obj``,
    ``a-stl``), then numbered where names still repeat."""
    stems = Counter(path.stem for path in paths)
    names: list[str] = []
    for path in paths:
        name = (path.stem if stems[path.stem] == 1
                else f'{path.stem}-{path.suffix[1:].lower()}')
        candidate, number = name, 1
        while candidate in names:
            number += 1
            candidate = f'{name}-{number}'
        names.append(candidate)
    return names


def _predict(args: argparse.Namespace) -> int:
    from pyg_metric_attn.datasets import BODY_PARTS
    from pyg_metric_attn.datasets.mesh_io import read_mesh, write_segmented_ply
    from pyg_metric_attn.geometry import MeshError
    from pyg_metric_attn.utils.io import atomic_write_text
    from pyg_metric_attn.visualization import label_colors, render_segmentations

    task, model, _ = _load_run(args)
    out = Path(args.out or Path(args.run) / 'predictions')
    paths = [Path(mesh) for mesh in args.meshes]
    failed = 0
    for path, name in zip(paths, _output_names(paths), strict=True):
        try:
            pos, face = read_mesh(path)
            mesh = task.prepare_mesh(pos, face, path.name)
        except MeshError as error:  # report it and go on with the others
            if args.debug:
                raise
            print(f'error: {error}', file=sys.stderr)
            failed += 1
            continue
        labels = task.predict(model, mesh).numpy()
        write_segmented_ply(out / f'{name}.ply', pos, face, label_colors(labels))
        atomic_write_text(out / f'{name}.txt',
                          ''.join(f'{label}\n' for label in labels))
        render_segmentations(out / f'{name}.png', mesh.pos.numpy(), face,
                             [labels], [f'{path.name}: prediction'], BODY_PARTS)
        print(f'{path} -> {out}/{name}.{{ply,png,txt}}')
    if failed:
        print(f'error: {failed} of {len(paths)} meshes could not be segmented',
              file=sys.stderr)
    return 1 if failed else 0


def _add_mesh_flags(parser: argparse.ArgumentParser) -> None:
    from pyg_metric_attn.experiments.tasks.human_seg import HumanSegTask

    parser.add_argument('--root', help='MeshCNN human_seg folder (default: '
                        'synthetic humanoids)')
    parser.add_argument('--processed-dir', help='where processed files go')
    parser.add_argument('--option', '-o', type=_task_option(HumanSegTask),
                        action='append',
                        default=[], metavar='KEY=VALUE',
                        help='human_seg task option, e.g. -o lr=1e-3')


def _add_global_flags(parser: argparse.ArgumentParser,
                      suppress: bool = True) -> None:
    """``--threads`` and ``--debug``, accepted before and after the command:
    the command parsers' copies (``suppress``) set them only when given."""
    parser.add_argument('--threads', type=_positive_int,
                        default=argparse.SUPPRESS if suppress else None,
                        help='torch CPU threads (default: torch decides)')
    parser.add_argument('--debug', action='store_true',
                        default=argparse.SUPPRESS if suppress else False,
                        help='show the traceback of an error')


def build_parser() -> argparse.ArgumentParser:
    from pyg_metric_attn.experiments import TASKS

    parser = argparse.ArgumentParser(prog='pyg-metric-attn', description=__doc__)
    _add_global_flags(parser, suppress=False)
    global_flags = argparse.ArgumentParser(add_help=False)
    _add_global_flags(global_flags)
    commands = parser.add_subparsers(dest='command', required=True)

    exp = commands.add_parser(
        'experiment', parents=[global_flags],
        help='train every (attention, seed) pair of a task, then '
        'write JSON logs, curves, a violin plot and a summary table')
    tasks = exp.add_subparsers(dest='name', required=True, metavar='NAME')
    for name in sorted(TASKS):
        task_cls = TASKS[name]
        summary = (task_cls.__doc__ or name).strip().splitlines()[0]
        sub = tasks.add_parser(name, parents=[global_flags], help=summary)
        sub.add_argument('--attention', help='comma-separated attention types '
                         f"(default: {','.join(task_cls.default_attentions)})")
        sub.add_argument('--seeds', type=_positive_int, default=10,
                         help='number of seeds')
        sub.add_argument('--first-seed', type=int, default=0)
        sub.add_argument('--epochs', type=_positive_int, default=None,
                         help='epochs per run (default: the task\'s)')
        sub.add_argument('--out', help=f'output folder (default: runs/{name})')
        sub.add_argument('--option', '-o', type=_task_option(task_cls),
                         action='append',
                         default=[], metavar='KEY=VALUE',
                         help='task option, e.g. -o lr=1e-3')
        sub.add_argument('--no-progress', action='store_true')
        group = sub.add_argument_group(f'{name} options')
        task_cls.add_arguments(group)
        sub.set_defaults(func=_experiment,
                         task_flags=[action.dest for action in group._group_actions])

    train = commands.add_parser(
        'train', parents=[global_flags],
        help='train one mesh segmentation model (human_seg task) with '
        'checkpoints, metrics and a rendering in --out')
    train.add_argument('--attention', default='metric', help='metric, l2, dot, '
                       'gat, gatv2, transformer (IPN) or metricformer')
    train.add_argument('--seed', type=int, default=0)
    train.add_argument('--epochs', type=_positive_int, default=None,
                       help='epochs (default: 100)')
    train.add_argument('--out', help='run folder (default: '
                       'runs/train/ATTENTION-seedSEED)')
    train.add_argument('--resume', action='store_true',
                       help='continue from the run folder\'s last checkpoint')
    train.add_argument('--features', choices=('hks', 'xyz'))
    train.add_argument('--no-progress', action='store_true')
    _add_mesh_flags(train)
    train.set_defaults(func=_train)

    evaluate = commands.add_parser(
        'evaluate', parents=[global_flags],
        help='face, edge and soft edge accuracy, per-class accuracy '
        'and confusion matrix of a trained run')
    evaluate.add_argument('run', help='run folder written by train')
    evaluate.add_argument('--split', choices=('test', 'train'), default='test')
    _add_mesh_flags(evaluate)
    evaluate.set_defaults(func=_evaluate)

    predict = commands.add_parser(
        'predict', parents=[global_flags],
        help='segment mesh files: a .ply with per-face colours, a '
        'PNG rendering and the labels per face')
    predict.add_argument('run', help='run folder written by train')
    predict.add_argument('meshes', nargs='+', help='.obj, .off, .ply or .stl '
                         'files (outputs are named by file stem)')
    predict.add_argument('--out', help='output folder (default: RUN/predictions)')
    _add_mesh_flags(predict)
    predict.set_defaults(func=_predict)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    root = getattr(args, 'root', None)
    if root is not None and not Path(root).is_dir():
        parser.error(f"--root '{root}' is no folder; give the folder that holds "
                     f"the data (to download them into a new one, create it "
                     f"first)")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        return args.func(args)
    except (OSError, ValueError, RuntimeError) as error:
        # The library's own errors (MeshError is a ValueError, missing files,
        # corrupt checkpoints, downloads) name the problem: one line is enough.
        if args.debug:
            raise
        print(f'error: {error} (--debug shows the traceback)', file=sys.stderr)
        return 1


if __name__ == '__main__':
    sys.exit(main())
