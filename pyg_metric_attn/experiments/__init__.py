"""Experiment runner: (attention x seed) grids, JSON logs, figures, tables."""
from pyg_metric_attn.experiments.runner import run_experiment
from pyg_metric_attn.experiments.task import Task
from pyg_metric_attn.experiments.tasks import TASKS

__all__ = ['TASKS', 'Task', 'run_experiment']
