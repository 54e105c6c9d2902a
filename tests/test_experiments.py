"""The experiment runner on a tiny Moon grid, and the command line."""
from __future__ import annotations

import json

import pytest

from pyg_metric_attn.cli import main
from pyg_metric_attn.experiments import run_experiment
from pyg_metric_attn.experiments.tasks import MoonTask
from pyg_metric_attn.experiments.tasks.moon import moon_data

PNG = b'\x89PNG\r\n\x1a\n'


def test_moon_data_matches_the_paper():
    x_train, y_train, x_test, y_test = moon_data()
    assert x_train.shape == (400, 2) and x_test.shape == (100, 2)
    assert set(y_train.tolist()) == {0, 1}
    assert abs(float(y_train.float().mean()) - 0.5) < 0.1


def test_runner_writes_logs_figures_table_and_loss_falls(tmp_path):
    task = MoonTask(epochs=15, progress=False)
    summary = run_experiment(task, ['metric', 'gat'], [0, 1], tmp_path,
                             progress=False)
    assert set(summary) == {'metric', 'gat'}
    for attention in ('metric', 'gat'):
        for seed in (0, 1):
            record = json.loads(
                (tmp_path / 'runs' / f'{attention}-seed{seed}.json').read_text())
            assert record['status'] == 'ok'
            losses = [row['train_loss'] for row in record['history']]
            assert len(losses) == 15 and losses[-1] < losses[0]
            assert 0.0 <= record['final']['test_acc'] <= 1.0
    for figure in ('curves.png', 'violin.png'):
        assert (tmp_path / figure).read_bytes().startswith(PNG)
    table = (tmp_path / 'summary.md').read_text()
    assert table.count('\n') == 4 and '| metric | 2 |' in table
    assert summary['metric']['runs'] == 2


def test_runner_skips_finished_runs_and_reports_crashes(tmp_path, monkeypatch):
    task = MoonTask(epochs=3, progress=False)
    run_experiment(task, ['l2'], [0], tmp_path, progress=False)

    def must_not_run(self, attention, seed):
        if attention == 'l2':
            raise AssertionError('finished run was repeated')
        raise RuntimeError('boom')

    monkeypatch.setattr(MoonTask, 'run', must_not_run)
    summary = run_experiment(task, ['l2', 'dot'], [0], tmp_path, progress=False)
    assert summary['l2']['runs'] == 1
    assert summary['dot']['runs'] == 0 and summary['dot']['failed_seeds'] == [0]
    failed = json.loads((tmp_path / 'runs' / 'dot-seed0.json').read_text())
    assert failed['status'] == 'failed' and 'boom' in failed['error']
    # A changed config re-runs instead of reusing:
    monkeypatch.undo()
    changed = MoonTask(epochs=4, progress=False)
    run_experiment(changed, ['l2'], [0], tmp_path, progress=False)
    record = json.loads((tmp_path / 'runs' / 'l2-seed0.json').read_text())
    assert len(record['history']) == 4


def test_cli_experiment_prints_the_table(tmp_path, capsys):
    code = main(['experiment', 'moon', '--attention', 'metric,dot', '--seeds', '1',
                 '--epochs', '2', '--out', str(tmp_path), '--no-progress',
                 '-o', 'hidden=6'])
    assert code == 0
    printed = capsys.readouterr().out
    assert '| metric | 1 |' in printed and '| dot | 1 |' in printed
    record = json.loads((tmp_path / 'runs' / 'metric-seed0.json').read_text())
    assert record['task_config']['hidden'] == 6


def test_unknown_task_option():
    with pytest.raises(ValueError, match='Unknown moon options'):
        MoonTask(hiden=3)
