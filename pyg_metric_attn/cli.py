"""Command line: ``pyg-metric-attn COMMAND ...`` (or ``python -m pyg_metric_attn``).

Errors the user can fix (a bad mesh, a missing run folder, an unknown option)
are printed as one line; ``--debug`` shows the traceback instead. Commands run
with denormal floats flushed to zero on the CPU threads
(:func:`~pyg_metric_attn.utils.denormals.denormals_flushed`): trained weights
drift into that range, where x86 CPUs compute many times slower.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from pyg_metric_attn.utils.denormals import denormals_flushed
from pyg_metric_attn.utils.optional import needs_extra

if TYPE_CHECKING:
    from pyg_metric_attn.experiments.task import Task


def _task_option(task_cls: type[Task]) -> Callable[[str], tuple[str, Any]]:
    """An argparse type: ``KEY=VALUE`` checked against the task's config
    (the option exists, its value has the type and range) while parsing."""
    def parse(text: str) -> tuple[str, Any]:
        try:
            return task_cls.parse_option(text)
        except ValueError as error:
            raise argparse.ArgumentTypeError(str(error)) from error
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

    task_cls = TASKS[args.task]
    task = task_cls(epochs=args.epochs, progress=not args.no_progress,
                    device=args.device, precision=args.precision,
                    **dict(args.option), **_task_flags(args))
    attentions = (args.attention.split(',') if args.attention
                  else list(task_cls.default_attentions))
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    out = Path(args.out or Path('runs') / args.task)
    summary = run_experiment(task, attentions, seeds, out,
                             progress=not args.no_progress)
    print(f'\n{args.task}: {len(seeds)} seeds, results in {out}/\n')
    print(summary_table(task, summary))
    failed = sum(len(s['failed_seeds']) for s in summary.values())
    if failed:  # each error was printed when its run failed
        print(f'{failed} runs failed: errors and tracebacks in '
              f'{out}/runs/ATTENTION-seedSEED.json')
    return 1 if failed else 0


def _task_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The task's own flags (``--root``, ...) that were given."""
    return {dest: getattr(args, dest) for dest in args.task_flags
            if getattr(args, dest) is not None}


def _load_run(args: argparse.Namespace, run: str | Path | None = None):
    """``(task, model)`` of a run folder written by ``train`` (``run``,
    default ``args.run``), the model holding its best checkpoint."""
    from pyg_metric_attn.experiments.run_folder import load_run

    options = {**dict(args.option), **_task_flags(args)}
    task, model, description = load_run(run or args.run, args.task, options,
                                        args.command, device=args.device,
                                        precision=args.precision)
    print(description)
    return task, model


def _train(args: argparse.Namespace) -> int:
    from contextlib import nullcontext

    from pyg_metric_attn.experiments import TASKS
    from pyg_metric_attn.training import process_group, resolve_device
    from pyg_metric_attn.utils.io import atomic_write_json, locked_folder

    options = {**dict(args.option), **_task_flags(args)}
    device = resolve_device(args.device)
    # Under torchrun: one of several processes (NCCL, each on GPU LOCAL_RANK,
    # where the device is CUDA; gloo on CPUs otherwise); rank 0 prepares the
    # data first and alone writes into `out`.
    with process_group(backend='nccl' if device.type == 'cuda'
                       else 'gloo') as ctx:
        task = TASKS[args.task](epochs=args.epochs,
                                progress=not args.no_progress,
                                device=ctx.device if ctx.is_distributed
                                else device,
                                precision=args.precision, **options)
        attention = args.attention or task.default_attentions[0]
        out = Path(args.out or Path('runs') / 'train'
                   / f'{attention}-seed{args.seed}')
        config = {'task': args.task, 'attention': attention, 'seed': args.seed,
                  'epochs': task.epochs, 'options': options,
                  'config_version': task.config_version,
                  'device': task.placement.device.type,  # a record only
                  'precision': task.placement.precision}

        def write_config() -> None:
            if ctx.is_main:
                atomic_write_json(out / 'config.json', config)

        # A second train into the same folder is refused.
        with locked_folder(out) if ctx.is_main else nullcontext():
            with ctx.main_first():
                task.prepare_data()
            model, trainer = task.fit(attention, args.seed, out,
                                      resume=args.resume,
                                      before_training=write_config,
                                      distributed=ctx)
            written = task.save_example(model, out) if ctx.is_main else []
    if not ctx.is_main:
        return 0
    row = trainer.history[-1]
    print('\n'.join(f'{key}: {value:.4f}' for key, value in row.items()))
    shown = ''.join(f', {path.name}' for path in written)
    print(f'checkpoints, metrics{shown} in {out}/')
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from pyg_metric_attn.utils.io import atomic_write_json

    task, model = _load_run(args)
    result, report = task.evaluate_split(model, args.split)
    print(report)
    atomic_write_json(Path(args.run) / f'evaluation-{args.split}.json', result)
    return 0


