"""Shared fixtures: scatter backends, random graphs, the shared data root."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch_geometric.typing

try:
    import torch_scatter  # noqa: F401
    HAVE_TORCH_SCATTER = True
except ImportError:
    HAVE_TORCH_SCATTER = False

# The read-only copy of the real data sets beside the checkout (see DEVELOPERS.md).
SHARED_DATASETS = Path(os.environ.get(
    'PYG_METRIC_ATTN_SHARED',
    Path(__file__).resolve().parents[1].parent / 'shared' / 'datasets'))

SCATTER_BACKENDS = ['torch'] + (['torch_scatter'] if HAVE_TORCH_SCATTER else [])


@pytest.fixture(params=SCATTER_BACKENDS)
def scatter_backend(request, monkeypatch):
    """Run a test with PyG's pure-torch path and, where installed, torch-scatter."""
    monkeypatch.setattr(torch_geometric.typing, 'WITH_TORCH_SCATTER',
                        request.param == 'torch_scatter')
    return request.param


def random_graph(num_src: int, num_dst: int, p: float, generator: torch.Generator,
                 self_loops: bool = True) -> torch.Tensor:
    """A random ``edge_index`` without duplicate edges (some nodes isolated)."""
    mask = torch.rand(num_dst, num_src, generator=generator) < p
    if not self_loops:
        n = min(num_src, num_dst)
        mask[torch.arange(n), torch.arange(n)] = False
    dst, src = mask.nonzero(as_tuple=True)
    order = torch.randperm(src.numel(), generator=generator)
    return torch.stack([src, dst])[:, order]


def shared_dataset(name: str) -> Path:
    """Path of a real data set in ``../shared/datasets``.

    Skips the test with the reason when the folder is absent, except where
    ``PYG_METRIC_ATTN_REQUIRE_DATA`` is set (CI): there a missing data set fails.
    """
    path = SHARED_DATASETS / name
    if not path.exists():
        message = (f"real data set '{name}' not found at {path} (the read-only "
                   f"copy beside the checkout; set PYG_METRIC_ATTN_SHARED to "
                   f"its datasets folder)")
        if os.environ.get('PYG_METRIC_ATTN_REQUIRE_DATA'):
            pytest.fail(message)
        pytest.skip(message)
    return path
