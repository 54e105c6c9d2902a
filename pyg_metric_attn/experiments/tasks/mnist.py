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

from pathlib import Path
from typing import Any

import torch

from pyg_metric_attn.datasets import MNIST
from pyg_metric_attn.experiments.tasks.point_sets import (
    POINT_SET_DEFAULTS,
    PointSetTask,
)


class MnistTask(PointSetTask):
    """MNIST digits, IPN over mini-batches of images as point sets."""
    name = 'mnist'
    num_classes = 10
    default_attentions = ('metric', 'l2', 'dot')
    default_epochs = 20
    defaults: dict[str, Any] = dict(
        POINT_SET_DEFAULTS, root='datasets', hidden=100, mlp_channels=100,
        lr=1e-4, weight_decay=1e-4, num_train=None, num_test=None)

    def __init__(self, epochs: int | None = None, progress: bool = True,
                 **options: Any):
        super().__init__(epochs=epochs, progress=progress, **options)
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
        """The first ``num_train`` training and ``num_test`` test images
        (all by default), loaded once."""
        if self._data is None:
            o = self.options
            x_train, y_train = MNIST(Path(o['root']), train=True).features()
            x_test, y_test = MNIST(Path(o['root']), train=False).features()
            self._data = (x_train[:o['num_train']], y_train[:o['num_train']],
                          x_test[:o['num_test']], y_test[:o['num_test']])
        return self._data
