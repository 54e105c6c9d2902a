r"""Constant scalars as device tensors, made once.

A float that a kernel reads from memory (a time scale) must become a
one-element tensor on the device, and ``torch.full`` is a kernel launch
there on every call. :func:`device_constant` keeps the last few such
tensors by value, device and dtype, so a repeated training step makes none.
Under :func:`torch.compile` it makes the tensor in the graph instead (a
constant to the compiler). Callers must not write to the returned tensor.
"""
from __future__ import annotations

import torch
from torch import Tensor

#: Most constants kept (least recently used first out).
CAPACITY = 16

_constants: dict[tuple[float, torch.device, torch.dtype, tuple[int, ...]],
                 Tensor] = {}


def device_constant(value: float, device: torch.device, dtype: torch.dtype,
                    shape: tuple[int, ...] = ()) -> Tensor:
    """A tensor of ``shape`` filled with ``value``, made once per value,
    device, dtype and shape outside :func:`torch.compile` (read only)."""
    if torch.compiler.is_compiling():
        return torch.full(shape, value, device=device, dtype=dtype)
    key = (value, torch.device(device), dtype, shape)
    constant = _constants.pop(key, None)
    if constant is None:
        constant = torch.full(shape, value, device=device, dtype=dtype)
    _constants[key] = constant  # most recent last
    while len(_constants) > CAPACITY:
        del _constants[next(iter(_constants))]
    return constant
