"""examples/fixed_graph_training.py: without CUDA it says what it needs; on
a CPU (``--device cpu``, Triton's interpreter) its compiled training loop is
one graph, compiled once for all its steps."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

pytest.importorskip('triton')

SCRIPT = Path(__file__).resolve().parents[1] / 'examples' / 'fixed_graph_training.py'


def load_example():
    spec = importlib.util.spec_from_file_location('fixed_graph_training', SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason='explains itself without CUDA')
@pytest.mark.parametrize('capture', ['compile', 'cuda-graph'])
def test_without_cuda_it_explains_itself(capture, capsys):
    load_example().main(['--capture', capture])
    assert 'No CUDA device' in capsys.readouterr().out


def test_the_compiled_loop_is_one_graph_on_a_cpu(capsys):
    import torch._dynamo

    torch._dynamo.reset()
    stats = torch._dynamo.utils.counters['stats']
    before = stats['unique_graphs']
    with torch._dynamo.config.patch(error_on_recompile=True):
        load_example().main(['--device', 'cpu', '--nodes', '12', '--edges', '30',
                             '--features', '6', '--heads', '1', '--classes', '3',
                             '--steps', '3'])
    assert stats['unique_graphs'] - before == 1
    out = capsys.readouterr().out
    assert 'step 3: loss' in out and 'held-out accuracy' in out
