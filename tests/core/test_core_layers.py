"""The core install: ``pyg_metric_attn`` and its layers and models with only
torch, torch-geometric, numpy, scipy and tqdm.

These tests run in the normal suite, again there with every extra hidden
(``tests/test_core_install.py``), and in a venv that has only the core
(``make test-core``). ``PYG_METRIC_ATTN_CORE_ONLY=1`` (set by both) also
checks that the extras are really absent and that their modules say which
extra to install.
"""
from __future__ import annotations

import importlib
import os
from functools import partial

import pytest
import torch
from conftest import random_graph
from dense_reference import ipn_on_graph
from extras import hidden_modules
from torch_geometric.nn import GATConv

from pyg_metric_attn import IPN, MetricAttentionConv, MetricMultiheadAttention
from pyg_metric_attn.nn.models import MetricTransformer

CORE_ONLY = os.environ.get('PYG_METRIC_ATTN_CORE_ONLY') == '1'
only_without_extras = pytest.mark.skipif(
    not CORE_ONLY, reason='checks an install without the extras '
    '(PYG_METRIC_ATTN_CORE_ONLY=1)')

def test_public_names_import():
    import pyg_metric_attn
    import pyg_metric_attn.nn
    from pyg_metric_attn.datasets import MNIST, Multi30k  # noqa: F401
    for name in pyg_metric_attn.__all__:
        assert getattr(pyg_metric_attn, name) is not None
    for name in pyg_metric_attn.nn.__all__:
        assert getattr(pyg_metric_attn.nn, name) is not None


@only_without_extras
def test_extras_are_absent():
    for name in sorted(hidden_modules()):
        with pytest.raises(ImportError):
            importlib.import_module(name)


@only_without_extras
def test_extra_modules_name_the_extra():
    for module, extra in (('pyg_metric_attn.geometry', 'mesh'),
                          ('pyg_metric_attn.datasets.mesh_io', 'mesh'),
                          ('pyg_metric_attn.transforms', 'mesh'),
                          ('pyg_metric_attn.datasets.subword', 'experiments')):
        with pytest.raises(ImportError) as info:
            importlib.import_module(module)
        message = str(info.value)
        assert '\n' not in message, message
        assert f"pip install 'pyg-metric-attn[{extra}]'" in message, message



@only_without_extras
@pytest.mark.parametrize('argv', [['--help'], ['train', 'moon', '--help']])
def test_command_line_names_the_experiments_extra(argv, capsys):
    """Without [experiments] the command line says in one line what to install
    (not a traceback that names another extra)."""
    from pyg_metric_attn.cli import main
    assert main(argv) == 1
    out, err = capsys.readouterr()
    assert out == '', out
    assert err.count('\n') == 1 and err.startswith('error: '), err
    assert "pip install 'pyg-metric-attn[experiments]'" in err, err

@pytest.mark.parametrize('metric', ['metric', 'l2', 'dot'])
def test_conv_fused_and_scatter_backends_agree(metric):
    torch.manual_seed(0)
    x = torch.randn(12, 5)
    edge_index = torch.randint(0, 12, (2, 40))
    outputs, gradients = [], []
    for backend in ('fused', 'scatter'):
        torch.manual_seed(1)
        conv = MetricAttentionConv(5, 4, heads=2, metric=metric, backend=backend)
        leaf = x.clone().requires_grad_()
        out = conv(leaf, edge_index)
        out.square().sum().backward()
        assert out.shape == (12, 8) and torch.isfinite(out).all()
        outputs.append(out.detach())
        gradients.append(leaf.grad)
    torch.testing.assert_close(outputs[0], outputs[1])
    torch.testing.assert_close(gradients[0], gradients[1])


def test_multihead_attention_forward_backward():
    torch.manual_seed(0)
    attention = MetricMultiheadAttention(8, 2)
    x = torch.randn(3, 6, 8, requires_grad=True)
    padding = torch.zeros(3, 6, dtype=torch.bool)
    padding[0, 4:] = True
    out, weights = attention(x, x, x, key_padding_mask=padding)
    out.sum().backward()
    assert out.shape == (3, 6, 8) and weights.shape == (3, 6, 6)
    assert weights[0, :, 4:].eq(0).all()
    assert torch.isfinite(x.grad).all()


@pytest.mark.parametrize('conv', [None, partial(GATConv, heads=2, concat=False)])
def test_ipn_on_graphs_and_point_sets(conv):
    """On a graph: Linear, the layers along its edges, Linear (the paper's
    layer from the dense float64 reference: rtol 1e-4 for float32). On one
    point set: the same model on the set's all-pairs graph."""
    torch.manual_seed(0)
    model = IPN(3, 8, 2, num_layers=2, conv=conv)
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(10, 3, generator=generator)
    edge_index = random_graph(10, 10, 0.3, generator)
    on_graph = model(x, edge_index)
    assert on_graph.shape == (10, 2)
    torch.testing.assert_close(on_graph, ipn_on_graph(model, x, edge_index),
                               rtol=1e-4, atol=1e-5)
    out = model(x)  # all pairs of one point set
    out.sum().backward()
    all_pairs = torch.cartesian_prod(torch.arange(10), torch.arange(10)).T
    torch.testing.assert_close(out, model(x, all_pairs), rtol=1e-5, atol=1e-6)


def test_metric_transformer_forward_backward():
    """Position ``i``'s logits depend on the target tokens up to ``i`` and
    on the real source tokens only: the same with the later target tokens
    changed or the source padded, others where the changed tokens are seen."""
    torch.manual_seed(0)
    model = MetricTransformer(11, 13, d_model=16, num_heads=2,
                              num_encoder_layers=1, num_decoder_layers=1,
                              dim_feedforward=32).eval()
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(1, 11, (2, 7), generator=generator)
    tgt = torch.randint(1, 13, (2, 5), generator=generator)
    logits = model(src, tgt)
    logits.sum().backward()
    assert logits.shape == (2, 5, 13) and torch.isfinite(logits).all()
    later = tgt.clone()
    later[:, 3:] = (later[:, 3:] % 12) + 1  # other tokens from position 3 on
    changed = model(src, later)
    torch.testing.assert_close(changed[:, :3], logits[:, :3])
    assert (changed[:, 3:] - logits[:, 3:]).abs().amax() > 1e-3
    padded = torch.cat([src, src.new_zeros(2, 4)], dim=1)  # pad_index 0
    torch.testing.assert_close(model(padded, tgt), logits)


def test_a_missing_module_of_this_package_is_no_missing_extra():
    """A module of pyg_metric_attn itself that fails to import is a bug to
    show as it is, not a package to install."""
    from pyg_metric_attn.utils.optional import needs_extra
    with pytest.raises(ModuleNotFoundError) as info:
        with needs_extra('experiments'):
            importlib.import_module('pyg_metric_attn.no_such_module')
    assert 'pip install' not in str(info.value), info.value
