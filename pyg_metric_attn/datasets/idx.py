r"""Reader for the IDX format of the MNIST files (LeCun et al.).

An IDX file is a 4-byte magic number ``0x0000TTNN`` (``TT`` the element type,
``NN`` the number of dimensions), ``NN`` big-endian uint32 dimension sizes and
the elements in row-major, big-endian order. Files ending in ``.gz`` are read
through :mod:`gzip`.
"""
from __future__ import annotations

import gzip
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

#: IDX element type codes and their big-endian NumPy types.
IDX_TYPES: dict[int, np.dtype] = {
    0x08: np.dtype('>u1'),
    0x09: np.dtype('>i1'),
    0x0B: np.dtype('>i2'),
    0x0C: np.dtype('>i4'),
    0x0D: np.dtype('>f4'),
    0x0E: np.dtype('>f8'),
}


class IDXFormatError(ValueError):
    """A file is not a well-formed IDX file (or not the one expected)."""


def _read_bytes(path: Path) -> bytes:
    try:
        if path.suffix == '.gz':
            with gzip.open(path, 'rb') as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError, zlib.error) as error:
        # gzip.BadGzipFile is an OSError; a truncated stream an EOFError.
        raise IDXFormatError(f"Could not read '{path}': {error} (a truncated "
                             f"or corrupt file? delete it and fetch it again)"
                             ) from error


def read_idx(path: str | os.PathLike) -> Tensor:
    """Read an IDX file (optionally gzip-compressed) into a tensor.

    Unsigned bytes become :obj:`torch.uint8`; the other types their native
    little-endian equivalents. Raises :class:`IDXFormatError` on a bad magic
    number or a size that does not match the header.
    """
    path = Path(path)
    data = _read_bytes(path)
    if len(data) < 4:
        raise IDXFormatError(f"'{path}' has {len(data)} bytes, too short for an "
                             f"IDX header")
    zero, type_code, ndim = struct.unpack('>HBB', data[:4])
    if zero != 0 or type_code not in IDX_TYPES or ndim == 0:
        raise IDXFormatError(
            f"'{path}' is not an IDX file: magic number 0x{data[:4].hex()} "
            f"(expected 0x0000TTNN with type TT in "
            f"{[hex(t) for t in IDX_TYPES]} and NN >= 1 dimensions)")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise IDXFormatError(f"'{path}' ends inside its header ({ndim} "
                             f"dimensions need {header} bytes, got {len(data)})")
    shape = struct.unpack(f'>{ndim}I', data[4:header])
    dtype = IDX_TYPES[type_code]
    expected = header + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) != expected:
        raise IDXFormatError(
            f"'{path}' has {len(data)} bytes but its header (shape "
            f"{list(shape)}, {dtype.itemsize}-byte elements) needs {expected}")
    array = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    return torch.from_numpy(array.astype(dtype.newbyteorder('=')))
