"""The experiments the runner knows, by name."""
from pyg_metric_attn.experiments.tasks.moon import MoonTask

TASKS = {task.name: task for task in (MoonTask,)}

__all__ = ['TASKS', 'MoonTask']
