"""One way to run any mesh model on a batch of meshes."""
from __future__ import annotations

from typing import Any

import torch
from torch import Tensor


def mesh_forward(model: torch.nn.Module, x: Tensor, data: Any) -> Tensor:
    """``model(x, **fields)``: the model's input features ``x`` and, by
    keyword, every field of ``data`` (a mesh, or a batch of meshes, as
    :class:`~pyg_metric_attn.transforms.MeshPreprocessing` prepares them)
    that the model names in its ``mesh_inputs`` and the meshes carry. A
    model wrapped in :class:`~torch.nn.parallel.DistributedDataParallel` is
    called through the wrapper."""
    inner = model.module if isinstance(
        model, torch.nn.parallel.DistributedDataParallel) else model
    names = getattr(inner, 'mesh_inputs', None)
    if names is None:
        raise TypeError(f"{type(inner).__name__} names no 'mesh_inputs' (the "
                        f"keyword arguments of its forward that a batch of "
                        f"meshes supplies)")
    return model(x, **{name: data[name] for name in names if name in data})
