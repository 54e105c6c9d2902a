"""The experiments the runner knows, by name."""
from pyg_metric_attn.experiments.tasks.moon import MoonTask
from pyg_metric_attn.experiments.tasks.multi30k import Multi30kTask

TASKS = {task.name: task for task in (MoonTask, Multi30kTask)}

__all__ = ['TASKS', 'MoonTask', 'Multi30kTask']
