"""The experiments the runner knows, by name."""
from pyg_metric_attn.experiments.tasks.human_seg import HumanSegTask
from pyg_metric_attn.experiments.tasks.mnist import MnistTask
from pyg_metric_attn.experiments.tasks.mnist_point_clouds import MnistPointCloudTask
from pyg_metric_attn.experiments.tasks.moon import MoonTask
from pyg_metric_attn.experiments.tasks.multi30k import Multi30kTask
from pyg_metric_attn.experiments.tasks.planetoid import CiteSeerTask, CoraTask

TASKS = {task.name: task for task in (
    CiteSeerTask, CoraTask, HumanSegTask, MnistPointCloudTask, MnistTask, MoonTask,
    Multi30kTask)}

__all__ = ['TASKS', 'CiteSeerTask', 'CoraTask', 'HumanSegTask',
           'MnistPointCloudTask', 'MnistTask', 'MoonTask', 'Multi30kTask']
