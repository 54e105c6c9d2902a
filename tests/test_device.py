"""Where runs compute: ``--device``/``--precision`` on every command, the
Trainer and tasks moving models and batches, and tasks imported one by one."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from torch_geometric.data import Data

from pyg_metric_attn.cli import main
from pyg_metric_attn.training import (
    DeviceUnavailableError,
    Placement,
    Trainer,
    resolve_device,
)

TINY_MOON = ['-o', 'num_train=40', '-o', 'num_test=20', '-o', 'set_size=20',
             '-o', 'hidden=4', '-o', 'mlp_channels=4']


def test_train_on_the_test_device_then_evaluate_on_the_cpu(tmp_path, capsys,
                                                          device):
    run = tmp_path / 'run'
    assert main(['train', 'moon', '--device', str(device), '--epochs', '2',
                 '--out', str(run), '--no-progress', *TINY_MOON]) == 0
    assert [row['epoch'] for row in
            json.loads((run / 'metrics.json').read_text())] == [1, 2]
    config = json.loads((run / 'config.json').read_text())
    assert (config['device'], config['precision']) == (device.type, 'fp32')
    # The checkpoint (of CUDA under --device cuda) evaluates on the CPU, in
    # bf16 autocast.
    assert main(['evaluate', 'moon', str(run), '--device', 'cpu',
                 '--precision', 'bf16', *TINY_MOON]) == 0
    assert 'test_acc' in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason='needs a CPU-only machine')
@pytest.mark.parametrize('command', [
    ['train', 'moon', '--epochs', '1', '--no-progress'],
    ['experiment', 'moon', '--seeds', '1', '--epochs', '1', '--no-progress'],
    ['experiment', 'rank_collapse', '--depth', '1', '--seeds', '1',
     '--no-progress']])
def test_cuda_where_there_is_none_is_one_line(command, tmp_path, capsys):
    assert main([*command, '--device', 'cuda', '--out', str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count('\n') == 1 and 'Traceback' not in err
    assert '--device cuda asks for CUDA, but this machine has no CUDA device' in err
    assert not list(tmp_path.iterdir())  # nothing was started


def test_resolve_device():
    assert resolve_device('cpu') == torch.device('cpu')
    assert resolve_device('auto').type == ('cuda' if torch.cuda.is_available()
                                           else 'cpu')
    with pytest.raises(ValueError, match="Unknown device 'tpu'"):
        resolve_device('tpu')
    with pytest.raises(DeviceUnavailableError, match='cuda:99'):
        resolve_device('cuda:99')
    with pytest.raises(ValueError, match="Unknown precision 'fp16'"):
        Placement.of('cpu', 'fp16')


def test_move_copies_data_and_leaves_the_original(device):
    data = Data(x=torch.ones(2, 3), edge_index=torch.zeros(2, 1, dtype=torch.long))
    placement = Placement(torch.device('meta'))
    moved = placement.move((data, {'y': torch.ones(1)}, 'name'))
    assert moved[0].x.device.type == 'meta' and data.x.device.type == 'cpu'
    assert moved[1]['y'].device.type == 'meta' and moved[2] == 'name'


def test_trainer_moves_batches_and_autocasts_step_and_evaluate():
    seen = []
    model = torch.nn.Linear(3, 1)

    def step(model, batch):
        seen.append((batch.device, torch.is_autocast_enabled('cpu')))
        return model(batch).float().square().mean()

    def evaluate(model):
        seen.append(('evaluate', torch.is_autocast_enabled('cpu')))
        return {}

    placement = Placement(torch.device('cpu'), 'bf16')
    trainer = Trainer(model, torch.optim.SGD(model.parameters(), lr=0.1), step,
                      evaluate, progress=False, placement=placement)
    trainer.fit(lambda epoch: [torch.ones(2, 3)], 1)
    assert seen == [(torch.device('cpu'), True), ('evaluate', True)]
    assert model.weight.dtype == torch.float32  # autocast, not a cast


MESH_PACKAGES = ('trimesh', 'potpourri3d', 'robust_laplacian',
                 'fast_simplification')


@pytest.mark.parametrize('module', [
    'pyg_metric_attn.experiments.tasks.moon',
    'pyg_metric_attn.experiments.rank_collapse',
    'pyg_metric_attn.experiments.rank_collapse_trained',
    'pyg_metric_attn.experiments.heat_limit_learned'])
def test_importing_one_task_imports_no_other_tasks_packages(module):
    code = (f'import sys, {module}\n'
            f'from pyg_metric_attn.cli import build_parser\n'
            f"build_parser().parse_args(['experiment', 'moon'])\n"
            f"build_parser().parse_args(['experiment', 'rank_collapse'])\n"
            f'print([name for name in {MESH_PACKAGES!r} + '
            f"('pyg_metric_attn.experiments.tasks.human_seg',) "
            f'if name in sys.modules])')
    out = subprocess.run([sys.executable, '-c', code], capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == '[]'


def test_tasks_load_by_name():
    from pyg_metric_attn.experiments import TASKS
    from pyg_metric_attn.experiments.tasks import MoonTask, load_task

    assert TASKS['moon'] is MoonTask is load_task('moon')
    assert sorted(TASKS) == ['citeseer', 'cora', 'human_seg', 'mnist',
                             'mnist_point_clouds', 'moon', 'multi30k']
    with pytest.raises(KeyError, match="Unknown task 'moo'"):
        load_task('moo')
