r"""Shared machinery of the mesh segmentation data sets: one
:class:`~torch_geometric.data.Data` per mesh with its labels, the
:class:`~pyg_metric_attn.transforms.MeshPreprocessing` of every mesh as the
``pre_transform`` (in parallel), the processed file written atomically and
verified on load."""
from __future__ import annotations

import hashlib
import multiprocessing
import pickle
import re
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.data import Data
from tqdm.auto import tqdm

from pyg_metric_attn.geometry.mesh import (
    MeshError,
    check_mesh,
    face_areas,
    mesh_edges,
)
from pyg_metric_attn.datasets.verified_dataset import VerifiedInMemoryDataset
from pyg_metric_attn.transforms.mesh_preprocessing import MeshPreprocessing

#: Worker processes start fresh: forked children of a process whose OpenMP
#: runtime already runs threads can deadlock.
SPAWN = multiprocessing.get_context('spawn')


def majority_label(labels: np.ndarray) -> np.ndarray:
    """Row-wise most frequent label of ``[N, m]`` integer labels; a tie goes to
    the smallest of the tied labels."""
    labels = np.asarray(labels, dtype=np.int64)
    counts = np.zeros((len(labels), int(labels.max()) + 1), dtype=np.int64)
    np.add.at(counts, (np.repeat(np.arange(len(labels)), labels.shape[1]),
                       labels.reshape(-1)), 1)
    return counts.argmax(axis=1)  # argmax takes the first (smallest) maximum


def mesh_data(pos: np.ndarray, face: np.ndarray, name: str,
              face_labels: np.ndarray | None = None,
              edge_labels: np.ndarray | None = None,
              edge_soft_labels: np.ndarray | None = None,
              vertex_labels: np.ndarray | None = None,
              source_face: np.ndarray | None = None) -> Data:
    r"""One mesh as read, with its labels, as a PyG
    :class:`~torch_geometric.data.Data` (for
    :class:`~pyg_metric_attn.transforms.MeshPreprocessing`, which adds what the
    models read).

    Attributes: ``pos`` (as given, float64), ``face`` ``[3, F]``,
    ``edge_label_index`` ``[2, E]`` (each edge once, in MeshCNN's order, see
    :func:`~pyg_metric_attn.geometry.mesh_edges`), ``edge_label_weight``
    (MeshCNN's edge areas: a third of the adjacent faces' areas over the
    total area; they sum to one), ``name`` and, where given
    (0-based), ``y`` (face labels), ``edge_label``, ``edge_label_soft``
    (``[E, C]`` booleans: the classes with a positive soft label, as MeshCNN
    reads ``.seseg`` files) and ``vertex_y``. Without face labels, ``y`` is
    the majority of the face's three edge labels, else of its three vertex
    labels (ties: the smallest label). ``source_face`` ``[F]``, where given:
    the face of another mesh each face stems from (a perturbed copy's
    correspondence, see :func:`~pyg_metric_attn.geometry.perturb_mesh`).
    """
    pos = np.asarray(pos, dtype=np.float64)
    face = np.asarray(face, dtype=np.int64)
    check_mesh(pos, face, name)
    edges, side_ids = mesh_edges(face)
    data = Data(pos=torch.from_numpy(pos.copy()), face=torch.from_numpy(face.T.copy()),
                name=name, num_nodes=len(pos))
    data.edge_label_index = torch.from_numpy(edges.T.copy())
    areas = face_areas(pos, face)
    data.edge_label_weight = torch.from_numpy(np.bincount(
        side_ids.reshape(-1), weights=np.repeat(areas, 3), minlength=len(edges))
        / (3 * areas.sum())).float()

    def check_count(labels, expected, what, dtype=np.int64):
        if len(labels) != expected:
            raise MeshError(f"{name}: {len(labels)} {what} labels for {expected} "
                            f"{what}s")
        return np.asarray(labels, dtype=dtype)

    if edge_labels is not None:
        edge_labels = check_count(edge_labels, len(edges), 'edge')
        data.edge_label = torch.from_numpy(edge_labels)
        if face_labels is None:
            face_labels = majority_label(edge_labels[side_ids])
    if edge_soft_labels is not None:
        soft = check_count(edge_soft_labels, len(edges), 'edge', np.float64)
        data.edge_label_soft = torch.from_numpy(soft.reshape(len(soft), -1) > 0)
    if vertex_labels is not None:
        vertex_labels = check_count(vertex_labels, len(pos), 'vertex')
        data.vertex_y = torch.from_numpy(vertex_labels)
        if face_labels is None:
            face_labels = majority_label(vertex_labels[face])
    if face_labels is not None:
        data.y = torch.from_numpy(check_count(face_labels, len(face), 'face'))
    if source_face is not None:
        data.source_face = torch.from_numpy(check_count(source_face, len(face),
                                                        'face'))
    return data


def _labels(data: Data) -> str:
    keys = [key for key in ('y', 'vertex_y', 'edge_label') if key in data]
    return ', '.join(keys) or 'none'


#: The pre-transform of the mesh data sets unless one is given: HKS inputs
#: from 128 eigenpairs, no eigenpairs or gradient operators kept.
DEFAULT_PREPROCESSING = MeshPreprocessing()


