"""What the experiment runner and the command line need to know about a task."""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from pyg_metric_attn.experiments.config import (
    TaskConfig,
    build_config,
    flat_options,
    parse_option,
)
from pyg_metric_attn.training.device import Placement

if TYPE_CHECKING:
    import torch

    from pyg_metric_attn.training import DistributedContext, Trainer

#: The commands a task may support beyond ``experiment``, and the method
#: that does so (:meth:`Task.supports`).
COMMANDS = {'train': 'fit', 'evaluate': 'evaluate_split',
            'predict': 'predict_files'}


class Task(ABC):
    """One experiment: trains one model for an ``(attention, seed)`` pair.

    A task's settings are its :attr:`config`, an instance of
    :attr:`config_class` (a :class:`~pyg_metric_attn.experiments.config.TaskConfig`
    dataclass): pass one, or its fields by name (``lr=1e-3``; a nested
    config's fields as ``former_heads=8``), or both (the names replace the
    config's fields).

    Subclasses set the class attributes and implement :meth:`run`, which
    returns ``{'history': [per-epoch rows], 'final': {metric: value}, ...}``.
    History rows hold at least ``epoch``, ``train_loss`` and
    ``epoch_seconds`` (see :class:`~pyg_metric_attn.training.Trainer`).
    Tasks that implement :meth:`fit` (and :meth:`build_model`),
    :meth:`evaluate_split` or :meth:`predict_files` also run under the
    ``train``, ``evaluate`` and ``predict`` commands.

    ``device`` (``'auto'``, ``'cpu'``, ``'cuda'``, ``'cuda:N'``) and
    ``precision`` (``'fp32'``, ``'bf16'``) are the task's :attr:`placement`:
    it trains, evaluates and predicts there (the default: CPU, float32).
    """
    name: ClassVar[str]
    config_class: ClassVar[type[TaskConfig]]
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
    #: The data splits :meth:`evaluate_split` scores, the first by default.
    splits: ClassVar[tuple[str, ...]] = ('test', 'train')
    #: The version of :attr:`config_class`'s defaults, recorded with every
    #: run ``train`` writes (a run records the options it was given, the
    #: rest are the defaults of its version).
    config_version: ClassVar[int] = 1
    #: Per earlier version, the defaults that have changed since: a run of
    #: that version is rebuilt with them under its own options.
    earlier_defaults: ClassVar[dict[int, dict[str, Any]]] = {}
    #: Options of earlier versions that are gone, each with the last commit
    #: that has it: a run folder trained with one is refused with its name.
    retired_options: ClassVar[dict[str, str]] = {}

    def __init__(self, config: TaskConfig | None = None, *,
                 epochs: int | None = None, progress: bool = True,
                 device: str | torch.device = 'cpu', precision: str = 'fp32',
                 **options: Any):
        self.config = build_config(self.config_class, options, self.name, config)
        self.epochs = epochs or self.default_epochs
        self.progress = progress
        self.placement = Placement.of(device, precision)

    @classmethod
    def run_options(cls, recorded: dict[str, Any], version: int,
                    run: str = 'the run') -> dict[str, Any]:
        """The options that rebuild a run recorded with the config
        ``version``: its ``recorded`` options over the defaults that have
        changed since. A run with a retired option is refused."""
        if version > cls.config_version:
            raise ValueError(f"{run} was written by a newer pyg-metric-attn "
                             f"(config version {version}; this one reads up "
                             f"to {cls.config_version})")
        retired = sorted(set(recorded) & set(cls.retired_options))
        if retired:
            commits = ', '.join(f'{name} (last in {cls.retired_options[name]})'
                                for name in retired)
            raise ValueError(f"{run} was trained with options that have left "
                             f"pyg-metric-attn: {commits}; check out that commit "
                             f"to use it")
        defaults: dict[str, Any] = {}
        for earlier in range(version, cls.config_version):
            defaults = {**cls.earlier_defaults.get(earlier, {}), **defaults}
        return {**defaults, **recorded}

    @classmethod
    def parse_option(cls, text: str) -> tuple[str, Any]:
        """``KEY=VALUE`` from the command line as a checked option."""
        return parse_option(cls.config_class, text, cls.name)

    @classmethod
    def add_arguments(cls, parser: Any, command: str = 'experiment') -> None:
        """Add this task's command-line flags for ``command`` (e.g.
        ``--root``) to ``parser`` (an argparse argument group). Each flag's
        ``dest`` is passed to the constructor as a keyword when given; flags
        default to :obj:`None`."""
        return None

    @classmethod
    def supports(cls, command: str) -> bool:
        """Whether the task runs under ``command`` (``'train'``,
        ``'evaluate'``, ``'predict'``; every task runs ``'experiment'``)."""
        if command == 'experiment':
            return True
        method = COMMANDS[command]
        return getattr(cls, method) is not getattr(Task, method)

    @abstractmethod
    def run(self, attention: str, seed: int) -> dict[str, Any]:
        """Train and evaluate one model; see the class docstring."""

    def recorded_config(self) -> dict[str, Any]:
        """Settings recorded with every run (a finished run is reused only if
        its recorded config equals the current one)."""
        precision = self.placement.precision
        return {'epochs': self.epochs,
                **({'precision': precision} if precision != 'fp32' else {}),
                **flat_options(self.config, recorded_only=True)}

    # Commands beyond `experiment` (optional) --------------------------------
    def build_model(self, attention: str) -> torch.nn.Module:
        """A freshly initialised model of ``attention`` (what :meth:`fit`
        trains; ``evaluate`` and ``predict`` load checkpoints into it)."""
        raise NotImplementedError(f"The {self.name} task builds no model on "
                                  f"its own")

    def prepare_data(self) -> None:
        """Load the task's data, downloading or processing them where that
        is needed (``train`` runs this on the first process before the
        others)."""
        return None

    def fit(self, attention: str, seed: int, out_dir: str | Path | None = None,
            resume: bool = False,
            before_training: Callable[[], None] | None = None,
            distributed: DistributedContext | None = None
            ) -> tuple[torch.nn.Module, Trainer]:
        """Train one model with :class:`~pyg_metric_attn.training.Trainer`
        (checkpoints and metrics in ``out_dir`` when given; ``resume``: from
        its last checkpoint). ``before_training`` is called once the resume
        is known to be valid, before anything is written; ``distributed``:
        this process's part in a run of several (under ``torchrun``)."""
        raise NotImplementedError(f"The {self.name} task does not support "
                                  f"'train'")

    def shipped_model(self) -> Any:
        """The trained model shipped with the package for this task, which
        ``predict`` uses without a run folder (it has ``predict_files(paths,
        out_dir)`` and a ``description``)."""
        raise NotImplementedError(f"No trained {self.name} model ships with "
                                  f"the package: give a run folder written by "
                                  f"train")

    def save_example(self, model: torch.nn.Module, out_dir: Path) -> list[Path]:
        """Files that show a trained model's results (e.g. a rendering),
        written to ``out_dir``; the paths written."""
        return []

    def evaluate_split(self, model: torch.nn.Module,
                       split: str) -> tuple[dict[str, Any], str]:
        """``(metrics, report)`` of ``model`` on ``split`` (one of
        :attr:`splits`): the metrics as JSON-ready values and their text for
        the terminal."""
        raise NotImplementedError(f"The {self.name} task does not support "
                                  f"'evaluate'")

    def predict_files(self, model: torch.nn.Module, paths: Sequence[Path],
                      out_dir: Path) -> Iterator[tuple[Path, str | Exception]]:
        """Predictions of ``model`` for the input files ``paths``, written to
        ``out_dir``: per file ``(path, what was written)``, or ``(path,
        error)`` for a file that cannot be read (the others go on)."""
        raise NotImplementedError(f"The {self.name} task does not support "
                                  f"'predict'")
