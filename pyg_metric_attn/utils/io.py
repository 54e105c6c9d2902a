"""Atomic, verified file writes for checkpoints, caches and results.

Every write goes to a temporary file in the target folder and is moved into
place with :func:`os.replace`, so a reader never sees a half-written file.
:func:`save_verified` prefixes the payload with a magic line and its SHA-256;
:func:`load_verified` checks both and raises :class:`CorruptFileError` on any
mismatch (truncation, bit rot, a file of another kind).
:func:`locked_folder` keeps a second process from writing into a folder in use.
"""
from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import torch

MAGIC = b'pyg-metric-attn/verified/v1\n'


class CorruptFileError(RuntimeError):
    """A verified file is truncated, altered or not of this format."""


class FolderLockedError(RuntimeError):
    """Another process holds the lock of a folder (see :func:`locked_folder`)."""


def _umask() -> int:
    """The process's umask (read by setting it and setting it back)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return umask


@contextmanager
def atomic_writer(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """A binary file to write ``path`` through: it appears at ``path`` (by
    rename) only when the ``with`` block ends without an error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f'.{path.name}.',
                               suffix='.tmp')
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp's 0600 -> as open() would
        with os.fdopen(fd, 'wb') as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (temporary file + rename)."""
    with atomic_writer(path) as f:
        f.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode('utf-8'))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True) + '\n')


def write_results(out: Path, results: Any, summary: str) -> None:
    """A measurement's ``out/results.json`` and Markdown ``out/summary.md``
    (both atomically; ``out`` is created)."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / 'results.json', results)
    atomic_write_text(out / 'summary.md', summary)


def save_verified(obj: Any, path: str | os.PathLike) -> None:
    """``torch.save`` ``obj`` with a checksum header, atomically."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    payload = buffer.getvalue()
    digest = hashlib.sha256(payload).hexdigest().encode('ascii')
    atomic_write_bytes(path, MAGIC + digest + b'\n' + payload)


def load_verified(path: str | os.PathLike, map_location: Any = 'cpu',
                  weights_only: bool = True) -> Any:
    """Load a file written by :func:`save_verified`, checking its checksum."""
    path = Path(path)
    data = path.read_bytes()
    header_end = len(MAGIC) + 65
    if not data.startswith(MAGIC) or len(data) < header_end:
        raise CorruptFileError(f"'{path}' is not a verified pyg-metric-attn file")
    digest, payload = data[len(MAGIC):header_end - 1], data[header_end:]
    if hashlib.sha256(payload).hexdigest().encode('ascii') != digest:
        raise CorruptFileError(f"'{path}' is corrupt (checksum mismatch)")
    return torch.load(io.BytesIO(payload), map_location=map_location,
                      weights_only=weights_only)


@contextmanager
def locked_folder(path: str | os.PathLike) -> Iterator[Path]:
    """Hold an exclusive lock on folder ``path`` (created where missing) for
    the ``with`` block; raises :class:`FolderLockedError` at once where
    another process (or another ``with``) holds it. The lock is on the folder
    itself, so no file is added, and it ends with the process."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise FolderLockedError(
                f"'{path}' is in use by another process (a train writing into "
                f"it?); wait until it ends or choose another folder") from None
        yield path
    finally:
        os.close(fd)  # releases the lock
