"""Runs a task over a grid of (attention, seed) pairs.

Each finished run is written to ``OUT/runs/ATTENTION-seedSEED.json``; a re-run
skips pairs already finished with the same config, a crashed run is recorded
(with its traceback) and the grid goes on. At the end the report (figures and
summary table) is written from all runs in the folder.
"""
from __future__ import annotations

import json
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from pyg_metric_attn.experiments.report import write_report
from pyg_metric_attn.experiments.task import Task
from pyg_metric_attn.utils.io import atomic_write_json


def run_path(out_dir: Path, attention: str, seed: int) -> Path:
    return out_dir / 'runs' / f'{attention}-seed{seed}.json'


def _finished(path: Path, config: dict[str, Any]) -> dict[str, Any] | None:
    """The saved run at ``path`` if it finished with ``config``, else None."""
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    if record.get('status') == 'ok' and record.get('task_config') == config:
        return record
    return None


def run_experiment(task: Task, attentions: Sequence[str], seeds: Sequence[int],
                   out_dir: str | Path, progress: bool = True) -> dict[str, Any]:
    """Run (or reuse) every ``(attention, seed)`` run and write the report.

    Returns the report summary: per attention the final metric's mean, std,
    best, worst, seconds per epoch and per run, and the failed runs.
    """
    out_dir = Path(out_dir)
    task.work_dir = out_dir
    config = json.loads(json.dumps(task.recorded_config()))  # as read back
    records = []
    grid = [(attention, seed) for attention in attentions for seed in seeds]
    bar = tqdm(grid, desc=task.name, disable=not progress, dynamic_ncols=True)
    for attention, seed in bar:
        bar.set_postfix(attention=attention, seed=seed)
        path = run_path(out_dir, attention, seed)
        record = _finished(path, config)
        if record is None:
            record = _run_one(task, attention, seed, config)
            atomic_write_json(path, record)
            if record['status'] != 'ok':
                tqdm.write(f"{task.name}: {attention} seed {seed} failed: "
                           f"{record['error']}")
        records.append(record)
    bar.close()
    return write_report(task, records, out_dir)


def _run_one(task: Task, attention: str, seed: int,
             config: dict[str, Any]) -> dict[str, Any]:
    record: dict[str, Any] = {'task': task.name, 'attention': attention,
                              'seed': seed, 'task_config': config}
    start = time.perf_counter()
    try:
        result = task.run(attention, seed)
    except Exception as error:  # a crashed run is reported; the grid goes on
        record.update(status='failed', error=f'{type(error).__name__}: {error}',
                      traceback=traceback.format_exc())
    else:
        record.update(status='ok', **result)
    record['wall_seconds'] = time.perf_counter() - start
    return record
