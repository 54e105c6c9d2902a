r"""Grey-scale images as point clouds of their ink pixels.

Every pixel brighter than ``threshold`` becomes a point at its normalised
position :math:`(u, v) \in [-1, 1]^2` (:math:`u` from left to right, :math:`v`
from bottom to top, so that a digit stands upright in a plot) with features
:math:`(u, v, \text{intensity})`, the intensity in :math:`[0, 1]` (``uint8``
pixels divided by 255, float pixels as they are). Points keep the row-major
order of their pixels.
"""
from __future__ import annotations

import torch
from torch import Tensor
from torch_geometric.data import Data


def image_point_clouds(images: Tensor, threshold: float = 0
                       ) -> tuple[Tensor, Tensor, Tensor]:
    r"""The ink pixels of a stack of images, all at once.

    Args:
        images (torch.Tensor): Grey-scale images ``[B, H, W]`` (``uint8``
            0-255, or floats).
        threshold (float, optional): A pixel is ink where its value (as
            stored: 0-255 for ``uint8``) is above ``threshold``.
            (default: :obj:`0`)

    Returns:
        ``(pos, intensity, ptr)``: positions ``[N, 2]`` in :math:`[-1, 1]`,
        intensities ``[N]`` and ``ptr`` ``[B + 1]``, the points of image
        ``b`` being ``ptr[b]:ptr[b + 1]`` (an image without ink has none).
    """
    if images.dim() != 3 or min(images.shape[1:]) < 2:
        raise ValueError(f"'images' must be grey-scale images [B, H, W] of at "
                         f"least 2 x 2 pixels, got shape {list(images.shape)}")
    if images.is_complex() or images.dtype == torch.bool:
        raise ValueError(f"'images' must hold uint8 or real pixel values, got "
                         f"{images.dtype}")
    height, width = images.shape[1:]
    image, row, col = (images > threshold).nonzero(as_tuple=True)
    u = 2.0 * col / (width - 1) - 1.0
    v = 1.0 - 2.0 * row / (height - 1)
    pos = torch.stack([u, v], dim=1).float()
    intensity = images[image, row, col].float()
    if images.dtype == torch.uint8:
        intensity = intensity / 255.0
    counts = torch.bincount(image, minlength=images.size(0))
    ptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    return pos, intensity, ptr


def image_point_cloud(image: Tensor, label: int | Tensor | None = None,
                      threshold: float = 0) -> Data:
    r"""One image ``[H, W]`` as a :class:`~torch_geometric.data.Data` point
    cloud of its ink pixels (see :func:`image_point_clouds`): ``pos``
    ``[N, 2]``, ``x = (u, v, intensity)`` ``[N, 3]`` and, where a ``label``
    is given, ``y`` ``[1]``."""
    if image.dim() != 2:
        raise ValueError(f"'image' must be one grey-scale image [H, W], got "
                         f"shape {list(image.shape)}")
    pos, intensity, _ = image_point_clouds(image.unsqueeze(0), threshold)
    data = Data(x=torch.cat([pos, intensity.unsqueeze(1)], dim=1), pos=pos)
    if label is not None:
        data.y = torch.as_tensor(label, dtype=torch.long).view(1)
    return data
