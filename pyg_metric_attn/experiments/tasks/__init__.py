"""The experiments the runner knows, by name."""
from pyg_metric_attn.experiments.tasks.human_seg import HumanSegTask
from pyg_metric_attn.experiments.tasks.moon import MoonTask
from pyg_metric_attn.experiments.tasks.multi30k import Multi30kTask

TASKS = {task.name: task for task in (MoonTask, HumanSegTask, Multi30kTask)}

__all__ = ['TASKS', 'HumanSegTask', 'MoonTask', 'Multi30kTask']
