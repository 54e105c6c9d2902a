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
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from pyg_metric_attn.experiments.task import Task
from pyg_metric_attn.nn.models import IPN
from pyg_metric_attn.training.trainer import Trainer, seed_everything
from pyg_metric_attn.utils.point_sets import shuffled_sets

#: Options every point-set task has (subclasses extend and override them).
POINT_SET_DEFAULTS: dict[str, Any] = dict(
    hidden=10, mlp_channels=10, num_layers=1, heads=1, time_scale=1.0,
    learn_time_scale=False, lr=1e-3, weight_decay=1e-4, set_size=100,
    validation=0)


def consecutive_sets(num_points: int, set_size: int) -> Tensor:
    """The ``batch`` vector that cuts ``range(num_points)`` into consecutive
    sets of ``set_size`` points (the last one may be smaller)."""
    if set_size < 1:
        raise ValueError(f"'set_size' must be positive, got {set_size}")
    return torch.arange(num_points) // set_size


class PointSetTask(Task):
    """IPN point-set classification; subclasses provide :meth:`data`."""
    num_classes: ClassVar[int]

    @abstractmethod
    def data(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(x_train, y_train, x_test, y_test)``."""

    def run(self, attention: str, seed: int) -> dict[str, Any]:
        o = self.options
        x_train, y_train, x_test, y_test = self.data()
        held_out = o['validation']
        if not 0 <= held_out < x_train.size(0):
            raise ValueError(f"'validation' must be in [0, {x_train.size(0)}) "
                             f"(training points), got {held_out}")
        split = x_train.size(0) - held_out
        evaluated = {'test': (x_test, y_test)}
        if held_out:
            evaluated['val'] = (x_train[split:], y_train[split:])
            x_train, y_train = x_train[:split], y_train[:split]
        evaluation_sets = {name: (x, y, consecutive_sets(x.size(0), o['set_size']))
                           for name, (x, y) in evaluated.items()}
        seed_everything(seed)
        model = IPN(x_train.size(1), o['hidden'], self.num_classes,
                    num_layers=o['num_layers'], attention=attention,
                    heads=o['heads'], mlp_channels=o['mlp_channels'],
                    time_scale=o['time_scale'],
                    learn_time_scale=o['learn_time_scale'])
        optimizer = torch.optim.Adam(model.parameters(), lr=o['lr'],
                                     weight_decay=o['weight_decay'])

        def batches(epoch: int):
            generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            for index in shuffled_sets(len(x_train), o['set_size'], generator):
                yield x_train[index], y_train[index]

        def step(model: torch.nn.Module, batch) -> Tensor:
            x, y = batch
            return F.cross_entropy(model(x), y)

        def evaluate(model: torch.nn.Module) -> dict[str, float]:
            metrics = {}
            for name, (x, y, sets) in evaluation_sets.items():
                logits = model(x, batch=sets)
                metrics[f'{name}_loss'] = float(F.cross_entropy(logits, y))
                metrics[f'{name}_acc'] = float((logits.argmax(-1) == y).float().mean())
            return metrics

        trainer = Trainer(model, optimizer, step, evaluate,
                          progress=self.progress,
                          desc=f'{self.name} {attention} seed {seed}')
        history = trainer.fit(batches, self.epochs)
        final = {k: v for k, v in history[-1].items()
                 if k.startswith(('test_', 'val_'))}
        return {'history': history, 'final': final}
