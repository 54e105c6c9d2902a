"""Where data that no folder was given for go: the data generated or
downloaded by default (e.g. the synthetic humanoids of the ``human_seg`` task
without ``--root``)."""
from __future__ import annotations

import os
from pathlib import Path

#: The environment variable that sets the folder.
DATA_HOME_VARIABLE = 'PYG_METRIC_ATTN_DATA'


def data_home() -> Path:
    """The default data folder: ``$PYG_METRIC_ATTN_DATA`` where set, else
    ``$XDG_CACHE_HOME/pyg-metric-attn``, else ``~/.cache/pyg-metric-attn``."""
    if os.environ.get(DATA_HOME_VARIABLE):
        return Path(os.environ[DATA_HOME_VARIABLE]).expanduser()
    cache = os.environ.get('XDG_CACHE_HOME') or Path.home() / '.cache'
    return Path(cache) / 'pyg-metric-attn'
