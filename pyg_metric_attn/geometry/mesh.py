r"""Triangle-mesh basics: validation, normalisation, areas, edges and the
vertex-to-face averaging. Meshes are ``(pos [V, 3] float, face [F, 3] int)``
NumPy arrays; vertex and face order are kept as given."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components


class MeshError(ValueError):
    """A mesh cannot be processed; the message names the mesh and the problem."""


def check_mesh(pos: np.ndarray, face: np.ndarray, name: str = 'mesh') -> None:
    """Raise :class:`MeshError` for input no operator can handle robustly:
    wrong shapes, no faces, non-finite coordinates, face indices out of range
    and unreferenced vertices (they would get zero mass)."""
    pos, face = np.asarray(pos), np.asarray(face)
    if pos.ndim != 2 or pos.shape[1] != 3 or len(pos) == 0:
        raise MeshError(f"{name}: vertex positions must have shape [V, 3], got "
                        f"{list(pos.shape)}")
    if face.ndim != 2 or face.shape[1] != 3 or len(face) == 0:
        raise MeshError(f"{name}: faces must be triangles of shape [F, 3], got "
                        f"{list(face.shape)}")
    bad = ~np.isfinite(pos).all(axis=1)
    if bad.any():
        raise MeshError(f"{name}: {int(bad.sum())} vertices have NaN or infinite "
                        f"coordinates (first: vertex {int(np.flatnonzero(bad)[0])})")
    if face.min() < 0 or face.max() >= len(pos):
        raise MeshError(f"{name}: face indices must lie in [0, {len(pos) - 1}], got "
                        f"[{int(face.min())}, {int(face.max())}]")
    unreferenced = np.setdiff1d(np.arange(len(pos)), face)
    if len(unreferenced):
        raise MeshError(f"{name}: {len(unreferenced)} vertices belong to no face "
                        f"(first: vertex {int(unreferenced[0])}); remove them "
                        f"before computing operators")


#: A face whose area is below this share of the squared radius of its mesh
#: (the largest distance of a vertex from the vertex mean) is degenerate.
DEGENERATE_AREA = 1e-12


def check_surface(pos: np.ndarray, face: np.ndarray, name: str = 'mesh') -> None:
    """Raise :class:`MeshError` for a mesh that is not one connected,
    edge-manifold surface of proper triangles: what a model trained on such
    surfaces (as the human_seg models) needs from a mesh given to
    ``predict``. Runs :func:`check_mesh` first. The message names the
    problem and its first instance: degenerate faces (a repeated vertex, or
    an area of at most :data:`DEGENERATE_AREA` times the squared radius),
    edges shared by more than two faces, several connected components."""
    check_mesh(pos, face, name)
    pos, face = np.asarray(pos, dtype=np.float64), np.asarray(face)
    radius = np.linalg.norm(pos - pos.mean(axis=0), axis=1).max()
    degenerate = ((face[:, 0] == face[:, 1]) | (face[:, 1] == face[:, 2])
                  | (face[:, 2] == face[:, 0])
                  | (face_areas(pos, face) <= DEGENERATE_AREA * radius ** 2))
    if degenerate.any():
        first = int(np.flatnonzero(degenerate)[0])
        raise MeshError(f"{name}: {int(degenerate.sum())} degenerate faces "
                        f"(zero area; first: face {first}); remove them, e.g. "
                        f"trimesh's update_faces(mesh.nondegenerate_faces())")
    edges, side_ids = mesh_edges(face)
    counts = np.bincount(side_ids.reshape(-1), minlength=len(edges))
    if counts.max() > 2:
        first = edges[np.argmax(counts > 2)]
        raise MeshError(f"{name}: non-manifold: {int((counts > 2).sum())} edges "
                        f"are shared by more than two faces (first: vertices "
                        f"{int(first[0])}-{int(first[1])}); repair the mesh "
                        f"into one surface first")
    adjacency = sp.coo_matrix((np.ones(len(edges)), (edges[:, 0], edges[:, 1])),
                              shape=(len(pos), len(pos)))
    count, component = connected_components(adjacency, directed=False)
    if count > 1:
        sizes = np.bincount(component)
        raise MeshError(f"{name}: {count} connected components (face counts "
                        f"{_component_faces(face, component, count)}); the "
                        f"model segments one connected surface: keep the "
                        f"largest ({int(sizes.max())} vertices), e.g. with "
                        f"trimesh's mesh.split()")


def _component_faces(face: np.ndarray, component: np.ndarray,
                     count: int) -> str:
    """The face count of each component, largest first (at most five)."""
    faces = np.sort(np.bincount(component[face[:, 0]], minlength=count))[::-1]
    shown = ', '.join(str(int(n)) for n in faces[:5])
    return shown + (', ...' if count > 5 else '')


def normalize_positions(pos: np.ndarray) -> np.ndarray:
    r"""Centre on the vertex mean and scale to unit maximum radius,
    :math:`p \mapsto (p - \bar p) / \max_i \|p_i - \bar p\|`."""
    centred = pos - pos.mean(axis=0, keepdims=True)
    radius = np.linalg.norm(centred, axis=1).max()
    return centred / radius if radius > 0 else centred


def renumber_mesh(pos: np.ndarray, face: np.ndarray,
                  rng: np.random.Generator
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The same surface numbered at random: vertices and faces in random
    order, each face's corners rotated by a random 0-2 places (orientation
    kept). Returns ``(pos, face, vertex_order, face_order)``: new vertex
    ``i`` is old vertex ``vertex_order[i]``, new face ``f`` old face
    ``face_order[f]``."""
    vertex_order = rng.permutation(len(pos))
    new_index = np.argsort(vertex_order)
    face_order = rng.permutation(len(face))
    corners = (np.arange(3) + rng.integers(0, 3, len(face))[:, None]) % 3
    new_face = np.take_along_axis(new_index[face[face_order]], corners, axis=1)
    return pos[vertex_order], new_face, vertex_order, face_order


