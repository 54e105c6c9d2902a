"""Any folder of triangle meshes, optionally with label files."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pyg_metric_attn.datasets.mesh_dataset import MeshDataset
from pyg_metric_attn.datasets.mesh_io import MESH_EXTENSIONS, read_labels, read_mesh
from pyg_metric_attn.geometry.mesh import MeshError


class MeshFolder(MeshDataset):
    r"""Every ``.obj``, ``.off`` and ``.ply`` mesh below ``root`` (sorted by
    path; ``root/processed`` is skipped), with vertex and face order as stored.

    A label file ``NAME.txt`` (or ``NAME.seg``) beside ``NAME.obj`` holds one
    integer per line: per-face labels (as many lines as faces, stored as
    ``y``) or per-vertex labels (as many lines as vertices, stored as
    ``vertex_y``, and ``y`` = the majority of each face's vertex labels, ties
    to the smallest). ``first_label`` is subtracted (1 for 1-based files).

    Args:
        root (str): The folder.
        label_kind (str): ``'auto'`` (by line count), ``'face'`` or
            ``'vertex'``. (default: :obj:`'auto'`)
        first_label (int): The smallest label value in the files.
            (default: :obj:`0`)
        **kwargs: see :class:`~pyg_metric_attn.datasets.mesh_dataset.MeshDataset`.
    """
    def __init__(self, root: str, label_kind: str = 'auto', first_label: int = 0,
                 **kwargs: Any):
        if label_kind not in ('auto', 'face', 'vertex'):
            raise ValueError(f"'label_kind' must be 'auto', 'face' or 'vertex', "
                             f"got '{label_kind}'")
        self.label_kind = label_kind
        self.first_label = first_label
        super().__init__(root, **kwargs)

    @property
    def raw_dir(self) -> str:
        return self.root

    @property
    def processed_file_names(self) -> list[str]:
        return [f'meshes_{self.label_kind}{self.first_label}.pt']

    def mesh_paths(self) -> list[Path]:
        processed = self.processed_root.resolve()
        return sorted(p for p in Path(self.root).rglob('*')
                      if p.suffix.lower() in MESH_EXTENSIONS
                      and processed not in p.resolve().parents)

    def raw_meshes(self) -> Iterator[dict[str, Any]]:
        paths = self.mesh_paths()
        if not paths:
            raise FileNotFoundError(f"No {'/'.join(MESH_EXTENSIONS)} meshes below "
                                    f"'{self.root}'")
        for path in paths:
            pos, face = read_mesh(path)
            name = str(path.relative_to(self.root))
            record = dict(pos=pos, face=face, name=name)
            label_path = next((p for p in (path.with_suffix('.txt'),
                                           path.with_suffix('.seg')) if p.exists()),
                              None)
            if label_path is not None:
                labels = read_labels(label_path) - self.first_label
                record[self._label_key(labels, len(face), len(pos), name)] = labels
            yield record

    def _label_key(self, labels, num_faces: int, num_vertices: int,
                   name: str) -> str:
        kind = self.label_kind
        if kind == 'auto':
            if num_faces == num_vertices or len(labels) not in (num_faces,
                                                                num_vertices):
                raise MeshError(f"{name}: {len(labels)} labels for {num_faces} "
                                f"faces and {num_vertices} vertices; pass "
                                f"label_kind='face' or 'vertex'")
            kind = 'face' if len(labels) == num_faces else 'vertex'
        return 'face_labels' if kind == 'face' else 'vertex_labels'
