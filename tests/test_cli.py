"""The command line's parsing: flags before and after the command, numbers
and task options checked before anything runs, data folders that must exist;
commands run with denormals flushed."""
from __future__ import annotations

import urllib.error

import pytest
import torch

import pyg_metric_attn.cli as cli
import pyg_metric_attn.datasets.human_segmentation as human_segmentation
from pyg_metric_attn.cli import build_parser, main
from pyg_metric_attn.experiments.tasks import HumanSegTask


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


@pytest.mark.parametrize('argv,message', [
    (['train', '--epochs', '0'], "--epochs: must be a positive integer, got '0'"),
    (['train', '--epochs', '-1'], "--epochs: must be a positive integer, got '-1'"),
    (['experiment', 'moon', '--epochs', '0'], 'must be a positive integer'),
    (['experiment', 'moon', '--seeds', '0'], 'must be a positive integer'),
    (['train', '--threads', '0'], 'must be a positive integer'),
    (['train', '-o', 'lr=abc'], "human_seg option lr='abc' must be a number"),
    (['experiment', 'moon', '-o', 'lr=abc'], "moon option lr='abc' must be a number"),
    (['train', '-o', 'hidden=6.5'], 'hidden=6.5 must be an integer'),
    (['evaluate', 'RUN', '-o', 'former_gradients=1'],
     'former_gradients=1 must be True or'),
    (['predict', 'RUN', 'a.obj', '-o', 'hiden=3'],
     "Unknown human_seg options ['hiden']")])
def test_bad_numbers_and_options_are_refused_at_parse_time(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize('argv,message', [
    (['experiment', 'moon', '-o', 'lr=-1'],
     'moon option lr=-1 must be above 0 (default: 0.001)'),
    (['train', '-o', 'val_fraction=1.5'],
     'human_seg option val_fraction=1.5 must be in [0, 1) (default: 0.1)'),
    (['train', '-o', 'mesh_smoothing=-1'], 'must be at least 0'),
    (['train', '-o', 'corner_loss=1'], "Unknown human_seg options ['corner_loss']"),
    (['train', '-o', 'features=obj'],
     "human_seg option features='obj' must be 'hks' or 'xyz'"),
    (['train', '-o', 'time_scale=abc'],
     "time_scale='abc' must be a number or 'matched' or a dict "
     "{a string: a number}, above 0"),
    (['train', '-o', 'former_num_layers=2.5'],
     'human_seg option former_num_layers=2.5 must be an integer (default: 4)'),
    (['train', 'moon', '-o', 'set_size=0'], 'moon option set_size=0 must be at '
     'least 1'),
    (['experiment', 'multi30k', '-o', 'lr=abc'],
     "multi30k option lr='abc' must be a number, above 0"),
    (['experiment', 'multi30k', '-o', 'schedule=linear'],
     "multi30k option schedule='linear' must be 'cosine' or 'plateau'"),
    (['experiment', 'cora', '-o', 'dropout=1'], 'cora option dropout=1 must be '
     'in [0, 1)')])
def test_options_are_checked_against_the_task_config(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_options_that_depend_on_each_other_are_checked_when_the_task_is_built(
        capsys):
    assert main(['train', '-o', 'former_heads=3', '--epochs', '1']) == 1
    assert ("human_seg option former_heads: 'hidden_channels' (64) must be "
            "divisible by 'heads' (3)") in capsys.readouterr().err
    with pytest.raises(ValueError, match="'augment_perturbations' must name"):
        HumanSegTask(augment_perturbations='subdivision,twist')


def test_text_options_keep_text_that_reads_as_a_number():
    args = build_parser().parse_args(['train', '-o', 'processed_dir=2024',
                                      '-o', 'time_scale=matched'])
    assert dict(args.option) == {'processed_dir': '2024',
                                 'time_scale': 'matched'}


def test_commands_name_their_task_or_default_to_human_seg():
    parser = build_parser()
    assert parser.parse_args(['train']).task == 'human_seg'
    assert parser.parse_args(['train', 'moon', '-o', 'hidden=6']).task == 'moon'
    assert parser.parse_args(['evaluate', 'RUN']).task == 'human_seg'
    args = parser.parse_args(['evaluate', 'moon', 'RUN', '--split', 'val'])
    assert (args.task, args.run, args.split) == ('moon', 'RUN', 'val')


def test_options_of_the_defaults_type_pass():
    args = build_parser().parse_args([
        'train', '-o', 'lr=1', '-o', "time_scale={'metric': 2.0}",
        '-o', 'root=adobe', '-o', 'former_gradients=False'])
    assert dict(args.option) == {'lr': 1, 'time_scale': {'metric': 2.0},
                                 'root': 'adobe', 'former_gradients': False}


@pytest.mark.parametrize('command', [['train'], ['experiment', 'human_seg']])
def test_a_missing_root_is_refused_not_created(command, tmp_path, monkeypatch,
                                               capsys):
    def offline(url, folder, log=True):
        raise urllib.error.URLError('no network')
    monkeypatch.setattr(human_segmentation, 'download_url', offline)
    missing = tmp_path / 'missing'
    with pytest.raises(SystemExit):
        main([*command, '--root', str(missing), '--epochs', '1', '--no-progress'])
    assert f"--root '{missing}' is no folder" in capsys.readouterr().err
    assert not missing.exists()


def test_commands_run_with_denormals_flushed(two_threads, monkeypatch, tmp_path):
    """A trained model's weights reach the denormal range, where evaluating it
    on a CPU is many times slower: every command runs with them flushed, and
    the caller's setting comes back afterwards."""
    tiny = torch.full((1 << 20,), 1e-20)  # both intra-op threads compute half
    seen = []

    def evaluate(args):
        seen.append(bool(torch.all(tiny * 1e-19 == 0)))
        return 0
    monkeypatch.setattr(cli, '_evaluate', evaluate)
    assert main(['evaluate', str(tmp_path)]) == 0
    assert seen == [True]
    assert torch.all(tiny * 1e-19 > 0)
