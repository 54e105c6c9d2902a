"""Every module of the package has ``reset_parameters``, which re-draws all
its parameters; ``pyg_metric_attn.nn`` exports layers and models."""
from __future__ import annotations

import importlib
import pkgutil

import pytest
import torch
from torch_geometric.nn import GATConv

import pyg_metric_attn
import pyg_metric_attn.nn
from pyg_metric_attn.experiments.tasks.planetoid import GATNet
from pyg_metric_attn.nn import (
    IPN,
    DiffusionNet,
    HeatDiffusion,
    MetricAttentionalAggregation,
    MetricAttentionConv,
    MetricMeshFormer,
    MetricMultiheadAttention,
    MetricTransformer,
    PointSetClassifier,
    ResidualTanhMLP,
    SpatialGradientFeatures,
    TimeScale,
)
from pyg_metric_attn.nn.models import (
    MetricMeshFormerBlock,
    MetricTransformerDecoderLayer,
    MetricTransformerEncoderLayer,
)
from pyg_metric_attn.pretrained.segmenter import MeshSegmenter
from pyg_metric_attn.transforms import MeshPreprocessing


def package_modules() -> list[type[torch.nn.Module]]:
    """Every ``torch.nn.Module`` class the package defines."""
    for info in pkgutil.walk_packages(pyg_metric_attn.__path__,
                                      'pyg_metric_attn.'):
        if not info.name.endswith('__main__'):  # that one runs the CLI
            importlib.import_module(info.name)
    found, todo = [], [torch.nn.Module]
    while todo:
        for cls in todo.pop().__subclasses__():
            todo.append(cls)
            if cls.__module__.startswith('pyg_metric_attn.'):
                found.append(cls)
    return found


def test_every_module_class_has_reset_parameters():
    classes = package_modules()
    assert MetricMeshFormer in classes and GATNet in classes
    missing = [f'{cls.__module__}.{cls.__qualname__}' for cls in classes
               if not callable(getattr(cls, 'reset_parameters', None))]
    assert missing == []


BUILDERS = {
    'conv': lambda: MetricAttentionConv(6, 4, heads=2, edge_dim=3,
                                        residual=True, learn_time_scale=True),
    'mha': lambda: MetricMultiheadAttention(8, 2, kdim=6, learn_time_scale=True),
    'aggregation': lambda: MetricAttentionalAggregation(
        5, 3, num_queries=2, learn_time_scale=True),
    'phi': lambda: ResidualTanhMLP(5, 3, 7),
    'time': lambda: TimeScale(2.0, learn=True),
    'diffusion': lambda: HeatDiffusion(4),
    'gradient_features': lambda: SpatialGradientFeatures(4),
    'ipn': lambda: IPN(3, 8, 2, num_layers=2),
    'ipn_gat': lambda: IPN(3, 8, 2, num_layers=2,
                           conv=GATConv(8, 8, heads=2, concat=False)),
    'former_block': lambda: MetricMeshFormerBlock(8, 2, 4.0, diffusion=True,
                                                  gradients=True),
    'former': lambda: MetricMeshFormer(3, 2, hidden_channels=8, num_layers=2,
                                       heads=2, diffusion=True, gradients=True),
    'diffusion_net': lambda: DiffusionNet(3, 2, hidden_channels=8, num_layers=2),
    'segmenter': lambda: MeshSegmenter(
        DiffusionNet(3, 2, hidden_channels=8, num_layers=1),
        MeshPreprocessing(k=8, hks_count=3), ['a', 'b']),
    'encoder_layer': lambda: MetricTransformerEncoderLayer(8, 2, 16),
    'decoder_layer': lambda: MetricTransformerDecoderLayer(8, 2, 16),
    'transformer': lambda: MetricTransformer(11, 13, 8, 2, 1, 1, 16,
                                             norm_first=True),
    'shared_transformer': lambda: MetricTransformer(11, 11, 8, 2, 1, 1, 16,
                                                    share_embeddings=True),
    'gat_net': lambda: GATNet(5, 3, 'metric', hidden_channels=4, heads=2),
    'point_set_classifier': lambda: PointSetClassifier(
        3, 8, 2, [MetricAttentionConv(8, 8, residual=True)],
        MetricAttentionalAggregation(8, 4, num_queries=2), pool_channels=8),
}


@pytest.mark.parametrize('name', BUILDERS)
def test_reset_parameters_redraws_every_parameter(name):
    """Every parameter is drawn anew as at construction: whatever it held
    before (the same reset from a filled module and from a fresh one),
    constants (zero biases, unit norms, the initial time scale) exactly as
    built, random ones not constant and, from 16 values on (fewer say
    little of a spread), of the built spread within a factor 2."""
    torch.manual_seed(0)
    module, fresh = BUILDERS[name](), BUILDERS[name]()
    built = {key: p.detach().clone() for key, p in fresh.named_parameters()}
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.fill_(0.123)
    for reset in (module, fresh):
        torch.manual_seed(1)
        reset.reset_parameters()
    for (key, parameter), again in zip(module.named_parameters(),
                                       fresh.parameters(), strict=True):
        assert torch.equal(parameter, again), key
        initial = built[key]
        if initial.numel() == 1 or bool((initial == initial.flatten()[0]).all()):
            assert torch.equal(parameter, initial), key
            continue
        assert not bool((parameter == parameter.flatten()[0]).all()), key
        if initial.numel() >= 16:
            ratio = float(parameter.detach().std() / initial.std())
            assert 0.5 < ratio < 2, (key, ratio)


def test_nn_exports_layers_and_models_not_mesh_internals():
    exported = set(pyg_metric_attn.nn.__all__)
    assert {'MetricAttentionConv', 'MetricMultiheadAttention', 'IPN',
            'MetricAttentionalAggregation', 'PointSetClassifier',
            'MetricMeshFormer', 'MetricTransformer', 'HeatDiffusion',
            'SpatialGradientFeatures'} <= exported
    assert not exported & {'MeshSpectrum', 'TangentGradient', 'vertex_gradients'}
