"""The experiments the runner knows, by name."""
from pyg_metric_attn.experiments.tasks.mnist import MnistTask
from pyg_metric_attn.experiments.tasks.moon import MoonTask
from pyg_metric_attn.experiments.tasks.planetoid import CiteSeerTask, CoraTask

TASKS = {task.name: task
         for task in (CiteSeerTask, CoraTask, MnistTask, MoonTask)}

__all__ = ['TASKS', 'CiteSeerTask', 'CoraTask', 'MnistTask', 'MoonTask']
