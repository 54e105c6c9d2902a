"""The command line's parsing: flags before and after the command, numbers
and task options checked before anything runs, data folders that must exist."""
from __future__ import annotations

import pytest

from pyg_metric_attn.cli import build_parser


@pytest.mark.parametrize('argv', [
    ['--threads', '3', '--debug', 'train'], ['train', '--threads', '3', '--debug'],
    ['experiment', 'moon', '--threads', '3', '--debug'],
    ['experiment', '--threads', '3', '--debug', 'moon']])
def test_global_flags_before_or_after_the_command(argv):
    args = build_parser().parse_args(argv)
    assert args.threads == 3 and args.debug


def test_global_flags_default():
    args = build_parser().parse_args(['evaluate', 'RUN'])
    assert args.threads is None and not args.debug
