r"""Shared machinery of the mesh segmentation data sets: one
:class:`~torch_geometric.data.Data` per mesh, DiffusionNet operators computed
in parallel and cached by content, the processed file written atomically and
verified on load."""
from __future__ import annotations

import multiprocessing
import warnings
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from threadpoolctl import threadpool_limits
from torch_geometric.data import Data, InMemoryDataset
from torch_geometric.utils import remove_self_loops, to_undirected
from tqdm.auto import tqdm

from pyg_metric_attn.geometry.cache import OperatorCache
from pyg_metric_attn.geometry.mesh import (
    MeshError,
    check_mesh,
    face_areas,
    mesh_edges,
    normalize_positions,
)
from pyg_metric_attn.geometry.operators import mesh_operators
from pyg_metric_attn.utils.io import CorruptFileError, load_verified, save_verified

NUM_BODY_PARTS = 8
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
              vertex_labels: np.ndarray | None = None) -> Data:
    r"""One mesh as a PyG :class:`~torch_geometric.data.Data`.

    Attributes: ``pos`` (centred, unit max radius), ``face`` ``[3, F]``,
    ``edge_index`` (the undirected mesh edges, both directions),
    ``edge_label_index`` ``[2, E]`` (each edge once, in MeshCNN's order, see
    :func:`~pyg_metric_attn.geometry.mesh_edges`), ``edge_label_weight``
    (MeshCNN's edge areas: a third of the adjacent faces' areas over the
    total area; they sum to one), ``name`` and, where given
    (0-based), ``y`` (face labels), ``edge_label``, ``edge_label_soft``
    (``[E, C]`` booleans: the classes with a positive soft label, as MeshCNN
    reads ``.seseg`` files) and ``vertex_y``. Without face labels, ``y`` is
    the majority of the face's three edge labels, else of its three vertex
    labels (ties: the smallest label).
    """
    pos = np.asarray(pos, dtype=np.float64)
    face = np.asarray(face, dtype=np.int64)
    check_mesh(pos, face, name)
    edges, side_ids = mesh_edges(face)
    data = Data(pos=torch.from_numpy(normalize_positions(pos)).float(),
                face=torch.from_numpy(face.T.copy()), name=name,
                num_nodes=len(pos))
    data.edge_label_index = torch.from_numpy(edges.T.copy())
    areas = face_areas(pos, face)
    data.edge_label_weight = torch.from_numpy(np.bincount(
        side_ids.reshape(-1), weights=np.repeat(areas, 3), minlength=len(edges))
        / (3 * areas.sum())).float()
    edge_index, _ = remove_self_loops(data.edge_label_index)
    data.edge_index = to_undirected(edge_index, num_nodes=len(pos))

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
    return data


def _operators(pos: np.ndarray, face: np.ndarray, name: str,
               settings: dict[str, Any], cache_dir: str | None,
               spectral_basis: int) -> dict[str, Any]:
    with threadpool_limits(1):  # one BLAS thread per worker: no oversubscription
        operators = mesh_operators(pos, face, name=name,
                                   cache=OperatorCache(cache_dir), **settings)
    kept = {key: operators[key] for key in ('hks', 'mass')}
    if spectral_basis:
        kept['evals'] = operators['evals'][None, :spectral_basis]  # [1, m]
        kept['evecs'] = operators['evecs'][:, :spectral_basis]
    if settings['gradients']:
        kept['grad_index'], kept['grad_weight'] = _gradient_coefficients(
            operators['grad_x'], operators['grad_y'])
    return kept


