"""Downloads that give up: every read waits at most a timeout.

The timeout is :data:`DEFAULT_TIMEOUT` seconds, or the value of the
environment variable ``PYG_METRIC_ATTN_DOWNLOAD_TIMEOUT`` (for slow links).
Files are written atomically, so an interrupted download leaves nothing.
"""
from __future__ import annotations

import http.client
import os
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path

from pyg_metric_attn.utils.io import atomic_writer

#: Seconds a connection or a read may take before a download gives up.
DEFAULT_TIMEOUT = 60.0
TIMEOUT_VARIABLE = 'PYG_METRIC_ATTN_DOWNLOAD_TIMEOUT'


class DownloadError(OSError):
    """A download failed; the message names the URL and the reason."""


def download_timeout() -> float:
    """The timeout in seconds (:data:`TIMEOUT_VARIABLE` or the default)."""
    text = os.environ.get(TIMEOUT_VARIABLE)
    if text is None:
        return DEFAULT_TIMEOUT
    try:
        timeout = float(text)
    except ValueError:
        timeout = 0.0
    if not timeout > 0:
        raise ValueError(f"{TIMEOUT_VARIABLE} must be a positive number of "
                         f"seconds, got '{text}'")
    return timeout


def download_url(url: str, folder: str | os.PathLike, log: bool = True) -> str:
    """Download ``url`` into ``folder`` (file name: the URL's last part
    without the query) and return the file's path; raises
    :class:`DownloadError` where the server fails, refuses or does not answer
    within :func:`download_timeout` seconds."""
    timeout = download_timeout()
    path = Path(folder) / url.rpartition('/')[2].partition('?')[0]
    if log:
        print(f'Downloading {url}', file=sys.stderr)
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response, \
                atomic_writer(path) as f:
            shutil.copyfileobj(response, f, 1 << 20)
    except (OSError, http.client.HTTPException) as error:
        reason = getattr(error, 'reason', error)  # URLError wraps the cause
        if isinstance(reason, TimeoutError):
            reason = f'no answer within {timeout:g} s'
        raise DownloadError(f'{url}: {reason}') from error
    return str(path)
