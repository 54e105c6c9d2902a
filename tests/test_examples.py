"""The examples run as the docs show them and say what their docstrings
claim: examples/quickstart.py; examples/fixed_graph_training.py, which
without CUDA says what it needs and on a CPU (``--device cpu``, Triton's
interpreter) compiles its training loop as one graph, once for all its
steps (examples/distributed_node_classification.py is run by
test_distributed.py)."""
from __future__ import annotations

import importlib.util
import re
import runpy
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / 'examples'


def test_quickstart_saturates_at_t_1_and_learns_at_t_100(capsys, one_thread):
    """With t = 1 nearly all attention stays on the self-loop, with t = 100
    little does; trained at t = 100 the classifier separates the two
    communities (chance 50%; measured 74.4%)."""
    runpy.run_path(str(EXAMPLES / 'quickstart.py'), run_name='__main__')
    out = capsys.readouterr().out
    weights = dict(re.findall(r't = +([\d.]+): mean self-loop attention at '
                              r'initialisation ([\d.]+)', out))
    assert float(weights['1.0']) > 0.9 and float(weights['100.0']) < 0.3, out
    accuracy, = re.findall(r'test accuracy \(t = 100\): ([\d.]+)', out)
    assert float(accuracy) >= 0.65, out


def fixed_graph_training():
    pytest.importorskip('triton')
    path = EXAMPLES / 'fixed_graph_training.py'
    spec = importlib.util.spec_from_file_location('fixed_graph_training', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(torch.cuda.is_available(), reason='explains itself without CUDA')
@pytest.mark.parametrize('capture', ['compile', 'cuda-graph'])
def test_fixed_graph_training_without_cuda_explains_itself(capture, capsys):
    fixed_graph_training().main(['--capture', capture])
    assert 'No CUDA device' in capsys.readouterr().out


def test_fixed_graph_training_compiles_one_graph_on_a_cpu(capsys):
    import torch._dynamo

    example = fixed_graph_training()
    torch._dynamo.reset()
    stats = torch._dynamo.utils.counters['stats']
    before = stats['unique_graphs']
    with torch._dynamo.config.patch(error_on_recompile=True):
        example.main(['--device', 'cpu', '--nodes', '12', '--edges', '30',
                      '--features', '6', '--heads', '1', '--classes', '3',
                      '--steps', '3'])
    assert stats['unique_graphs'] - before == 1
    out = capsys.readouterr().out
    assert 'step 3: loss' in out and 'held-out accuracy' in out
