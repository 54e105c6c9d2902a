"""Random rotations of 3D positions (a perturbation of
:func:`~pyg_metric_attn.geometry.perturb_mesh` and the augmentation of
:class:`~pyg_metric_attn.transforms.RandomRotation`)."""
from __future__ import annotations

import torch


def random_rotation(generator: torch.Generator | None = None,
                    axis: int | None = None) -> torch.Tensor:
    """A uniformly random ``3 x 3`` rotation matrix: of :math:`SO(3)`, or
    about the coordinate axis ``axis`` (``0``, ``1``, ``2``: x, y, z) by a
    uniform angle (DiffusionNet's augmentation about the up axis)."""
    if axis is not None:
        if axis not in (0, 1, 2):
            raise ValueError(f"'axis' must be 0, 1 or 2 (x, y, z), got {axis!r}")
        angle = 2 * torch.pi * torch.rand((), generator=generator,
                                          dtype=torch.float64)
        cos, sin = torch.cos(angle), torch.sin(angle)
        first, second = [a for a in range(3) if a != axis]
        rotation = torch.eye(3, dtype=torch.float64)
        rotation[first, first] = rotation[second, second] = cos
        rotation[first, second], rotation[second, first] = -sin, sin
        return rotation
    q, r = torch.linalg.qr(torch.randn(3, 3, generator=generator,
                                       dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))
    if torch.det(q) < 0:
        q[:, 0] = -q[:, 0]
    return q
