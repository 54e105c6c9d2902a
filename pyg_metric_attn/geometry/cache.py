"""On-disk cache of per-mesh operators, keyed by content.

The key is the SHA-256 of the vertex coordinates, the faces (values and
shapes) and the settings, so an edited mesh or changed settings never hit a
stale entry. Entries are written atomically with a checksum
(:func:`~pyg_metric_attn.utils.io.save_verified`); an entry that is corrupt,
unreadable or stored under another key is reported, recomputed and rewritten,
never used.
"""
from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from pyg_metric_attn.utils.io import load_verified, save_verified

#: Bump when the operators' definition changes: old entries then miss.
CACHE_VERSION = 1


def operator_cache_key(pos: np.ndarray, face: np.ndarray,
                       settings: dict[str, Any]) -> str:
    """SHA-256 of the mesh content and the settings."""
    digest = hashlib.sha256()
    for array in (np.ascontiguousarray(pos, np.float64),
                  np.ascontiguousarray(face, np.int64)):
        digest.update(str(array.shape).encode())
        digest.update(array.tobytes())
    digest.update(json.dumps({'version': CACHE_VERSION, **settings},
                             sort_keys=True).encode())
    return digest.hexdigest()


class OperatorCache:
    """A folder of verified ``KEY.pt`` entries (``None``: no caching)."""
    def __init__(self, folder: str | Path | None):
        self.folder = Path(folder) if folder is not None else None

    def path(self, key: str) -> Path:
        return self.folder / key[:2] / f'{key}.pt'

    def load(self, key: str) -> dict[str, Any] | None:
        """The entry stored under ``key`` (without the key), or :obj:`None` if
        there is none or it is unusable (then a warning says why)."""
        if self.folder is None or not self.path(key).exists():
            return None
        try:
            entry = load_verified(self.path(key))
        except Exception as error:  # corrupt, truncated, not ours: recompute
            warnings.warn(f"Recomputing the operator cache entry "
                          f"'{self.path(key)}': {error}", stacklevel=2)
            return None
        if not isinstance(entry, dict) or entry.get('key') != key:
            warnings.warn(f"Recomputing the operator cache entry "
                          f"'{self.path(key)}': it was stored for another mesh "
                          f"or other settings", stacklevel=2)
            return None
        return {name: value for name, value in entry.items() if name != 'key'}

    def save(self, key: str, entry: dict[str, Any]) -> None:
        if self.folder is not None:
            save_verified({**entry, 'key': key}, self.path(key))