def _gradient_coefficients(grad_x: torch.Tensor, grad_y: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The sparse ``[V, V]`` operators as one list of nonzeros: ``[2, nnz]``
    indices (their union) and ``[nnz, 2]`` coefficients (x, y)."""
    x, y = grad_x.values(), grad_y.values()
    both = torch.sparse_coo_tensor(
        torch.cat([grad_x.indices(), grad_y.indices()], dim=1),
        torch.cat([torch.stack([x, torch.zeros_like(x)], dim=1),
                   torch.stack([torch.zeros_like(y), y], dim=1)]),
        (*grad_x.shape, 2), check_invariants=True).coalesce()
    return both.indices(), both.values()


def compute_operators(data_list: list[Data], settings: dict[str, Any],
                      cache_dir: str | Path | None, num_workers: int = 2,
                      progress: bool = True, spectral_basis: int = 0) -> None:
    """Attach ``hks``, ``mass`` and ``x = hks`` to every mesh, and with
    ``spectral_basis = m > 0`` the first ``m`` eigenpairs (``evals``
    ``[1, m]``, ``evecs`` ``[V, m]``), with ``settings['gradients']`` the
    tangent gradients (``grad_index``, ``grad_weight``), computing the
    operators (or reading them from the cache) in ``num_workers``
    processes."""
    if not 0 <= spectral_basis <= settings['k']:
        raise ValueError(f"'spectral_basis' must be in [0, k={settings['k']}], "
                         f"got {spectral_basis}")
    jobs = [(d.pos.double().numpy(), d.face.t().numpy(), d.name, settings,
             None if cache_dir is None else str(cache_dir), spectral_basis)
            for d in data_list]
    bar = dict(total=len(jobs), desc='mesh operators', disable=not progress,
               dynamic_ncols=True)
    if num_workers > 1 and len(jobs) >= 4 * num_workers:  # else not worth spawning
        with ProcessPoolExecutor(num_workers, mp_context=SPAWN) as pool:
            results = list(tqdm(pool.map(_operators, *zip(*jobs, strict=True),
                                         chunksize=4), **bar))
    else:
        results = [_operators(*job) for job in tqdm(jobs, **bar)]
    for data, operators in zip(data_list, results, strict=True):
        for key, value in operators.items():
            data[key] = value
        data.x = data.hks


def _labels(data: Data) -> str:
    keys = [key for key in ('y', 'vertex_y', 'edge_label') if key in data]
    return ', '.join(keys) or 'none'


class MeshDataset(InMemoryDataset):
    r"""Base class of the mesh data sets. Subclasses yield the keyword
    arguments of :func:`mesh_data` for each mesh from :meth:`raw_meshes` and
    name their processed file.

    Every mesh gets ``x = hks`` (heat kernel signatures of the normalised
    mesh from ``k`` eigenpairs) and ``mass``, and with ``spectral_basis``
    the eigenpairs for spectral heat diffusion, with ``gradients`` the
    tangent gradient operators. Operators are cached per mesh
    in ``PROCESSED/operators/`` keyed by content, so re-processing (another
    split, a lost processed file) reads them back.

    Args:
        root (str): Root folder.
        k (int): Laplacian eigenpairs for the HKS. (default: :obj:`128`)
        hks_count (int): HKS scales. (default: :obj:`16`)
        spectral_basis (int): Eigenpairs kept per mesh as ``evals``
            ``[1, m]`` and ``evecs`` ``[V, m]`` (for
            :class:`~pyg_metric_attn.nn.HeatDiffusion`); :obj:`0` keeps
            none. (default: :obj:`0`)
        gradients (bool): Keep each mesh's tangent gradient operators as
            ``grad_index`` ``[2, nnz]`` and ``grad_weight`` ``[nnz, 2]``
            (see :func:`~pyg_metric_attn.nn.vertex_gradients`).
            (default: :obj:`False`)
        laplacian (str): ``'auto'``, ``'cotan'`` or ``'robust'``.
        num_workers (int): Processes computing operators. (default: :obj:`2`)
        processed_dir (str, optional): Where processed files go (default
            ``ROOT/processed``), e.g. to read raw files from a read-only copy.
        transform, pre_transform, pre_filter, force_reload, log: as in
            :class:`~torch_geometric.data.InMemoryDataset`.
    """
    def __init__(self, root: str, k: int = 128, hks_count: int = 16,
                 spectral_basis: int = 0, gradients: bool = False,
                 laplacian: str = 'auto', num_workers: int = 2,
                 processed_dir: str | None = None,
                 transform: Callable | None = None,
                 pre_transform: Callable | None = None,
                 pre_filter: Callable | None = None, force_reload: bool = False,
                 log: bool = True):
        self.settings = dict(k=k, hks_count=hks_count, gradients=gradients,
                             laplacian_method=laplacian)
        self.spectral_basis = spectral_basis
        self.num_workers = num_workers
        self._processed_dir = processed_dir
        super().__init__(root, transform, pre_transform, pre_filter,
                         force_reload=force_reload, log=log)
        try:
            self._load_processed()
        except CorruptFileError as error:
            warnings.warn(f"Re-processing: {error}", stacklevel=2)
            self.process()
            self._load_processed()

    @property
    def processed_dir(self) -> str:
        return self._processed_dir or str(Path(self.root) / 'processed')

    @property
    def settings_tag(self) -> str:
        s = self.settings
        tag = f"k{s['k']}_hks{s['hks_count']}_{s['laplacian_method']}"
        if self.spectral_basis:
            tag += f'_basis{self.spectral_basis}'
        return f'{tag}_grad' if s['gradients'] else tag

    def raw_meshes(self) -> Iterable[dict[str, Any]]:
        raise NotImplementedError

    def process(self) -> None:
        records = self.raw_meshes()
        data_list = [mesh_data(**record) for record in tqdm(
            records, desc='reading meshes', disable=not self.log,
            dynamic_ncols=True)]
        if self.pre_filter is not None:  # before the costly operators
            data_list = [d for d in data_list if self.pre_filter(d)]
        for data in data_list[1:]:  # one batch needs the same labels everywhere
            if set(data.keys()) != set(data_list[0].keys()):
                raise ValueError(
                    f"The meshes '{data_list[0].name}' and '{data.name}' have "
                    f"different labels ({_labels(data_list[0])} vs "
                    f"{_labels(data)}): label all meshes alike or none")
        compute_operators(data_list, self.settings,
                          Path(self.processed_dir) / 'operators',
                          self.num_workers, progress=self.log,
                          spectral_basis=self.spectral_basis)
        if self.pre_transform is not None:
            data_list = [self.pre_transform(d) for d in data_list]
        data, slices = self.collate(data_list)
        save_verified((data.to_dict(), slices), self.processed_paths[0])

    def _load_processed(self) -> None:
        data, self.slices = load_verified(self.processed_paths[0])
        self.data = Data.from_dict(data)