def _predict(args: argparse.Namespace) -> int:
    from pyg_metric_attn.experiments import TASKS

    first, *rest = (Path(path) for path in args.paths)
    if not first.exists():
        raise FileNotFoundError(f"'{first}' is no run folder and no input "
                                f"file: no such file or folder")
    if first.is_dir():  # a run folder, then the inputs
        if not rest:
            raise ValueError(f"Give the input files after the run folder "
                             f"'{first}'")
        task, model = _load_run(args, first)
        paths, out = rest, Path(args.out or first / 'predictions')
        outcomes = task.predict_files(model, paths, out)
    else:  # the model shipped with the package
        task = TASKS[args.task](progress=False, device=args.device,
                                precision=args.precision)
        segmenter = task.shipped_model()
        print(segmenter.description)
        paths, out = [first, *rest], Path(args.out or 'predictions')
        outcomes = segmenter.predict_files(paths, out)
    failed = 0
    for path, outcome in outcomes:
        if not isinstance(outcome, Exception):
            print(f'{path} -> {outcome}')
            continue
        if args.debug:
            raise outcome
        print(f'error: {outcome}', file=sys.stderr)  # and on with the others
        failed += 1
    if failed:
        print(f'error: {failed} of {len(paths)} inputs could not be read',
              file=sys.stderr)
    return 1 if failed else 0


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


class _Parser(argparse.ArgumentParser):
    """An argument parser whose command may name its task first, or leave
    it out for the default task (``train ...`` is ``train human_seg ...``):
    where :attr:`task_names` is set, arguments that do not start with one
    get :attr:`default_task` in front. Its help names each task's summary
    (which imports every task; nothing else does)."""
    task_names: tuple[str, ...] = ()
    default_task: str = 'human_seg'

    def parse_known_args(self, args=None, namespace=None):
        if self.task_names:
            args = list(sys.argv[1:] if args is None else args)
            if not args or args[0] not in (*self.task_names, '-h', '--help'):
                args.insert(0, self.default_task)
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    parser = action.choices[choice.dest]
                    if isinstance(parser, _TaskParser) and not choice.help:
                        choice.help = parser.summary()
        return super().format_help()


