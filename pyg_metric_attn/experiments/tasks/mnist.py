"""MNIST with the paper's IPN (Table 2: d_Q = d_mlp = 100, Adam with lr 1e-4
and weight decay 1e-4, cross-entropy).

Each image is a point (its 784 standardised pixels) and each mini-batch of
``set_size`` images is a point set (see
:mod:`~pyg_metric_attn.experiments.tasks.point_sets`): one Adam step per
mini-batch, every image attending to all images of its mini-batch. At test
time the 10,000 test images, in the order of the IDX file, are cut into
consecutive sets of the same ``set_size``; each test image attends only to the
test images of its set.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pyg_metric_attn.datasets import MNIST
from pyg_metric_attn.experiments.config import setting
from pyg_metric_attn.experiments.tasks.point_sets import PointSetConfig, PointSetTask


@dataclass(frozen=True)
class MnistConfig(PointSetConfig):
    """The MNIST task's settings: the paper's d_Q = d_mlp = 100 and lr 1e-4,
    where the data are, and how many images to use (None: all)."""
    hidden: int = 100
    mlp_channels: int = 100
    lr: float = 1e-4
    root: str = setting('datasets', record=False)
    num_train: int | None = setting(None, ge=1)
    num_test: int | None = setting(None, ge=1)


class MnistTask(PointSetTask):
    """MNIST digits, IPN over mini-batches of images as point sets."""
    name = 'mnist'
    num_classes = 10
    default_attentions = ('metric', 'l2', 'dot')
    default_epochs = 20
    config_class = MnistConfig
    config: MnistConfig

    def __init__(self, config: MnistConfig | None = None, **kwargs: Any):
        super().__init__(config, **kwargs)
        self._data: tuple[torch.Tensor, ...] | None = None

    @classmethod
    def add_arguments(cls, parser: Any, command: str = 'experiment') -> None:
        parser.add_argument(
            '--root', help="data root holding MNIST/raw/ or raw/ with the four "
            "IDX files (downloaded there when missing; default: datasets)")

    def data(self) -> tuple[torch.Tensor, ...]:
        """The first ``num_train`` training and ``num_test`` test images
        (all by default), loaded once."""
        if self._data is None:
            c = self.config
            x_train, y_train = MNIST(Path(c.root), train=True).features()
            x_test, y_test = MNIST(Path(c.root), train=False).features()
            self._data = (x_train[:c.num_train], y_train[:c.num_train],
                          x_test[:c.num_test], y_test[:c.num_test])
        return self._data
