"""Data set loaders (raw files, canonical downloads, clear errors)."""
from pyg_metric_attn.datasets.idx import IDXFormatError, read_idx
from pyg_metric_attn.datasets.mnist import MNIST

__all__ = ['IDXFormatError', 'MNIST', 'read_idx']