class _TaskParser(argparse.ArgumentParser):
    """The sub-parser of one task (or analysis) of a command, filled in
    (its module imported) only when it parses or shows its help, so that a
    command imports only the task it runs."""
    def __init__(self, *args, fill: Callable[[_TaskParser], None] | None = None,
                 describe: Callable[[], str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._fill = fill
        self._describe = describe

    def _filled(self) -> None:
        if self._fill is not None:
            fill, self._fill = self._fill, None
            fill(self)

    def summary(self) -> str:
        """One line on the task (where its module cannot be imported, why)."""
        try:
            return self._describe() if self._describe is not None else ''
        except ModuleNotFoundError as error:
            return f'(unavailable: {error})'

    def parse_known_args(self, args=None, namespace=None):
        self._filled()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._filled()
        return super().format_help()


#: What each command does, and its help for one task.
COMMAND_HELP = {
    'experiment': 'train every (attention, seed) pair of a task, then write '
                  'JSON logs, curves, a violin plot and a summary table',
    'train': 'train one model with checkpoints, metrics (and, where the task '
             'makes them, renderings) in --out',
    'evaluate': 'the metrics of a trained run on a data split',
    'predict': 'predictions for input files by a trained run, or by the '
               'model shipped with the package (meshes: a .ply with per-face '
               'colours, a PNG rendering, the labels per face)',
}
#: The theory's measurements under ``experiment`` (not tasks): name ->
#: (module, summary).
ANALYSES = {
    'human_seg_robust': ('pyg_metric_attn.experiments.human_seg_robust',
                         'trained human_seg runs scored on perturbed test '
                         'meshes (remeshed, deformed, rotated, renumbered): '
                         'accuracy drops and agreement, a plot'),
    'heat_limit': ('pyg_metric_attn.experiments.heat_limit',
                   'the heat-kernel limit of attention propagation on '
                   'manifolds: errors, best t, fitted slopes, a plot'),
    'heat_limit_learned': ('pyg_metric_attn.experiments.heat_limit_learned',
                           'the heat-kernel limit under a trained metric map '
                           'phi against the induced and Euclidean targets, a '
                           'plot'),
    'rank_collapse': ('pyg_metric_attn.experiments.rank_collapse',
                      'rank collapse of stacked attention blocks at '
                      'initialisation, per metric and block kind, a plot'),
    'rank_collapse_trained': ('pyg_metric_attn.experiments.rank_collapse_trained',
                              'rank collapse through the depth of attention '
                              'stacks trained on two moons, per depth, a plot'),
}


def _task_summary(name: str) -> str:
    from pyg_metric_attn.experiments.tasks import load_task

    return (load_task(name).__doc__ or name).strip().splitlines()[0]


def _fill_task_parser(sub: _TaskParser, name: str, task: str,
                      add_command_arguments: Callable[[type[Task],
                                                       argparse.ArgumentParser],
                                                      None]) -> None:
    """The ``-o`` options, own flags, ``--device``/``--precision`` and the
    command's arguments of ``task`` under command ``name``; a task that
    does not support the command is an error."""
    from pyg_metric_attn.experiments.tasks import TASK_PATHS, load_task
    from pyg_metric_attn.training.device import add_placement_arguments

    task_cls = load_task(task)
    if not task_cls.supports(name):
        able = []
        for other in TASK_PATHS:
            try:
                if load_task(other).supports(name):
                    able.append(other)
            except ModuleNotFoundError:  # a task whose extra is missing
                continue
        sub.error(f"the {task} task does not support this command (tasks "
                  f"that do: {', '.join(able)})")
    sub.add_argument('--option', '-o', type=_task_option(task_cls),
                     action='append', default=[], metavar='KEY=VALUE',
                     help=f'{task} option (a field of '
                     f'{task_cls.config_class.__name__}), e.g. -o lr=1e-3')
    group = sub.add_argument_group(f'{task} options')
    task_cls.add_arguments(group, name)
    sub.set_defaults(task_flags=[action.dest for action in group._group_actions])
    add_placement_arguments(sub)
    add_command_arguments(task_cls, sub)


def _fill_analysis_parser(sub: _TaskParser, module: str) -> None:
    import importlib

    analysis = importlib.import_module(module)
    analysis.add_arguments(sub)
    sub.set_defaults(func=analysis.main)


def _add_task_parsers(command: argparse.ArgumentParser, name: str,
                      global_flags: argparse.ArgumentParser,
                      add_command_arguments: Callable[[type[Task],
                                                       argparse.ArgumentParser],
                                                      None]) -> None:
    """One sub-parser per task (and under ``experiment`` per analysis), each
    filled with the ``-o`` options, own flags and ``add_command_arguments``
    of its task when it is used."""
    from functools import partial

    from pyg_metric_attn.experiments.tasks import TASK_PATHS

    tasks = command.add_subparsers(dest='task', required=True, metavar='TASK',
                                   parser_class=_TaskParser)
    for task in TASK_PATHS:
        tasks.add_parser(task, parents=[global_flags], help='',  # on --help
                         prog=f'{command.prog} {task}',
                         fill=partial(_fill_task_parser, name=name, task=task,
                                      add_command_arguments=add_command_arguments),
                         describe=partial(_task_summary, task))
    if name == 'experiment':
        for analysis, (module, summary) in ANALYSES.items():
            tasks.add_parser(analysis, parents=[global_flags], help=summary,
                             prog=f'{command.prog} {analysis}',
                             fill=partial(_fill_analysis_parser, module=module))
    else:
        command.task_names = tuple(TASK_PATHS)
        command.description = (f'{COMMAND_HELP[name]}. TASK: '
                               f"{', '.join(TASK_PATHS)} (default: human_seg).")


def _experiment_arguments(task_cls: type[Task],
                          sub: argparse.ArgumentParser) -> None:
    sub.add_argument('--attention', help='comma-separated attention types '
                     f"(default: {','.join(task_cls.default_attentions)})")
    sub.add_argument('--seeds', type=_positive_int, default=10,
                     help='number of seeds')
    sub.add_argument('--first-seed', type=int, default=0)
    sub.add_argument('--epochs', type=_positive_int, default=None,
                     help='epochs per run (default: the task\'s)')
    sub.add_argument('--out', help=f'output folder (default: '
                     f'runs/{task_cls.name})')
    sub.add_argument('--no-progress', action='store_true')
    sub.set_defaults(func=_experiment)


def _train_arguments(task_cls: type[Task], sub: argparse.ArgumentParser) -> None:
    sub.add_argument('--attention', help='the attention type or model '
                     f'(default: {task_cls.default_attentions[0]})')
    sub.add_argument('--seed', type=int, default=0)
    sub.add_argument('--epochs', type=_positive_int, default=None,
                     help=f'epochs (default: {task_cls.default_epochs})')
    sub.add_argument('--out', help='run folder (default: '
                     'runs/train/ATTENTION-seedSEED)')
    sub.add_argument('--resume', action='store_true',
                     help='continue from the run folder\'s last checkpoint')
    sub.add_argument('--no-progress', action='store_true')
    sub.set_defaults(func=_train)


def _evaluate_arguments(task_cls: type[Task],
                        sub: argparse.ArgumentParser) -> None:
    sub.add_argument('run', help='run folder written by train')
    sub.add_argument('--split', choices=task_cls.splits,
                     default=task_cls.splits[0])
    sub.set_defaults(func=_evaluate)


def _predict_arguments(task_cls: type[Task],
                       sub: argparse.ArgumentParser) -> None:
    sub.add_argument('paths', nargs='+', metavar='[RUN] INPUT',
                     help='a run folder written by train (default: the model '
                     'shipped with the package), then the input files (meshes: '
                     '.obj, .off, .ply or .stl; outputs are named by file stem)')
    sub.add_argument('--out', help='output folder (default: RUN/predictions, '
                     'or ./predictions with the shipped model)')
    sub.set_defaults(func=_predict)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog='pyg-metric-attn', description=__doc__)
    _add_global_flags(parser, suppress=False)
    global_flags = argparse.ArgumentParser(add_help=False)
    _add_global_flags(global_flags)
    commands = parser.add_subparsers(dest='command', required=True,
                                     parser_class=_Parser)
    usages = {'experiment': None, 'train': '%(prog)s [TASK] ...',
              'evaluate': '%(prog)s [TASK] RUN ...',
              'predict': '%(prog)s [TASK] [RUN] INPUT ...'}
    for name, arguments in (('experiment', _experiment_arguments),
                            ('train', _train_arguments),
                            ('evaluate', _evaluate_arguments),
                            ('predict', _predict_arguments)):
        command = commands.add_parser(name, parents=[global_flags],
                                      usage=usages[name],
                                      help=COMMAND_HELP[name])
        _add_task_parsers(command, name, global_flags, arguments)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        with needs_extra('experiments'):  # the tasks' packages, for their flags
            parser = build_parser()
    except ModuleNotFoundError as error:
        if '--debug' in (sys.argv[1:] if argv is None else argv):
            raise
        print(f'error: {error}', file=sys.stderr)
        return 1
    args = parser.parse_args(argv)
    root = getattr(args, 'root', None)
    if root is not None and not Path(root).is_dir():
        parser.error(f"--root '{root}' is no folder; give the folder that holds "
                     f"the data (to download them into a new one, create it "
                     f"first)")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        with denormals_flushed():
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
