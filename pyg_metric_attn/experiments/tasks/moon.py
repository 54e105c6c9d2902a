"""Two moons (Appendix A of the paper): sklearn ``make_moons``, noise 0.2,
400 training and 100 test points, IPN with d_Q = d_mlp = 10, Adam with
lr 1e-3 and weight decay 1e-4.

Attention runs over point sets: each epoch the 400 training points are
shuffled into sets of ``set_size`` (default 100) points, one optimiser step per
set, and every point attends to all points of its set. At evaluation the 100
test points form one set of the same size and attend only to each other; every
attention type sees exactly the same sets. The data are fixed by
``data_seed``; the run's seed sets the initialisation and the set order.
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from sklearn.datasets import make_moons

from pyg_metric_attn.experiments.task import Task
from pyg_metric_attn.nn.models import IPN
from pyg_metric_attn.training.trainer import Trainer, seed_everything
from pyg_metric_attn.utils.point_sets import shuffled_sets


def moon_data(num_train: int = 400, num_test: int = 100, noise: float = 0.2,
              seed: int = 0) -> tuple[torch.Tensor, ...]:
    """``(x_train, y_train, x_test, y_test)`` from one ``make_moons`` draw."""
    x, y = make_moons(num_train + num_test, noise=noise, random_state=seed)
    x = torch.tensor(x, dtype=torch.float)
    y = torch.tensor(y, dtype=torch.long)
    return x[:num_train], y[:num_train], x[num_train:], y[num_train:]


class MoonTask(Task):
    """Two moons, IPN over point sets (the paper's Appendix A)."""
    name = 'moon'
    defaults: dict[str, Any] = dict(hidden=10, mlp_channels=10, num_layers=1,
                                    heads=1, lr=1e-3, weight_decay=1e-4,
                                    set_size=100, noise=0.2, num_train=400,
                                    num_test=100, data_seed=0)

    def __init__(self, epochs: int | None = None, progress: bool = True,
                 **options: Any):
        unknown = set(options) - set(self.defaults)
        if unknown:
            raise ValueError(f"Unknown moon options {sorted(unknown)}; known: "
                             f"{sorted(self.defaults)}")
        super().__init__(epochs=epochs or 200, progress=progress,
                         **{**self.defaults, **options})

    def run(self, attention: str, seed: int) -> dict[str, Any]:
        o = self.options
        x_train, y_train, x_test, y_test = moon_data(
            o['num_train'], o['num_test'], o['noise'], o['data_seed'])
        seed_everything(seed)
        model = IPN(2, o['hidden'], 2, num_layers=o['num_layers'],
                    attention=attention, heads=o['heads'],
                    mlp_channels=o['mlp_channels'])
        optimizer = torch.optim.Adam(model.parameters(), lr=o['lr'],
                                     weight_decay=o['weight_decay'])

        def batches(epoch: int):
            generator = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
            for index in shuffled_sets(len(x_train), o['set_size'], generator):
                yield x_train[index], y_train[index]

        def step(model: torch.nn.Module, batch) -> torch.Tensor:
            x, y = batch
            return F.cross_entropy(model(x), y)

        def evaluate(model: torch.nn.Module) -> dict[str, float]:
            logits = model(x_test)
            return {'test_loss': float(F.cross_entropy(logits, y_test)),
                    'test_acc': float((logits.argmax(-1) == y_test).float().mean())}

        trainer = Trainer(model, optimizer, step, evaluate,
                          progress=self.progress,
                          desc=f'moon {attention} seed {seed}')
        history = trainer.fit(batches, self.epochs)
        final = {k: v for k, v in history[-1].items() if k.startswith('test_')}
        return {'history': history, 'final': final}
