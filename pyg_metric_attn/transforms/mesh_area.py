r"""Prepared meshes scaled to a set surface area, with their operators.

:class:`~pyg_metric_attn.transforms.MeshPreprocessing` scales every mesh to
unit maximum radius, DiffusionNet's normalisation. That radius is extrinsic:
the same body with its arms spread has a larger one than with its arms at its
sides (the MeshCNN human_seg training meshes span 1.2 to 4.1 in surface area
after it), and a rough surface (vertex noise) gains area at the same radius.
Heat kernel signatures and the Laplacian spectrum depend on the scale, so
they carry that pose and noise into the inputs. Surface area is intrinsic:
scaled to one area, the spectrum and the HKS of a mesh no longer depend on
how it is posed or how rough it is, as far as its area does not.
"""
from __future__ import annotations

import copy

import torch
from torch_geometric.data import Data
from torch_geometric.transforms import BaseTransform
from torch_geometric.utils import scatter

from pyg_metric_attn.geometry.spectral import HKS_MIN_TIME
from pyg_metric_attn.transforms.mesh import rescaled_heat_kernel_signatures

#: Relative difference above which a mesh's stored HKS are taken to come from
#: other eigenpairs than those it carries (float32 round-off stays below 1e-4).
HKS_MISMATCH = 1e-3


def scale_to_area(data: Data, area: float = 1.0,
                  min_time: float = HKS_MIN_TIME, verify: bool = True) -> Data:
    r"""A copy of prepared meshes (one, or a batch of them) each scaled by
    :math:`a = (\text{area} / A)^{1/2}`, :math:`A` its surface area (the sum
    of its lumped vertex areas ``mass``), so that its area becomes ``area``,
    with every operator :class:`~pyg_metric_attn.transforms.MeshPreprocessing`
    stored scaled exactly as computing it on the scaled mesh gives:
    ``pos`` :math:`\to a\,` ``pos``, ``mass`` :math:`\to a^2` ``mass``,
    ``evals`` :math:`\to` ``evals`` :math:`/ a^2`, ``evecs`` :math:`\to`
    ``evecs`` :math:`/ a` (still mass-orthonormal), ``grad_weight``
    :math:`\to` ``grad_weight`` :math:`/ a`, and ``hks`` (and ``x``, where it
    is ``hks``) recomputed from the scaled eigenpairs at the same times.
    Other attributes are shared with ``data``.

    Args:
        data (Data or Batch): Meshes as
            :class:`~pyg_metric_attn.transforms.MeshPreprocessing` prepares
            them (``batch`` tells a batch's meshes apart); with ``hks``, also
            the eigenpairs the HKS came from (``spectral_basis = k``).
        area (float, optional): The surface area every mesh gets.
            (default: :obj:`1.0`)
        min_time (float, optional): The shortest of the stored HKS times.
            (default: :obj:`1e-2`)
        verify (bool, optional): Check that every mesh has a surface and
            that its stored HKS are those of its eigenpairs (one more HKS
            computation and a host sync); :obj:`False` where the meshes'
            preparation guarantees both. (default: :obj:`True`)
    """
    if area <= 0:
        raise ValueError(f"'area' must be positive, got {area}")
    if 'mass' not in data:
        raise ValueError("Scaling a mesh to an area needs its vertex areas "
                         "'mass': prepare it with MeshPreprocessing")
    batch = data.batch if 'batch' in data else None
    num_meshes = int(data.num_graphs) if batch is not None else 1
    index = (batch if batch is not None
             else torch.zeros_like(data.mass, dtype=torch.long))
    surface = scatter(data.mass, index, 0, dim_size=num_meshes, reduce='sum')
    if verify and not bool((surface > 0).all()):
        raise ValueError("A mesh has no surface area (all its vertex areas "
                         "are zero): it cannot be scaled to an area")
    factor = (area / surface).sqrt()  # a per mesh [B]
    out = copy.copy(data)  # the attributes not scaled stay shared
    per_vertex = factor[index]
    out.mass = data.mass * per_vertex.square()
    if 'pos' in data:
        out.pos = data.pos * per_vertex.to(data.pos.dtype)[:, None]
    if 'grad_weight' in data:
        rows = per_vertex[data.grad_index[0]]
        out.grad_weight = data.grad_weight / rows.to(data.grad_weight.dtype)[:, None]
    if 'evals' in data:
        out.evals = data.evals / factor.square().to(data.evals.dtype)[:, None]
        out.evecs = data.evecs / per_vertex.to(data.evecs.dtype)[:, None]
    if 'hks' in data:
        if 'evals' not in data:
            raise ValueError("Scaling a mesh's 'hks' recomputes them from its "
                             "eigenpairs: prepare it with spectral_basis = k")
        count = data.hks.size(1)
        ones = torch.ones(num_meshes, dtype=data.evals.dtype,
                          device=data.evals.device)
        if verify:
            stored = rescaled_heat_kernel_signatures(data.evals, data.evecs, batch,
                                                     ones, count, min_time)
            mismatch = ((stored - data.hks).norm() / data.hks.norm()).item()
            if mismatch > HKS_MISMATCH:
                raise ValueError(f"The meshes' 'hks' differ from those of their "
                                 f"eigenpairs at {count} times from {min_time} "
                                 f"to 1 by {mismatch:.2g} (relative): they came "
                                 f"from more eigenpairs or other times; prepare "
                                 f"the meshes with spectral_basis = k")
        out.hks = rescaled_heat_kernel_signatures(out.evals, out.evecs, batch,
                                                  ones, count, min_time
                                                  ).to(data.hks.dtype)
        if 'x' in data and torch.equal(data.x, data.hks):
            out.x = out.hks
    return out


class AreaNormalization(BaseTransform):
    r"""Scales a prepared mesh to a set surface area with its operators
    (:func:`scale_to_area`): spectrum and heat kernel signatures that do not
    depend on the pose or roughness behind the unit maximum radius of
    :class:`~pyg_metric_attn.transforms.MeshPreprocessing`.

    Args:
        area (float, optional): The surface area. (default: :obj:`1.0`)
        min_time (float, optional): The shortest of the stored HKS times.
            (default: :obj:`1e-2`)
    """
    def __init__(self, area: float = 1.0, min_time: float = HKS_MIN_TIME):
        if area <= 0:
            raise ValueError(f"'area' must be positive, got {area}")
        self.area = area
        self.min_time = min_time

    def forward(self, data: Data) -> Data:
        return scale_to_area(data, self.area, self.min_time)

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}(area={self.area})'
