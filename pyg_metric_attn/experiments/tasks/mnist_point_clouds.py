"""MNIST digits as point clouds of their ink pixels, classified by a
:class:`~pyg_metric_attn.nn.PointSetClassifier` whose pooling is the one
thing that changes (issue 18, §2).

Every digit is the point cloud of its pixels above ``threshold``, features
``(u, v, intensity)`` (:class:`~pyg_metric_attn.datasets.MNISTPointClouds`).
The model embeds each point (Linear, ReLU), runs ``num_layers``
:class:`~pyg_metric_attn.nn.MetricAttentionConv` layers (all pairs within
each digit, with a residual map, ReLU), pools each digit into one vector and
classifies it with an MLP. ``attention`` names the pooling:

* ``'metric_pool'``: :class:`~pyg_metric_attn.nn.MetricAttentionalAggregation`
  with ``num_queries`` learned queries of ``hidden // num_queries`` channels
  each, concatenated (``hidden`` in all, as the other poolings give),
* ``'mean_pool'``: PyG's :class:`~torch_geometric.nn.aggr.MeanAggregation`
  (``global_mean_pool``),
* ``'attentional_pool'``: PyG's
  :class:`~torch_geometric.nn.aggr.AttentionalAggregation` with gate network
  ``MLP([hidden, hidden, 1])`` and value map ``Linear(hidden, hidden)``.

Training uses the first ``num_train`` training digits (all by default),
shuffled into batches of ``batch_size`` digits each epoch by the run's seed
(which also sets the initialisation); after every epoch the first
``num_test`` test digits (all 10,000 by default) are scored and the last
epoch is reported (no model selection on the test set).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torch_geometric.loader import DataLoader
from torch_geometric.nn.aggr import AttentionalAggregation, MeanAggregation
from torch_geometric.nn.dense.linear import Linear
from torch_geometric.nn.models import MLP

from pyg_metric_attn.datasets import MNISTPointClouds
from pyg_metric_attn.experiments.config import TaskConfig, setting
from pyg_metric_attn.experiments.task import Task
from pyg_metric_attn.nn import (
    MetricAttentionalAggregation,
    MetricAttentionConv,
    PointSetClassifier,
)
from pyg_metric_attn.training import (
    DistributedContext,
    Trainer,
    epoch_generator,
    eval_mode,
    seed_everything,
)

#: The poolings compared, as the runner's ``attention`` names.
POOLINGS = ('metric_pool', 'mean_pool', 'attentional_pool')


@dataclass(frozen=True)
class MnistPointCloudConfig(TaskConfig):
    """The MNIST point-cloud task's settings."""
    #: Width of the points' features (and of the classifier's hidden layer).
    hidden: int = setting(32, ge=1)
    #: Metric-attention layers between the embedding and the pooling.
    num_layers: int = setting(1, ge=0)
    heads: int = setting(1, ge=1)
    #: Heat-kernel time t of the attention layers and the metric pooling.
    time_scale: float | Literal['matched'] = setting('matched', gt=0)
    learn_time_scale: bool = False
    #: Learned queries k of the metric pooling.
    num_queries: int = setting(4, ge=1)
    #: A pixel (0-255) is a point above it.
    threshold: int = setting(0, ge=0, lt=255)
    batch_size: int = setting(32, ge=1)
    lr: float = setting(3e-3, gt=0)
    weight_decay: float = setting(0.0, ge=0)
    #: The first training and test digits used (None: all).
    num_train: int | None = setting(None, ge=1)
    num_test: int | None = setting(None, ge=1)
    root: str = setting('datasets', record=False)
    #: Where the converted point clouds are cached (default ROOT/processed).
    processed_dir: str | None = setting(None, record=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_queries > self.hidden:
            raise ValueError(f"'num_queries' ({self.num_queries}) must be at "
                             f"most 'hidden' ({self.hidden}): each query "
                             f"pools hidden // num_queries channels")


class MnistPointCloudTask(Task):
    """MNIST digits as point clouds: metric vs mean vs attentional pooling."""
    name = 'mnist_point_clouds'
    default_attentions = POOLINGS
    default_epochs = 5
    config_class = MnistPointCloudConfig
    config: MnistPointCloudConfig
    splits: ClassVar[tuple[str, ...]] = ('test', 'train')

    def __init__(self, config: MnistPointCloudConfig | None = None,
                 **kwargs: Any):
        super().__init__(config, **kwargs)
        self._data: dict[str, MNISTPointClouds] | None = None

    @classmethod
    def add_arguments(cls, parser: Any, command: str = 'experiment') -> None:
        parser.add_argument(
            '--root', help="data root holding MNIST/raw/ or raw/ with the four "
            "IDX files (default: datasets)")
        parser.add_argument('--processed-dir', help='where the point clouds '
                            'are cached (default: ROOT/processed)')

    # Data ------------------------------------------------------------------
    def datasets(self) -> dict[str, MNISTPointClouds]:
        """``{'train': ..., 'test': ...}``: the first ``num_train`` training
        and ``num_test`` test digits, loaded once."""
        if self._data is None:
            c = self.config
            common = dict(threshold=c.threshold, processed_dir=c.processed_dir,
                          log=self.progress)
            train = MNISTPointClouds(Path(c.root), train=True, **common)
            test = MNISTPointClouds(Path(c.root), train=False, **common)
            self._data = {'train': train[:c.num_train], 'test': test[:c.num_test]}
        return self._data

    def prepare_data(self) -> None:
        self.datasets()

    # Model -----------------------------------------------------------------
    def build_pool(self, pooling: str) -> tuple[torch.nn.Module, int]:
        """``(pool, its output channels)`` of a pooling name."""
        c = self.config
        if pooling == 'metric_pool':
            per_query = c.hidden // c.num_queries
            pool = MetricAttentionalAggregation(
                c.hidden, per_query, num_queries=c.num_queries,
                time_scale=c.time_scale, learn_time_scale=c.learn_time_scale)
            return pool, c.num_queries * per_query
        if pooling == 'mean_pool':
            return MeanAggregation(), c.hidden
        if pooling == 'attentional_pool':
            gate = MLP([c.hidden, c.hidden, 1], norm=None)
            return AttentionalAggregation(gate, Linear(c.hidden, c.hidden)), c.hidden
        raise ValueError(f"Unknown pooling '{pooling}'; expected one of "
                         f"{POOLINGS}")

    def build_model(self, attention: str) -> PointSetClassifier:
        c = self.config
        pool, pool_channels = self.build_pool(attention)
        convs = [MetricAttentionConv(c.hidden, c.hidden, heads=c.heads,
                                     concat=False, time_scale=c.time_scale,
                                     learn_time_scale=c.learn_time_scale,
                                     residual=True)
                 for _ in range(c.num_layers)]
        return PointSetClassifier(3, c.hidden, 10, convs, pool,
                                  pool_channels=pool_channels)

    # Training --------------------------------------------------------------
    @staticmethod
    def logits(model: torch.nn.Module, batch: Any) -> Tensor:
        return model(batch.x, batch.batch, batch.num_graphs)

    def scores(self, model: torch.nn.Module, split: str) -> dict[str, float]:
        """``SPLIT_loss`` and ``SPLIT_acc`` of ``model`` on a split."""
        loss, correct, total = 0.0, 0, 0
        loader = DataLoader(self.datasets()[split], batch_size=256,
                            pin_memory=self.placement.pin_memory)
        for batch in loader:
            batch = self.placement.move(batch)
            logits = self.logits(model, batch)
            loss += float(F.cross_entropy(logits, batch.y, reduction='sum'))
            correct += int((logits.argmax(-1) == batch.y).sum())
            total += batch.num_graphs
        return {f'{split}_loss': loss / total, f'{split}_acc': correct / total}

    def fit(self, attention: str, seed: int, out_dir: str | Path | None = None,
            resume: bool = False,
            before_training: Callable[[], None] | None = None,
            distributed: DistributedContext | None = None
            ) -> tuple[PointSetClassifier, Trainer]:
        if distributed is not None and distributed.is_distributed:
            raise ValueError(f"The {self.name} task trains in one process: "
                             f"run it without torchrun")
        c = self.config
        train = self.datasets()['train']
        seed_everything(seed)
        model = self.placement.move(self.build_model(attention))
        optimizer = torch.optim.Adam(model.parameters(), lr=c.lr,
                                     weight_decay=c.weight_decay)

        def batches(epoch: int):
            order = torch.randperm(len(train), generator=epoch_generator(seed, epoch))
            return DataLoader(train[order], batch_size=c.batch_size,
                              pin_memory=self.placement.pin_memory)

        def step(model: torch.nn.Module, batch: Any) -> Tensor:
            return F.cross_entropy(self.logits(model, batch), batch.y)

        trainer = Trainer(model, optimizer, step,
                          lambda model: self.scores(model, 'test'),
                          out_dir=out_dir, progress=self.progress,
                          placement=self.placement,
                          desc=f'{self.name} {attention} seed {seed}')
        trainer.fit(batches, self.epochs, resume, before_training)
        return model, trainer

    def run(self, attention: str, seed: int) -> dict[str, Any]:
        model, trainer = self.fit(attention, seed)
        final = {k: v for k, v in trainer.history[-1].items()
                 if k.startswith('test_')}
        parameters = sum(p.numel() for p in model.parameters())
        return {'history': trainer.history, 'final': final,
                'parameters': parameters}

    def evaluate_split(self, model: torch.nn.Module,
                       split: str) -> tuple[dict[str, Any], str]:
        if split not in self.splits:
            raise ValueError(f"Unknown split '{split}'; expected one of "
                             f"{self.splits}")
        model = self.placement.move(model)
        with eval_mode(model), self.placement.autocast():
            metrics = self.scores(model, split)
        return metrics, '\n'.join(f'{key}: {value:.4f}'
                                   for key, value in metrics.items())
