"""The IDX reader and MNIST loader on the real files, and Planetoid's stats."""
from __future__ import annotations

import gzip
import shutil
import struct
import urllib.error
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import shared_dataset

from pyg_metric_attn.datasets import MNIST, IDXFormatError, read_idx
from pyg_metric_attn.datasets.mnist import md5sum
from pyg_metric_attn.experiments.tasks.planetoid import Planetoid, load_planetoid


def write_idx(path: Path, array: np.ndarray, type_code: int = 0x08) -> Path:
    header = struct.pack('>HBB', 0, type_code, array.ndim)
    header += struct.pack(f'>{array.ndim}I', *array.shape)
    path.write_bytes(header + array.astype(array.dtype.newbyteorder('>')).tobytes())
    return path


@pytest.fixture(scope='module')
def mnist_raw() -> Path:
    return shared_dataset('mnist') / 'raw'


def test_shared_files_have_the_canonical_md5(mnist_raw):
    for name, md5 in MNIST.resources.items():
        assert md5sum(mnist_raw / name) == md5, name


def test_read_idx_shapes_and_labels(mnist_raw):
    for split, size in (('train', 60000), ('t10k', 10000)):
        images = read_idx(mnist_raw / f'{split}-images-idx3-ubyte.gz')
        assert images.shape == (size, 28, 28) and images.dtype == torch.uint8
        assert int(images.max()) == 255 and int(images.min()) == 0
    for split, size in (('train', 60000), ('t10k', 10000)):
        labels = read_idx(mnist_raw / f'{split}-labels-idx1-ubyte.gz')
        assert labels.shape == (size,)
        assert sorted(labels.unique().tolist()) == list(range(10))
    # The first training labels of MNIST are 5, 0, 4, 1, 9, 2, 1, 3, 1, 4.
    first = read_idx(mnist_raw / 'train-labels-idx1-ubyte.gz')[:10]
    assert first.tolist() == [5, 0, 4, 1, 9, 2, 1, 3, 1, 4]


def test_read_idx_round_trip_and_errors(tmp_path):
    array = np.arange(24, dtype=np.int32).reshape(2, 3, 4) - 5
    path = write_idx(tmp_path / 'a.idx', array, type_code=0x0C)
    assert torch.equal(read_idx(path), torch.from_numpy(array))
    packed = tmp_path / 'a.idx.gz'
    packed.write_bytes(gzip.compress(path.read_bytes()))
    assert torch.equal(read_idx(packed), torch.from_numpy(array))

    path.write_bytes(b'\x12\x34\x08\x01' + path.read_bytes()[4:])
    with pytest.raises(IDXFormatError, match='magic number 0x12340801'):
        read_idx(path)
    short = write_idx(tmp_path / 'b.idx', np.zeros((3, 2), np.uint8))
    short.write_bytes(short.read_bytes()[:-1])
    with pytest.raises(IDXFormatError, match=r'shape \[3, 2\].*needs 18'):
        read_idx(short)
    broken = tmp_path / 'c.idx.gz'
    broken.write_bytes(gzip.compress(b'\x00\x00\x08\x01' + bytes(40))[:20])
    with pytest.raises(IDXFormatError, match='truncated or corrupt'):
        read_idx(broken)


@pytest.mark.parametrize('layout', ['MNIST/raw', 'raw'])
def test_mnist_layouts_never_download_present_files(mnist_raw, tmp_path,
                                                    monkeypatch, layout):
    raw = tmp_path / layout
    raw.mkdir(parents=True)
    for name in ('t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz'):
        (raw / name).symlink_to(mnist_raw / name)

    def no_network(*args, **kwargs):
        raise AssertionError('downloaded although the files are present')

    monkeypatch.setattr('urllib.request.urlopen', no_network)
    test = MNIST(tmp_path, train=False)
    assert len(test) == 10000 and test.images.shape == (10000, 28, 28)
    x, y = test.features()
    assert x.shape == (10000, 784) and x.dtype == torch.float32
    assert torch.equal(y, test.labels) and y.dtype == torch.long


def test_mnist_missing_files_and_offline_download(mnist_raw, tmp_path,
                                                  monkeypatch):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / 'MNIST' / 'raw')):
        MNIST(tmp_path, train=False, download=False)

    def offline(url, timeout):
        raise urllib.error.URLError('no network')

    monkeypatch.setattr('urllib.request.urlopen', offline)
    with pytest.raises(RuntimeError, match='offline.*Put the four IDX files'):
        MNIST(tmp_path, train=False)


class FakeResponse:
    def __init__(self, data: bytes):
        self.data = data

    def read(self) -> bytes:
        return self.data

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_mnist_download_checks_md5(mnist_raw, tmp_path, monkeypatch):
    urls = []

    def serve(url, timeout):
        urls.append(url)
        if url.startswith(MNIST.mirrors[0]):  # a mirror serving wrong bytes
            return FakeResponse(b'not mnist')
        return FakeResponse((mnist_raw / url.rpartition('/')[2]).read_bytes())

    monkeypatch.setattr('urllib.request.urlopen', serve)
    test = MNIST(tmp_path, train=False)
    assert len(test) == 10000
    assert len(urls) == 4  # two files, the first mirror failed the md5 check
    for name in ('t10k-images-idx3-ubyte.gz', 't10k-labels-idx1-ubyte.gz'):
        assert md5sum(tmp_path / 'MNIST' / 'raw' / name) == MNIST.resources[name]


@pytest.mark.parametrize('name,stats', [
    ('Cora', (2708, 10556, 1433, 7, 140, 500, 1000)),
    ('CiteSeer', (3327, 9104, 3703, 6, 120, 500, 1000)),
])
def test_planetoid_statistics(tmp_path, name, stats):
    shutil.copytree(shared_dataset('planetoid') / name / 'raw',
                    tmp_path / name / 'raw')
    data = load_planetoid(tmp_path, name)
    assert (data.num_nodes, data.num_edges, data.num_features,
            int(data.y.max()) + 1, int(data.train_mask.sum()),
            int(data.val_mask.sum()), int(data.test_mask.sum())) == stats
    # Row-normalised features (GAT's preprocessing); CiteSeer has empty rows.
    row_sums = data.x.sum(1)
    assert torch.allclose(row_sums[row_sums > 0], torch.ones(1))


def test_a_failed_planetoid_download_says_where_to_put_the_files(
        tmp_path, silent_server, monkeypatch):
    # PyG 2.8 downloads through aiohttp, whose errors are no URLError.
    monkeypatch.setattr(Planetoid, 'url', silent_server)
    with pytest.raises(RuntimeError, match=r"no answer within 0\.5 s.*Put the "
                       r"eight raw files ind\.cora\.\{x,.*into '.*Cora/raw/'"):
        load_planetoid(tmp_path, 'Cora')


def test_mnist_download_without_answer_times_out(tmp_path, silent_server,
                                                 monkeypatch):
    monkeypatch.setattr(MNIST, 'mirrors', (f'{silent_server}/',))
    with pytest.raises(RuntimeError, match=r'timed out'):
        MNIST(tmp_path, train=False)
