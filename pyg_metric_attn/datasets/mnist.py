r"""The MNIST handwritten digits from the four canonical IDX files.

Raw files are looked up in ``ROOT/MNIST/raw/`` and then ``ROOT/raw/``, each
either as distributed (``.gz``) or gunzipped. When they are missing and
``download=True`` they are fetched into ``ROOT/MNIST/raw/`` from the canonical
mirrors and checked against their md5; files that are present are never
downloaded again.
"""
from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from pathlib import Path

import torch
from torch import Tensor

from pyg_metric_attn.datasets.idx import IDXFormatError, read_idx
from pyg_metric_attn.utils.download import download_timeout
from pyg_metric_attn.utils.io import atomic_write_bytes


def md5sum(path: str | os.PathLike) -> str:
    """The md5 hex digest of a file."""
    digest = hashlib.md5()
    with open(path, 'rb') as f:
        for chunk in iter(lambda: f.read(1 << 20), b''):
            digest.update(chunk)
    return digest.hexdigest()


class MNIST:
    r"""MNIST digits (60,000 training and 10,000 test images of
    :math:`28 \times 28` pixels, labels 0 to 9).

    Args:
        root (str or Path): The data root; raw files are read from
            ``ROOT/MNIST/raw/`` or ``ROOT/raw/``.
        train (bool, optional): Load the training split, else the test split.
            (default: :obj:`True`)
        download (bool, optional): Fetch missing raw files from the canonical
            mirrors. (default: :obj:`True`)

    Attributes:
        images (torch.Tensor): ``uint8`` pixels ``[N, 28, 28]``.
        labels (torch.Tensor): ``int64`` labels ``[N]``.
    """
    #: Mirrors tried in order (torchvision's list; the first is the original).
    mirrors = ('http://yann.lecun.com/exdb/mnist/',
               'https://ossci-datasets.s3.amazonaws.com/mnist/')
    #: md5 of each canonical ``.gz`` file.
    resources = {
        'train-images-idx3-ubyte.gz': 'f68b3c2dcbeaaa9fbdd348bbdeb94873',
        'train-labels-idx1-ubyte.gz': 'd53e105ee54ea40749a09fcbcd1e9432',
        't10k-images-idx3-ubyte.gz': '9fb629c4189551a2d022fa330f9573f3',
        't10k-labels-idx1-ubyte.gz': 'ec29112dd5afa0611ce80d1b7f02629c',
    }
    splits = {'train': ('train-images-idx3-ubyte.gz', 'train-labels-idx1-ubyte.gz',
                        60000),
              'test': ('t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz',
                       10000)}

    def __init__(self, root: str | os.PathLike, train: bool = True,
                 download: bool = True):
        self.root = Path(root)
        self.train = train
        images_name, labels_name, size = self.splits['train' if train else 'test']
        images_path = self.find_raw(images_name, download)
        labels_path = self.find_raw(labels_name, download)
        self.images = read_idx(images_path)
        self.labels = read_idx(labels_path).long()
        self._check(images_path, labels_path, size)

    @property
    def raw_dir(self) -> Path:
        """Where downloaded files go."""
        return self.root / 'MNIST' / 'raw'

    @property
    def search_dirs(self) -> tuple[Path, Path]:
        return self.raw_dir, self.root / 'raw'

    def find_raw(self, name: str, download: bool = True) -> Path:
        """Path of raw file ``name`` (``.gz`` or gunzipped), downloading it
        when it is nowhere and ``download`` is set."""
        for folder in self.search_dirs:
            for candidate in (folder / name, folder / name.removesuffix('.gz')):
                if candidate.is_file():
                    return candidate
        where = ' or '.join(f"'{folder}/'" for folder in self.search_dirs)
        if not download:
            raise FileNotFoundError(
                f"MNIST file '{name}' not found in {where}; put the four IDX "
                f"files ({', '.join(self.resources)}) there, or pass "
                f"download=True")
        return self.download(name)

    def download(self, name: str) -> Path:
        """Fetch ``name`` from the first mirror that serves it with the right
        md5 and write it atomically into :attr:`raw_dir`."""
        errors = []
        for mirror in self.mirrors:
            url = mirror + name
            try:
                with urllib.request.urlopen(url, timeout=download_timeout()) as response:
                    data = response.read()
            except (urllib.error.URLError, OSError) as error:
                errors.append(f'{url}: {error}')
                continue
            md5 = hashlib.md5(data).hexdigest()
            if md5 != self.resources[name]:
                errors.append(f'{url}: md5 {md5}, expected {self.resources[name]}')
                continue
            path = self.raw_dir / name
            atomic_write_bytes(path, data)
            return path
        raise RuntimeError(
            f"Could not download MNIST file '{name}' (offline?). Put the four "
            f"IDX files ({', '.join(self.resources)}) into '{self.raw_dir}/' "
            f"or '{self.root / 'raw'}/'. Tried:\n  " + '\n  '.join(errors))

    def _check(self, images_path: Path, labels_path: Path, size: int) -> None:
        if self.images.dtype != torch.uint8 or self.images.shape[1:] != (28, 28):
            raise IDXFormatError(
                f"'{images_path}' should hold uint8 images [N, 28, 28], got "
                f"{self.images.dtype} {list(self.images.shape)}")
        if self.labels.dim() != 1:
            raise IDXFormatError(f"'{labels_path}' should hold labels [N], got "
                                 f"shape {list(self.labels.shape)}")
        if self.images.size(0) != self.labels.size(0):
            raise IDXFormatError(
                f"'{images_path}' has {self.images.size(0)} images but "
                f"'{labels_path}' has {self.labels.size(0)} labels")
        if self.images.size(0) != size:
            raise IDXFormatError(f"'{images_path}' has {self.images.size(0)} "
                                 f"images; the MNIST split has {size}")
        if self.labels.numel() and not (0 <= int(self.labels.min())
                                        and int(self.labels.max()) <= 9):
            raise IDXFormatError(f"'{labels_path}' has labels outside 0..9")

    def features(self) -> tuple[Tensor, Tensor]:
        """``(x, y)``: pixels flattened to ``[N, 784]`` floats, standardised
        with the training set's pixel mean 0.1307 and std 0.3081, and labels."""
        x = self.images.flatten(1).float().div_(255.0)
        return (x - 0.1307) / 0.3081, self.labels

    def __len__(self) -> int:
        return self.labels.numel()

    def __repr__(self) -> str:
        split = 'train' if self.train else 'test'
        return f'{self.__class__.__name__}({len(self)}, split={split!r})'
