"""Imports of optional dependencies, named by the extra that installs them.

The core install (torch, torch-geometric, numpy, scipy, tqdm) runs the layers
and models of :mod:`pyg_metric_attn.nn`. A module that needs more imports it
inside :func:`needs_extra`, so that a missing package fails with one line
that says what to install::

    with needs_extra('mesh'):
        import trimesh
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

#: The extras of ``pyproject.toml`` that modules import from, and what for.
EXTRAS = {
    'mesh': 'mesh geometry, mesh data sets and transforms',
    'experiments': 'the experiments, their data sets, figures and command line',
}


@contextmanager
def needs_extra(extra: str) -> Iterator[None]:
    """Imports inside come from the extra ``extra``: a package that is not
    installed raises :class:`ModuleNotFoundError` with one line naming the
    ``pyg-metric-attn`` extra to install."""
    if extra not in EXTRAS:
        raise ValueError(f"Unknown extra '{extra}'; expected one of "
                         f"{tuple(EXTRAS)}")
    try:
        yield
    except ModuleNotFoundError as error:
        package = (error.name or '').split('.')[0]
        if package in ('', 'pyg_metric_attn'):  # not a missing dependency
            raise
        raise ModuleNotFoundError(
            f"{package} is required for {EXTRAS[extra]}: "
            f"pip install 'pyg-metric-attn[{extra}]'", name=error.name) from None
