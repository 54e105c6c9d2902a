"""benchmarks/host_dispatch.py: times both ways of entering the Triton
kernels with the launches stubbed, and leaves the kernels and the layer's
entry point as they were."""
from __future__ import annotations

import pytest

pytest.importorskip('triton')

from benchmarks import host_dispatch  # noqa: E402
from pyg_metric_attn.nn import triton as triton_attention  # noqa: E402
from pyg_metric_attn.nn.triton import function  # noqa: E402


def test_both_ways_are_timed_and_everything_is_restored():
    kernels = dict(function.kernels())
    args = host_dispatch.parse_args(['--nodes', '12', '--edges', '40',
                                     '--steps', '2', '--rounds', '2'])
    results = host_dispatch.measure(args)
    assert set(results) == {'operator', 'eager'}
    assert all(len(times) == 2 and min(times) > 0 for times in results.values())
    assert function.kernels() == kernels
    assert triton_attention.run_attention is function.run_attention
