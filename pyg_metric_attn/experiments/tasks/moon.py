"""Two moons (Appendix A of the paper): sklearn ``make_moons``, noise 0.2,
400 training and 100 test points, IPN with d_Q = d_mlp = 10, Adam with
lr 1e-3 and weight decay 1e-4.

Attention runs over point sets of ``set_size`` (default 100) points (see
:mod:`~pyg_metric_attn.experiments.tasks.point_sets`): 4 training sets per
epoch, and the 100 test points form one set that attends only to itself.
The data are fixed by ``data_seed``.
"""
from __future__ import annotations

from typing import Any

import torch
from sklearn.datasets import make_moons

from pyg_metric_attn.experiments.tasks.point_sets import (
    POINT_SET_DEFAULTS,
    PointSetTask,
)


def moon_data(num_train: int = 400, num_test: int = 100, noise: float = 0.2,
              seed: int = 0) -> tuple[torch.Tensor, ...]:
    """``(x_train, y_train, x_test, y_test)`` from one ``make_moons`` draw."""
    x, y = make_moons(num_train + num_test, noise=noise, random_state=seed)
    x = torch.tensor(x, dtype=torch.float)
    y = torch.tensor(y, dtype=torch.long)
    return x[:num_train], y[:num_train], x[num_train:], y[num_train:]


class MoonTask(PointSetTask):
    """Two moons, IPN over point sets (the paper's Appendix A)."""
    name = 'moon'
    num_classes = 2
    default_epochs = 200
    defaults: dict[str, Any] = dict(POINT_SET_DEFAULTS, noise=0.2, num_train=400,
                                    num_test=100, data_seed=0)

    def data(self) -> tuple[torch.Tensor, ...]:
        o = self.options
        return moon_data(o['num_train'], o['num_test'], o['noise'],
                         o['data_seed'])