def face_cross_products(pos: np.ndarray, face: np.ndarray) -> np.ndarray:
    r""":math:`(p_1 - p_0) \times (p_2 - p_0)` per face, ``[F, 3]``: the face
    normal scaled by twice the area."""
    return np.cross(pos[face[:, 1]] - pos[face[:, 0]],
                    pos[face[:, 2]] - pos[face[:, 0]])


def face_areas(pos: np.ndarray, face: np.ndarray) -> np.ndarray:
    r"""Triangle areas :math:`\tfrac12 \|(p_1 - p_0) \times (p_2 - p_0)\|`."""
    return 0.5 * np.linalg.norm(face_cross_products(pos, face), axis=1)


def face_normals(pos: np.ndarray, face: np.ndarray) -> np.ndarray:
    """Unit face normals (zero for zero-area faces)."""
    cross = face_cross_products(pos, face)
    norm = np.linalg.norm(cross, axis=1, keepdims=True)
    return np.divide(cross, norm, out=np.zeros_like(cross), where=norm > 0)


def mesh_edges(face: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    r"""Unique undirected edges in MeshCNN's order, ``[E, 2]``, and the edge id
    of each face side, ``[F, 3]``.

    Faces are visited in order, their sides :math:`(v_0, v_1), (v_1, v_2),
    (v_2, v_0)` in turn; each side is sorted and an edge gets its id on its
    first occurrence (the order of MeshCNN's ``.eseg`` labels).
    """
    sides = np.stack([face[:, [0, 1]], face[:, [1, 2]], face[:, [2, 0]]], axis=1)
    sides = np.sort(sides.reshape(-1, 2), axis=1)
    unique, first, inverse = np.unique(sides, axis=0, return_index=True,
                                       return_inverse=True)
    order = np.argsort(first, kind='stable')  # edge ids by first occurrence
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return unique[order], rank[inverse.reshape(-1)].reshape(-1, 3)


def edge_face_counts(face: np.ndarray) -> np.ndarray:
    """Number of faces on each edge of :func:`mesh_edges` (2 on a closed
    2-manifold; 1 on a boundary; more on a non-manifold edge)."""
    edges, side_ids = mesh_edges(face)
    return np.bincount(side_ids.reshape(-1), minlength=len(edges))


def is_edge_manifold(face: np.ndarray) -> bool:
    """No edge is shared by more than two faces."""
    return bool(edge_face_counts(face).max() <= 2)


def vertex_to_face_averaging(face: np.ndarray, num_vertices: int) -> sp.csr_matrix:
    r"""The fixed ``[F, V]`` matrix that gives each face the mean of its three
    vertices (the paper's fixed linear aggregation layer)."""
    rows = np.repeat(np.arange(len(face)), 3)
    values = np.full(rows.shape, 1.0 / 3.0)
    return sp.csr_matrix((values, (rows, face.reshape(-1))),
                         shape=(len(face), num_vertices))