def preprocessing_tag(pre_transform: Callable | None) -> str:
    """A name for what a ``pre_transform`` produces, for the processed folder:
    its ``tag`` where it has one (:attr:`MeshPreprocessing.tag`), ``'raw'``
    for :obj:`None`, else ``'custom_'`` and a hash of its ``repr``."""
    if pre_transform is None:
        return 'raw'
    tag = getattr(pre_transform, 'tag', None)
    if isinstance(tag, str):
        return tag
    digest = hashlib.sha256(repr(pre_transform).encode()).hexdigest()
    return f'custom_{digest[:12]}'


class MeshDataset(VerifiedInMemoryDataset):
    r"""Base class of the mesh data sets. Subclasses yield the keyword
    arguments of :func:`mesh_data` for each mesh from :meth:`raw_meshes` and
    name their processed file.

    Every mesh goes through ``pre_transform``, by default
    :class:`~pyg_metric_attn.transforms.MeshPreprocessing` (normalised
    ``pos``, ``edge_index``, ``x = hks``, ``mass``, and the eigenpairs or
    gradient operators its settings keep), in ``num_workers`` processes. The
    processed files go to ``PROCESSED/TAG/``, ``TAG`` naming the
    pre-transform's settings (:attr:`MeshPreprocessing.tag`), so data
    processed with other settings or by an older version are never read.
    Pass the same :class:`~pyg_metric_attn.transforms.MeshPreprocessing` to
    a mesh read from a file to get the fields of the data set's items.

    Args:
        root (str): Root folder.
        pre_transform (callable, optional): Applied to every mesh of
            :func:`mesh_data` before saving; with ``num_workers > 1`` it must
            be picklable. (default: :obj:`MeshPreprocessing()`)
        num_workers (int): Processes preprocessing the meshes.
            (default: :obj:`2`)
        processed_dir (str, optional): Where processed files go (default
            ``ROOT/processed``), e.g. to read raw files from a read-only copy.
        transform, pre_filter, force_reload, log: as in
            :class:`~torch_geometric.data.InMemoryDataset` (``pre_filter``
            sees the meshes of :func:`mesh_data`, before the costly
            pre-transform).
    """
    def __init__(self, root: str,
                 pre_transform: Callable | None = DEFAULT_PREPROCESSING,
                 num_workers: int = 2, processed_dir: str | None = None,
                 transform: Callable | None = None,
                 pre_filter: Callable | None = None, force_reload: bool = False,
                 log: bool = True):
        self.num_workers = num_workers
        super().__init__(root, processed_dir, transform, pre_transform,
                         pre_filter, force_reload=force_reload, log=log)

    @property
    def processed_dir(self) -> str:
        return str(self.processed_root / preprocessing_tag(self.pre_transform))

    def raw_meshes(self) -> Iterable[dict[str, Any]]:
        raise NotImplementedError

    def process(self) -> None:
        self._warn_about_older_versions()
        records = self.raw_meshes()
        data_list = [mesh_data(**record) for record in tqdm(
            records, desc='reading meshes', disable=not self.log,
            dynamic_ncols=True)]
        if self.pre_filter is not None:  # before the costly pre-transform
            data_list = [d for d in data_list if self.pre_filter(d)]
        for data in data_list[1:]:  # one batch needs the same labels everywhere
            if set(data.keys()) != set(data_list[0].keys()):
                raise ValueError(
                    f"The meshes '{data_list[0].name}' and '{data.name}' have "
                    f"different labels ({_labels(data_list[0])} vs "
                    f"{_labels(data)}): label all meshes alike or none")
        if self.pre_transform is not None:
            data_list = self._pre_transformed(data_list)
        self.save_processed(*self.collate(data_list))

    def _pre_transformed(self, data_list: list[Data]) -> list[Data]:
        bar = dict(total=len(data_list), desc='preprocessing meshes',
                   disable=not self.log, dynamic_ncols=True)
        if self.num_workers > 1 and len(data_list) >= 4 * self.num_workers:
            try:  # (fewer meshes: not worth spawning)
                pickle.dumps(self.pre_transform)
            except Exception as error:
                raise ValueError(
                    f"The pre_transform {self.pre_transform!r} cannot be sent to "
                    f"{self.num_workers} worker processes ({error}): pass a "
                    f"picklable one or num_workers=1") from error
            with ProcessPoolExecutor(self.num_workers, mp_context=SPAWN) as pool:
                return list(tqdm(pool.map(self.pre_transform, data_list,
                                          chunksize=4), **bar))
        return [self.pre_transform(data) for data in tqdm(data_list, **bar)]

    def _warn_about_older_versions(self) -> None:
        """Name the processed files of older versions beside this one's:
        files directly in the processed root (version 1: one folder for every
        setting, operator cache in ``operators/``) and folders of other
        :attr:`MeshPreprocessing.version`."""
        root, current = self.processed_root, f'v{MeshPreprocessing.version}_'
        if not root.is_dir():
            return
        older = sorted(path.name for path in root.iterdir()
                       if path.suffix == '.pt' or (
                           path.is_dir() and re.fullmatch(r'v\d+_.*', path.name)
                           and not path.name.startswith(current)))
        if any(name.endswith('.pt') for name in older) and (
                root / 'operators').is_dir():
            older.append('operators')
        if older:
            warnings.warn(
                f"'{root}' holds processed files of an older version of "
                f"pyg_metric_attn ({', '.join(older)}), which are not read any "
                f"more: processing anew into '{self.processed_dir}'; delete "
                f"them to free the space", stacklevel=2)
