"""Two moons (Appendix A of the paper): sklearn ``make_moons``, noise 0.2,
400 training and 100 test points, IPN with d_Q = d_mlp = 10, Adam with
lr 1e-3 and weight decay 1e-4.

Attention runs over point sets of ``set_size`` (default 100) points (see
:mod:`~pyg_metric_attn.experiments.tasks.point_sets`): 4 training sets per
epoch, and the 100 test points form one set that attends only to itself.
The data are fixed by ``data_seed``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from pyg_metric_attn.experiments.config import setting
from pyg_metric_attn.experiments.tasks.point_sets import PointSetConfig, PointSetTask
from pyg_metric_attn.utils.optional import needs_extra

with needs_extra('experiments'):
    from sklearn.datasets import make_moons


def moon_data(num_train: int = 400, num_test: int = 100, noise: float = 0.2,
              seed: int = 0) -> tuple[torch.Tensor, ...]:
    """``(x_train, y_train, x_test, y_test)`` from one ``make_moons`` draw."""
    x, y = make_moons(num_train + num_test, noise=noise, random_state=seed)
    x = torch.tensor(x, dtype=torch.float)
    y = torch.tensor(y, dtype=torch.long)
    return x[:num_train], y[:num_train], x[num_train:], y[num_train:]


@dataclass(frozen=True)
class MoonConfig(PointSetConfig):
    """The moon task's settings: the point-set ones and the data's."""
    noise: float = setting(0.2, ge=0)
    num_train: int = setting(400, ge=1)
    num_test: int = setting(100, ge=1)
    #: Seed of the one make_moons draw (the runs' seeds do not change it).
    data_seed: int = 0


class MoonTask(PointSetTask):
    """Two moons, IPN over point sets (the paper's Appendix A)."""
    name = 'moon'
    num_classes = 2
    default_epochs = 200
    config_class = MoonConfig
    config: MoonConfig

    def data(self) -> tuple[torch.Tensor, ...]:
        c = self.config
        return moon_data(c.num_train, c.num_test, c.noise, c.data_seed)
