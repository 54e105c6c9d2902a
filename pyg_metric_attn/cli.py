"""Command line: ``pyg-metric-attn COMMAND ...`` (or ``python -m pyg_metric_attn``)."""
from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch


def _option(text: str) -> tuple[str, Any]:
    """Parse ``KEY=VALUE``; VALUE as a Python literal when it is one."""
    key, sep, value = text.partition('=')
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got '{text}'")
    try:
        return key, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return key, value


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
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    from pyg_metric_attn.experiments import TASKS

    parser = argparse.ArgumentParser(prog='pyg-metric-attn', description=__doc__)
    parser.add_argument('--threads', type=int, default=None,
                        help='torch CPU threads (default: torch decides)')
    commands = parser.add_subparsers(dest='command', required=True)

    exp = commands.add_parser(
        'experiment', help='train every (attention, seed) pair of a task, then '
        'write JSON logs, curves, a violin plot and a summary table')
    tasks = exp.add_subparsers(dest='name', required=True, metavar='NAME')
    for name in sorted(TASKS):
        task_cls = TASKS[name]
        summary = (task_cls.__doc__ or name).strip().splitlines()[0]
        sub = tasks.add_parser(name, help=summary)
        sub.add_argument('--attention', help='comma-separated attention types '
                         f"(default: {','.join(task_cls.default_attentions)})")
        sub.add_argument('--seeds', type=int, default=10, help='number of seeds')
        sub.add_argument('--first-seed', type=int, default=0)
        sub.add_argument('--epochs', type=int, default=None,
                         help='epochs per run (default: the task\'s)')
        sub.add_argument('--out', help=f'output folder (default: runs/{name})')
        sub.add_argument('--option', '-o', type=_option, action='append',
                         default=[], metavar='KEY=VALUE',
                         help='task option, e.g. -o lr=1e-3')
        sub.add_argument('--no-progress', action='store_true')
        group = sub.add_argument_group(f'{name} options')
        task_cls.add_arguments(group)
        sub.set_defaults(func=_experiment,
                         task_flags=[action.dest for action in group._group_actions])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    return args.func(args)


if __name__ == '__main__':
    sys.exit(main())
