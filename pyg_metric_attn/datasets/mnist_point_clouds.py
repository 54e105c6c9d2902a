r"""MNIST digits as point clouds of their ink pixels (a PyG data set)."""
from __future__ import annotations

import os
from collections.abc import Callable

import torch
from torch_geometric.data import Data

from pyg_metric_attn.datasets.image_points import image_point_clouds
from pyg_metric_attn.datasets.mnist import MNIST
from pyg_metric_attn.datasets.verified_dataset import VerifiedInMemoryDataset


class MNISTPointClouds(VerifiedInMemoryDataset):
    r"""The MNIST digits as point clouds: every pixel brighter than
    ``threshold`` is a point with features ``x = (u, v, intensity)`` and
    position ``pos = (u, v)`` in :math:`[-1, 1]^2`
    (:func:`~pyg_metric_attn.datasets.image_points.image_point_clouds`);
    ``y`` is the digit. With the default threshold a digit has about 150
    points (34 to 351 in the training set).

    The raw IDX files are read by :class:`~pyg_metric_attn.datasets.MNIST`
    from ``ROOT/MNIST/raw/`` or ``ROOT/raw/``; the converted split is cached
    (written atomically, checksummed, verified on load) in ``processed_dir``,
    default ``ROOT/processed``: give another folder where ``ROOT`` is
    read-only.

    Args:
        root (str or Path): The MNIST data root.
        train (bool, optional): The training split, else the test split.
            (default: :obj:`True`)
        threshold (int, optional): A pixel (0-255) is ink above it.
            (default: :obj:`0`)
        processed_dir (str or Path, optional): Where the converted split is
            cached. (default: ``ROOT/processed``)
        download (bool, optional): Fetch missing raw files (see
            :class:`~pyg_metric_attn.datasets.MNIST`). (default: :obj:`False`)
        transform (callable, optional): Applied to every item on access.
        force_reload (bool, optional): Convert again even where a cache
            exists. (default: :obj:`False`)
        log (bool, optional): Print while converting. (default: :obj:`True`)
    """
    reprocess_message = 'Converting again'

    def __init__(self, root: str | os.PathLike, train: bool = True,
                 threshold: int = 0, processed_dir: str | os.PathLike | None = None,
                 download: bool = False, transform: Callable | None = None,
                 force_reload: bool = False, log: bool = True):
        if not 0 <= threshold < 255:
            raise ValueError(f"'threshold' must be in [0, 255) (pixels are "
                             f"0-255), got {threshold}")
        self.train = train
        self.threshold = threshold
        self.download_raw = download
        super().__init__(root, processed_dir, transform, force_reload=force_reload,
                         log=log)

    @property
    def processed_dir(self) -> str:
        return os.fspath(self.processed_root)

    @property
    def raw_file_names(self) -> list[str]:
        return []  # MNIST finds (and, with download=True, fetches) them

    @property
    def processed_file_names(self) -> list[str]:
        split = 'train' if self.train else 'test'
        return [f'mnist_point_clouds_{split}_threshold{self.threshold}.pt']

    def process(self) -> None:
        mnist = MNIST(self.root, train=self.train, download=self.download_raw)
        pos, intensity, ptr = image_point_clouds(mnist.images, self.threshold)
        data = Data(x=torch.cat([pos, intensity.unsqueeze(1)], dim=1), pos=pos,
                    y=mnist.labels)
        slices = {'x': ptr, 'pos': ptr.clone(),
                  'y': torch.arange(len(mnist) + 1)}
        self.save_processed(data, slices)

    def __repr__(self) -> str:
        split = 'train' if self.train else 'test'
        return (f'{self.__class__.__name__}({len(self)}, split={split!r}, '
                f'threshold={self.threshold})')
