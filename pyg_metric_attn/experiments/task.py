"""What the experiment runner needs to know about a task."""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar


class Task(ABC):
    """One experiment: trains one model for an ``(attention, seed)`` pair.

    Subclasses set the class attributes and implement :meth:`run`, which
    returns ``{'history': [per-epoch rows], 'final': {metric: value},
    'config': {...}}``. History rows hold at least ``epoch``, ``train_loss``
    and ``epoch_seconds`` (see :class:`~pyg_metric_attn.training.Trainer`).
    """
    name: ClassVar[str]
    #: Attention types run when the command line names none.
    default_attentions: ClassVar[tuple[str, ...]] = ('metric', 'l2', 'dot', 'gat')
    #: The final metric the summary table and violin plot report.
    final_metric: ClassVar[str] = 'test_acc'
    #: Per-epoch metrics drawn as curves (mean and min-max band).
    curve_metrics: ClassVar[tuple[str, ...]] = ('train_loss', 'test_acc')
    #: Whether a larger ``final_metric`` is better.
    higher_is_better: ClassVar[bool] = True
    #: Set by the runner to the experiment folder: where a task may keep
    #: per-run checkpoints so that an interrupted run resumes.
    work_dir: Path | None = None
    #: Epochs per run when none are given.
    default_epochs: ClassVar[int | None] = None
    #: The task's options and their defaults; when set, other options are
    #: refused and the defaults fill in the ones not given.
    defaults: ClassVar[dict[str, Any] | None] = None

    def __init__(self, epochs: int | None = None, progress: bool = True,
                 **options: Any):
        if self.defaults is not None:
            options = self.with_defaults(self.defaults, options)
        self.epochs = epochs or self.default_epochs
        self.progress = progress
        self.options = options

    @classmethod
    def with_defaults(cls, defaults: dict[str, Any],
                      options: dict[str, Any]) -> dict[str, Any]:
        """``options`` filled in from ``defaults``; an option that
        ``defaults`` does not name, or whose value is not of its default's
        kind (a number, an integer, a bool), is an error."""
        unknown = set(options) - set(defaults)
        if unknown:
            raise ValueError(f"Unknown {cls.name} options {sorted(unknown)}; "
                             f"known: {sorted(defaults)}")
        for key, value in options.items():
            expected = _kind_error(defaults[key], value)
            if expected:
                raise ValueError(f"{cls.name} option {key}={value!r} must be "
                                 f"{expected} (default: {defaults[key]!r})")
        return {**defaults, **options}

    @classmethod
    def add_arguments(cls, parser: Any) -> None:
        """Add this task's command-line flags (e.g. ``--root``) to ``parser``
        (an argparse argument group). Each flag's ``dest`` is passed to the
        constructor as a keyword when given; flags default to :obj:`None`."""
        return None

    @abstractmethod
    def run(self, attention: str, seed: int) -> dict[str, Any]:
        """Train and evaluate one model; see the class docstring."""

    def config(self) -> dict[str, Any]:
        """Settings recorded with every run (a finished run is reused only if
        its recorded config equals the current one)."""
        return {'epochs': self.epochs, **self.options}


def _kind_error(default: Any, value: Any) -> str | None:
    """What ``value`` should be where it is not of the kind of ``default``
    (options without a bool or number default take any value)."""
    if isinstance(default, bool):
        return None if isinstance(value, bool) else 'True or False'
    if isinstance(value, bool):
        value = None  # a bool is no number here
    if isinstance(default, int):
        return None if isinstance(value, int) else 'an integer'
    if isinstance(default, float):
        # A dict: a value per attention type (e.g. time_scale={'metric': 2.0}).
        return None if isinstance(value, (int, float, dict)) else 'a number'
    return None
