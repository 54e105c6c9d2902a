r"""Perturbed copies of labelled meshes (remeshed, deformed, rotated,
renumbered), with labels carried over and the correspondence stored: the
robustness set of the segmentation models, and training sets that draw
among a mesh and its copies."""
from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data

from pyg_metric_attn.datasets.mesh_dataset import MeshDataset
from pyg_metric_attn.geometry.perturbations import (
    PERTURBATION_VERSIONS,
    PERTURBATIONS,
    perturb_mesh,
)


def meshes_fingerprint(meshes: Sequence[Data]) -> str:
    """The SHA-256 of the meshes' names, positions, faces and labels ``y``:
    what their perturbed copies are made from."""
    digest = hashlib.sha256()
    for data in meshes:
        digest.update(str(data.name).encode())
        for value in (data.pos, data.face, data.y):
            digest.update(value.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


class PerturbedMeshes(MeshDataset):
    r"""One perturbed copy of every mesh of ``meshes``
    (:func:`~pyg_metric_attn.geometry.perturb_mesh` with ``perturbation``),
    through the ``pre_transform`` as any mesh data set.

    Mesh :math:`i`'s copy draws from ``numpy.random.default_rng((seed, i,
    p))``, :math:`p` the index of ``perturbation`` in
    :data:`~pyg_metric_attn.geometry.PERTURBATIONS`: the set is the same for
    the same meshes and seed. Every copy keeps its original's ``name``, has
    ``y`` carried from the original's face labels and ``source_face``
    ``[F]``, the original's face each face stems from (exact where the
    connectivity is kept or refined, else the nearest centroid). The
    processed file (atomic, verified on load) is named by the perturbation
    and its version (:data:`~pyg_metric_attn.geometry.PERTURBATION_VERSIONS`),
    the seed and the first 16 hex digits of :func:`meshes_fingerprint`, so
    other meshes, seeds or versions never read it.

    Args:
        root (str): Folder of the processed files (``root/TAG/``, ``TAG``
            naming the pre-transform).
        meshes (sequence of Data): Meshes with ``pos``, ``face`` ``[3, F]``,
            ``y`` (face labels) and ``name``, e.g. a test set.
        perturbation (str): One of
            :data:`~pyg_metric_attn.geometry.PERTURBATIONS`.
        seed (int): Seed of the random draws. (default: :obj:`0`)
        **kwargs: see :class:`~pyg_metric_attn.datasets.mesh_dataset.MeshDataset`.
    """
    def __init__(self, root: str | Path, meshes: Sequence[Data],
                 perturbation: str, seed: int = 0, **kwargs: Any):
        if perturbation not in PERTURBATIONS:
            raise ValueError(f"Unknown perturbation '{perturbation}'; expected "
                             f"one of {', '.join(PERTURBATIONS)}")
        missing = [key for key in ('pos', 'face', 'y') if key not in meshes[0]]
        if missing:
            raise ValueError(f"The meshes to perturb need {missing}")
        self.meshes = meshes
        self.perturbation = perturbation
        self.seed = seed
        self.fingerprint = meshes_fingerprint(meshes)
        super().__init__(str(root), processed_dir=str(root), **kwargs)

    @property
    def raw_file_names(self) -> list[str]:
        return []

    @property
    def processed_file_names(self) -> list[str]:
        version = PERTURBATION_VERSIONS[self.perturbation]
        return [f'{self.perturbation}-v{version}_seed{self.seed}_'
                f'{self.fingerprint[:16]}.pt']

    def raw_meshes(self) -> Iterator[dict[str, Any]]:
        index = PERTURBATIONS.index(self.perturbation)
        for i, data in enumerate(self.meshes):
            rng = np.random.default_rng((self.seed, i, index))
            pos, face, source = perturb_mesh(
                data.pos.double().numpy(), data.face.t().numpy(),
                self.perturbation, rng)
            yield dict(pos=pos, face=face, name=data.name,
                       face_labels=data.y.numpy()[source], source_face=source)


class RandomCopies(torch.utils.data.Dataset):
    r"""Mesh :math:`i` is ``meshes[i]`` or the :math:`i`-th mesh of one of
    ``copies`` (e.g. :class:`PerturbedMeshes` of ``meshes``), drawn uniformly
    at random with torch's global generator on every access: a training set
    whose meshes are made differently from epoch to epoch. Items keep the
    attributes that the meshes and all copies have (a batch needs the same
    everywhere).

    Args:
        meshes (sequence of Data): The meshes.
        copies (sequence of sequences of Data): Copies of them, each in the
            order of ``meshes``.
    """
    def __init__(self, meshes: Sequence[Data], copies: Sequence[Sequence[Data]]):
        for copy in copies:
            if len(copy) != len(meshes):
                raise ValueError(f"Every copy must hold one mesh per mesh "
                                 f"({len(meshes)}), got {len(copy)}")
        self.sources = (meshes, *copies)
        self.keys = sorted(set.intersection(*(set(source[0].keys())
                                              for source in self.sources)))

    def __len__(self) -> int:
        return len(self.sources[0])

    def __getitem__(self, index: int) -> Data:
        data = self.sources[int(torch.randint(len(self.sources), ()))][index]
        return Data.from_dict({key: data[key] for key in self.keys})
