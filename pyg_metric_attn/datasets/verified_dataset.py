r"""An in-memory data set whose processed file is verified on load."""
from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch_geometric.data import Data, InMemoryDataset

from pyg_metric_attn.utils.io import CorruptFileError, load_verified, save_verified


class VerifiedInMemoryDataset(InMemoryDataset):
    r"""A :class:`~torch_geometric.data.InMemoryDataset` with one processed
    file, written atomically with a checksum (:meth:`save_processed`) and
    verified on load; a corrupt file is processed again, with a warning
    that begins with :attr:`reprocess_message`. Subclasses set their own
    attributes before calling ``__init__`` and end :meth:`process` with
    :meth:`save_processed`.

    Args:
        root (str or Path): Root folder.
        processed_dir (str or Path, optional): The processed root
            (:attr:`processed_root`). (default: ``ROOT/processed``)
        transform, pre_transform, pre_filter, force_reload, log: as in
            :class:`~torch_geometric.data.InMemoryDataset`.
    """
    #: How the warning about a corrupt processed file begins.
    reprocess_message = 'Re-processing'

    def __init__(self, root: str | os.PathLike,
                 processed_dir: str | os.PathLike | None = None,
                 transform: Callable | None = None,
                 pre_transform: Callable | None = None,
                 pre_filter: Callable | None = None, force_reload: bool = False,
                 log: bool = True):
        self._processed_root = processed_dir
        super().__init__(os.fspath(root), transform, pre_transform, pre_filter,
                         force_reload=force_reload, log=log)
        try:
            self._load_processed()
        except CorruptFileError as error:
            warnings.warn(f"{self.reprocess_message}: {error}", stacklevel=3)
            self.process()
            self._load_processed()

    @property
    def processed_root(self) -> Path:
        """``processed_dir``, default ``ROOT/processed``."""
        return Path(self._processed_root or Path(self.root) / 'processed')

    def save_processed(self, data: Data, slices: dict[str, Any]) -> None:
        """Write the collated ``data`` and ``slices`` (atomic, checksummed)."""
        save_verified((data.to_dict(), slices), self.processed_paths[0])

    def _load_processed(self) -> None:
        data, self.slices = load_verified(self.processed_paths[0])
        self.data = Data.from_dict(data)
