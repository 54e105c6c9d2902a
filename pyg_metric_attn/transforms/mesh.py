"""Augmentations of meshes: random rotations of the positions."""
from __future__ import annotations

import torch
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform

from pyg_metric_attn.geometry.rotation import random_rotation


class RandomRotation(BaseTransform):
    r"""Rotates ``data.pos`` by a uniformly random rotation of :math:`SO(3)`
    (QR of a Gaussian matrix, sign-corrected), e.g. to augment ``xyz`` inputs."""
    def __init__(self, generator: torch.Generator | None = None):
        self.generator = generator

    def forward(self, data: Data) -> Data:
        data.pos = data.pos @ random_rotation(self.generator).to(data.pos.dtype).T
        return data
