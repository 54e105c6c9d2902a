"""MNIST with the paper's IPN (Table 2: d_Q = d_mlp = 100, Adam with lr 1e-4
and weight decay 1e-4, cross-entropy).

Each image is a point (its 784 standardised pixels) and attention runs over
point sets: each epoch the training images are shuffled into mini-batches of
``batch_size``, one Adam step per mini-batch, and every image attends to all
images of its mini-batch (itself included). At test time the 10,000 test
images, in the order of the IDX file, are cut into consecutive sets of the
same ``batch_size``; each test image attends only to the test images of its
set (their labels are never used). Every attention type sees exactly the same
test sets. The run's seed sets the initialisation and the mini-batch order.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from pyg_metric_attn.datasets import MNIST
from pyg_metric_attn.experiments.task import Task
from pyg_metric_attn.nn.models import IPN
from pyg_metric_attn.training.trainer import Trainer, seed_everything
from pyg_metric_attn.utils.point_sets import shuffled_sets


def consecutive_sets(num_points: int, set_size: int) -> torch.Tensor:
    """The ``batch`` vector that cuts ``range(num_points)`` into consecutive
    sets of ``set_size`` points (the last one may be smaller)."""
    if set_size < 1:
        raise ValueError(f"'set_size' must be positive, got {set_size}")
    return torch.arange(num_points) // set_size


class MnistTask(Task):
    """MNIST digits, IPN over mini-batches of images as point sets."""
    name = 'mnist'
    default_attentions = ('metric', 'l2', 'dot')
    defaults: dict[str, Any] = dict(
        root='datasets', hidden=100, mlp_channels=100, num_layers=1, heads=1,
        time_scale=1.0, learn_time_scale=False, lr=1e-4, weight_decay=1e-4,
        batch_size=100, num_train=None, num_test=None)

    def __init__(self, epochs: int | None = None, progress: bool = True,
                 **options: Any):
        unknown = set(options) - set(self.defaults)
        if unknown:
            raise ValueError(f"Unknown mnist options {sorted(unknown)}; known: "
                             f"{sorted(self.defaults)}")
        super().__init__(epochs=epochs or 20, progress=progress,
                         **{**self.defaults, **options})
        self._data: tuple[torch.Tensor, ...] | None = None

    @classmethod
    def add_arguments(cls, parser: Any) -> None:
        parser.add_argument(
            '--root', help="data root holding MNIST/raw/ or raw/ with the four "
            "IDX files (downloaded there when missing; default: datasets)")

    def config(self) -> dict[str, Any]:
        # Where the files are read from does not change a run's result.
        return {k: v for k, v in super().config().items() if k != 'root'}

    def data(self) -> tuple[torch.Tensor, ...]:
        """``(x_train, y_train, x_test, y_test)``, loaded once."""
        if self._data is None:
            o = self.options
            root = Path(o['root'])
            x_train, y_train = MNIST(root, train=True).features()
            x_test, y_test = MNIST(root, train=False).features()
            self._data = (x_train[:o['num_train']], y_train[:o['num_train']],
                          x_test[:o['num_test']], y_test[:o['num_test']])
        return self._data

    def run(self, attention: str, seed: int) -> dict[str, Any]:
        o = self.options
        x_train, y_train, x_test, y_test = self.data()
        test_batch = consecutive_sets(x_test.size(0), o['batch_size'])
        seed_everything(seed)
        model = IPN(x_train.size(1), o['hidden'], 10, num_layers=o['num_layers'],
                    attention=attention, heads=o['heads'],
                    mlp_channels=o['mlp_channels'], time_scale=o['time_scale'],
                    learn_time_scale=o['learn_time_scale'])
        optimizer = torch.optim.Adam(model.parameters(), lr=o['lr'],
                                     weight_decay=o['weight_decay'])

        def batches(epoch: int):
            generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            for index in shuffled_sets(len(x_train), o['batch_size'], generator):
                yield x_train[index], y_train[index]

        def step(model: torch.nn.Module, batch) -> torch.Tensor:
            x, y = batch
            return F.cross_entropy(model(x), y)

        def evaluate(model: torch.nn.Module) -> dict[str, float]:
            logits = model(x_test, batch=test_batch)
            return {'test_loss': float(F.cross_entropy(logits, y_test)),
                    'test_acc': float((logits.argmax(-1) == y_test).float().mean())}

        trainer = Trainer(model, optimizer, step, evaluate,
                          progress=self.progress,
                          desc=f'mnist {attention} seed {seed}')
        history = trainer.fit(batches, self.epochs)
        final = {k: v for k, v in history[-1].items() if k.startswith('test_')}
        return {'history': history, 'final': final}
