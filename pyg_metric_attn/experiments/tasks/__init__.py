"""The experiments the runner knows, by name. Each task's module is imported
when the task is first asked for (:func:`load_task`, :data:`TASKS`), so that
one task needs only its own dependencies (human_seg's mesh packages, for
example, are no concern of moon's)."""
from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyg_metric_attn.experiments.task import Task

#: Task name -> ``(module under this package, class)``.
TASK_PATHS: dict[str, tuple[str, str]] = {
    'citeseer': ('planetoid', 'CiteSeerTask'),
    'cora': ('planetoid', 'CoraTask'),
    'human_seg': ('human_seg', 'HumanSegTask'),
    'mnist': ('mnist', 'MnistTask'),
    'mnist_point_clouds': ('mnist_point_clouds', 'MnistPointCloudTask'),
    'moon': ('moon', 'MoonTask'),
    'multi30k': ('multi30k', 'Multi30kTask'),
}
_CLASSES = {cls: (module, cls) for module, cls in TASK_PATHS.values()}


def load_task(name: str) -> type[Task]:
    """The task class of ``name``, its module imported now (a missing extra
    raises :class:`ModuleNotFoundError` naming it)."""
    if name not in TASK_PATHS:
        raise KeyError(f"Unknown task '{name}'; expected one of "
                       f"{', '.join(TASK_PATHS)}")
    return _import(*TASK_PATHS[name])


def _import(module: str, cls: str) -> type[Task]:
    return getattr(importlib.import_module(f'{__name__}.{module}'), cls)


class _Tasks(Mapping[str, 'type[Task]']):
    """Name -> task class, each imported on first access."""
    def __getitem__(self, name: str) -> type[Task]:
        return load_task(name)

    def __iter__(self) -> Iterator[str]:
        return iter(TASK_PATHS)

    def __len__(self) -> int:
        return len(TASK_PATHS)


#: Every task by name, imported on access: ``TASKS['moon']``.
TASKS: Mapping[str, type[Task]] = _Tasks()


def __getattr__(name: str) -> type[Task]:
    """The task classes by class name (``from ... import MoonTask``),
    imported on first use."""
    if name not in _CLASSES:
        raise AttributeError(f"module '{__name__}' has no attribute '{name}'")
    return _import(*_CLASSES[name])


__all__ = ['TASKS', 'TASK_PATHS', 'load_task', *_CLASSES]
