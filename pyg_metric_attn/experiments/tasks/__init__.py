"""The experiments the runner knows, by name."""
from pyg_metric_attn.experiments.tasks.human_seg import HumanSegTask
from pyg_metric_attn.experiments.tasks.moon import MoonTask

TASKS = {task.name: task for task in (MoonTask, HumanSegTask)}

__all__ = ['TASKS', 'HumanSegTask', 'MoonTask']
