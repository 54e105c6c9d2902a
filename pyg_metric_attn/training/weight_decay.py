r"""Weight decay of its own for the nonlinear part of the pseudo-metric maps.

With Adam's (coupled) L2 weight decay, a weight whose loss gradient is
smaller than ``weight_decay * |w|`` is pulled to zero at the learning rate's
pace, then decays geometrically. The tanh MLP of
:class:`~pyg_metric_attn.nn.pseudo_metric.ResidualTanhMLP` is such a weight
wherever the loss leans on it only slightly: it vanishes, and
:math:`\phi` becomes its linear part, so metric-attention becomes L2
attention. Seen after training with the recipes' decay: the first layer of
the GAT network on Cora (MLP weights of norm 7e-5, 35 without decay), three
of the four blocks of the human_seg MetricMeshFormer after 20 epochs
(1e-9 to 1e-33, about 10 without decay).
"""
from __future__ import annotations

from typing import Any

import torch

from pyg_metric_attn.nn.pseudo_metric import ResidualTanhMLP


def weight_decay_groups(model: torch.nn.Module, weight_decay: float,
                        metric_mlp_weight_decay: float | None = None
                        ) -> list[dict[str, Any]]:
    """Parameter groups for a torch optimiser: the hidden and output layers
    of every :class:`~pyg_metric_attn.nn.pseudo_metric.ResidualTanhMLP` in
    ``model`` with ``metric_mlp_weight_decay``, all other parameters with
    ``weight_decay``. With ``metric_mlp_weight_decay=None`` (or equal to
    ``weight_decay``) one group of ``model.parameters()`` in their order, as
    an optimiser built on ``model.parameters()`` holds them (its checkpoints
    load either way)."""
    if metric_mlp_weight_decay is None or metric_mlp_weight_decay == weight_decay:
        return [{'params': list(model.parameters()), 'weight_decay': weight_decay}]
    mlp = {id(p) for module in model.modules()
           if isinstance(module, ResidualTanhMLP)
           for layer in (module.hidden, module.out) for p in layer.parameters()}
    rest = [p for p in model.parameters() if id(p) not in mlp]
    own = [p for p in model.parameters() if id(p) in mlp]
    return [{'params': rest, 'weight_decay': weight_decay},
            {'params': own, 'weight_decay': metric_mlp_weight_decay}]
