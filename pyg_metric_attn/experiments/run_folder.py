"""The run folders ``train`` writes: a task and its model rebuilt from one."""
from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

    from pyg_metric_attn.experiments.task import Task


def load_run(run: str | Path, task_name: str, options: dict[str, Any],
             command: str = 'evaluate', device: str = 'cpu',
             precision: str = 'fp32') -> tuple[Task, torch.nn.Module, str]:
    """``(task, model, description)`` of a run folder written by ``train``:
    the task with the run's options (``options`` replacing them, e.g.
    another ``root``), its model holding the best checkpoint, and a line
    naming the run and the checkpoint's epoch. The run must be one of the
    task ``task_name`` (``command``: the command that reads it, for the
    error message). The checkpoint is read onto the CPU, then the model is
    moved to ``device``: a run trained on CUDA evaluates and predicts on a
    CPU-only machine."""
    from pyg_metric_attn.experiments.tasks import TASKS
    from pyg_metric_attn.training import load_best_model

    run = Path(run)
    if not (run / 'config.json').is_file():
        raise FileNotFoundError(f"'{run}' is no run folder of train (no "
                                f"config.json); give the --out folder of a "
                                f"train command")
    config = json.loads((run / 'config.json').read_text())
    trained_by = config.get('task', 'human_seg')  # folders of before 'task'
    if trained_by != task_name:
        raise ValueError(f"'{run}' is a run of the {trained_by} task: "
                         f"'pyg-metric-attn {command} {trained_by} "
                         f"{run} ...'")
    task_cls = TASKS[task_name]
    recorded = task_cls.run_options(config['options'],
                                    config.get('config_version', 1), f"'{run}'")
    task = task_cls(epochs=config['epochs'], progress=False, device=device,
                    precision=precision, **{**recorded, **options})
    model = task.build_model(config['attention'])
    state = load_best_model(model, run)
    model = task.placement.move(model)
    return task, model, (f"{run}: {config['attention']} (seed "
                         f"{config['seed']}), checkpoint of epoch {state['epoch']}")
