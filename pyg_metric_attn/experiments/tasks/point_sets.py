"""Classification with the paper's IPN where attention runs within point sets.

Each epoch the training points are shuffled into sets of ``set_size``, one
Adam step per set, and every point attends to all points of its set (itself
included). At evaluation the test points, in their fixed order, are cut into
consecutive sets of the same ``set_size`` and attend only to the test points
of their own set (test labels are never used); every attention type sees
exactly the same test sets. The run's seed sets the initialisation and the
order of the training sets; the data do not depend on it.

With ``validation=N`` the last ``N`` training points are held out: the model
trains on the others, and every epoch also reports ``val_loss``/``val_acc``
on the held-out points (cut into consecutive sets like the test points), so
settings can be chosen without looking at the test set.
"""
from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from pyg_metric_attn.experiments.attention import attention_factory, metric_options
from pyg_metric_attn.experiments.config import TaskConfig, setting
from pyg_metric_attn.experiments.task import Task
from pyg_metric_attn.nn.models import IPN
from pyg_metric_attn.nn.normalization import Normalization
from pyg_metric_attn.training import (
    DistributedContext,
    Trainer,
    epoch_generator,
    eval_mode,
    seed_everything,
)
from pyg_metric_attn.utils.point_sets import shuffled_sets


@dataclass(frozen=True)
class PointSetConfig(TaskConfig):
    """Settings every point-set task has (subclasses add their data's and
    change defaults)."""
    #: Width d_Q of the IPN's propagated features.
    hidden: int = setting(10, ge=1)
    #: Hidden width d_mlp of the metric map phi.
    mlp_channels: int = setting(10, ge=1)
    num_layers: int = setting(1, ge=1)
    heads: int = setting(1, ge=1)
    #: Heat-kernel time t of metric/l2/dot (the paper's: 1).
    time_scale: float | Literal['matched'] = setting(1.0, gt=0)
    learn_time_scale: bool = False
    #: Normalisation of the similarities of metric/l2/dot ('row': the
    #: paper's softmax; 'column', 'sinkhorn', 'global': per set).
    normalization: Normalization = 'row'
    sinkhorn_iterations: int = setting(3, ge=1)
    #: Dropout of the IPN's inputs and of its propagated features before the
    #: output map, and of the attention weights (the paper's IPN: none).
    dropout: float = setting(0.0, ge=0, lt=1)
    attention_dropout: float = setting(0.0, ge=0, lt=1)
    lr: float = setting(1e-3, gt=0)
    weight_decay: float = setting(1e-4, ge=0)
    #: Points per set.
    set_size: int = setting(100, ge=1)
    #: Training points held out for validation (the last ones).
    validation: int = setting(0, ge=0)


def consecutive_sets(num_points: int, set_size: int) -> Tensor:
    """The ``batch`` vector that cuts ``range(num_points)`` into consecutive
    sets of ``set_size`` points (the last one may be smaller)."""
    if set_size < 1:
        raise ValueError(f"'set_size' must be positive, got {set_size}")
    return torch.arange(num_points) // set_size


class PointSetTask(Task):
    """IPN point-set classification; subclasses provide :meth:`data`."""
    num_classes: ClassVar[int]
    config: PointSetConfig
    splits = ('test', 'val', 'train')

    @abstractmethod
    def data(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(x_train, y_train, x_test, y_test)``."""

    def split_data(self) -> dict[str, tuple[Tensor, Tensor]]:
        """``{'train': (x, y), 'test': ..., 'val': ...}``, ``'val'`` (the
        last ``validation`` training points) only where they are held out."""
        x_train, y_train, x_test, y_test = self.data()
        held_out = self.config.validation
        if not 0 <= held_out < x_train.size(0):
            raise ValueError(f"'validation' must be in [0, {x_train.size(0)}) "
                             f"(training points), got {held_out}")
        split = x_train.size(0) - held_out
        splits = {'train': (x_train[:split], y_train[:split]),
                  'test': (x_test, y_test)}
        if held_out:
            splits['val'] = (x_train[split:], y_train[split:])
        return splits

    def build_model(self, attention: str) -> IPN:
        c = self.config
        conv = attention_factory(
            attention, heads=c.heads, concat=False,
            dropout=c.attention_dropout,
            **metric_options(attention, value=False,
                             mlp_channels=c.mlp_channels,
                             time_scale=c.time_scale,
                             learn_time_scale=c.learn_time_scale,
                             normalization=c.normalization,
                             sinkhorn_iterations=c.sinkhorn_iterations))
        return IPN(self.data()[0].size(1), c.hidden, self.num_classes,
                   c.num_layers, conv=conv, dropout=c.dropout)

    def scores(self, model: torch.nn.Module, name: str, x: Tensor,
               y: Tensor) -> dict[str, float]:
        """``NAME_loss`` and ``NAME_acc`` of ``model`` on the points ``x``,
        cut into consecutive sets of ``set_size``."""
        sets = consecutive_sets(x.size(0), self.config.set_size).to(x.device)
        logits = model(x, batch=sets)
        return {f'{name}_loss': float(F.cross_entropy(logits, y)),
                f'{name}_acc': float((logits.argmax(-1) == y).float().mean())}

    def prepare_data(self) -> None:
        self.data()

    def fit(self, attention: str, seed: int, out_dir: str | Path | None = None,
            resume: bool = False,
            before_training: Callable[[], None] | None = None,
            distributed: DistributedContext | None = None
            ) -> tuple[IPN, Trainer]:
        if distributed is not None and distributed.is_distributed:
            raise ValueError(f"The {self.name} task trains in one process: "
                             f"run it without torchrun")
        c = self.config
        splits = self.placement.move(self.split_data())  # all of it, once
        x_train, y_train = splits.pop('train')
        seed_everything(seed)
        model = self.placement.move(self.build_model(attention))
        optimizer = torch.optim.Adam(model.parameters(), lr=c.lr,
                                     weight_decay=c.weight_decay)

        def batches(epoch: int):
            generator = epoch_generator(seed, epoch)
            for index in shuffled_sets(len(x_train), c.set_size, generator):
                index = index.to(x_train.device)
                yield x_train[index], y_train[index]

        def step(model: torch.nn.Module, batch) -> Tensor:
            x, y = batch
            return F.cross_entropy(model(x), y)

        def evaluate(model: torch.nn.Module) -> dict[str, float]:
            metrics = {}
            for name, (x, y) in splits.items():
                metrics.update(self.scores(model, name, x, y))
            return metrics

        trainer = Trainer(model, optimizer, step, evaluate, out_dir=out_dir,
                          progress=self.progress, placement=self.placement,
                          desc=f'{self.name} {attention} seed {seed}')
        trainer.fit(batches, self.epochs, resume, before_training)
        return model, trainer

    def run(self, attention: str, seed: int) -> dict[str, Any]:
        _, trainer = self.fit(attention, seed)
        history = trainer.history
        final = {k: v for k, v in history[-1].items()
                 if k.startswith(('test_', 'val_'))}
        return {'history': history, 'final': final}

    def evaluate_split(self, model: torch.nn.Module,
                       split: str) -> tuple[dict[str, Any], str]:
        splits = self.split_data()
        if split not in splits:
            raise ValueError(f"No '{split}' split: it is the last "
                             f"'validation' training points; set "
                             f"-o validation=N")
        model = self.placement.move(model)
        with eval_mode(model), self.placement.autocast():
            metrics = self.scores(model, split,
                                  *self.placement.move(splits[split]))
        return metrics, '\n'.join(f'{key}: {value:.4f}'
                                   for key, value in metrics.items())
