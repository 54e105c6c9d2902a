"""Reading meshes and label files, writing segmented meshes."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from pyg_metric_attn.geometry.mesh import MeshError
from pyg_metric_attn.utils.io import atomic_write_bytes
from pyg_metric_attn.utils.optional import needs_extra

with needs_extra('mesh'):
    import trimesh

MESH_EXTENSIONS = ('.obj', '.off', '.ply')
#: Formats that store every triangle with its own three corners (no shared
#: vertices): :func:`read_mesh` merges their coincident corners.
SOUP_EXTENSIONS = ('.stl',)


def read_mesh(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """``(pos [V, 3] float64, face [F, 3] int64)`` of a triangle mesh file,
    with vertex and face order exactly as stored (``process=False``).

    A triangle soup (:data:`SOUP_EXTENSIONS`, e.g. ``.stl``) has its identical
    corners merged into one vertex each (in order of first appearance), so
    that the triangles are connected; face order is kept."""
    path = Path(path)
    try:
        mesh = trimesh.load(path, process=False, maintain_order=True,
                            force='mesh')
    except Exception as error:
        raise MeshError(f"{path}: cannot be read as a mesh ({error})") from error
    face = np.asarray(mesh.faces, dtype=np.int64)
    if face.ndim != 2 or face.shape[1] != 3 or len(face) == 0:
        raise MeshError(f"{path}: has no triangle faces")
    pos = np.asarray(mesh.vertices, dtype=np.float64)
    if path.suffix.lower() in SOUP_EXTENSIONS:
        pos, face = merge_duplicate_vertices(pos, face)
    return pos, face


def merge_duplicate_vertices(pos: np.ndarray, face: np.ndarray
                             ) -> tuple[np.ndarray, np.ndarray]:
    """One vertex per distinct position (order of first appearance), faces
    re-indexed; vertices no face uses are dropped."""
    used = pos[face.reshape(-1)]
    _, first, inverse = np.unique(used, axis=0, return_index=True,
                                  return_inverse=True)
    order = np.argsort(first)  # unique sorts by position: restore file order
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return used[first[order]], rank[inverse.reshape(-1)].reshape(face.shape)


def read_labels(path: str | Path, dtype=np.int64) -> np.ndarray:
    """One label (or one row of soft labels) per line of a text file."""
    try:
        return np.loadtxt(path, dtype=dtype, ndmin=1)
    except (OSError, ValueError) as error:
        raise ValueError(f"{path}: cannot read labels ({error})") from error


def write_segmented_ply(path: str | Path, pos: np.ndarray, face: np.ndarray,
                        face_colors: np.ndarray) -> None:
    """Write a binary .ply with one RGB(A) colour per face (opens in MeshLab,
    trimesh and Blender), atomically."""
    mesh = trimesh.Trimesh(np.asarray(pos), np.asarray(face), process=False,
                           face_colors=np.asarray(face_colors))
    atomic_write_bytes(path, mesh.export(file_type='ply'))
