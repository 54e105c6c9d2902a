r"""The same surface made differently: remeshed (loop subdivision,
decimation), deformed (anisotropic scaling, vertex jitter), posed (a
rotation) or numbered (a renumbering), each with the correspondence that
carries labels from the original's faces to the new mesh's.

Meshes are ``(pos [V, 3] float, face [F, 3] int)`` NumPy arrays, as in
:mod:`pyg_metric_attn.geometry.mesh`.
"""
from __future__ import annotations

import numpy as np
import torch
from scipy.spatial import cKDTree

from pyg_metric_attn.geometry.mesh import MeshError, renumber_mesh
from pyg_metric_attn.geometry.rotation import random_rotation
from pyg_metric_attn.utils.optional import needs_extra

#: The perturbations of :func:`perturb_mesh`, in the order results list them.
PERTURBATIONS = ('subdivision', 'decimation', 'anisotropic_scaling', 'jitter',
                 'rotation', 'renumbering')
#: The version of each perturbation's meshes and correspondence, raised where
#: they change so that no cache of the older ones is read (subdivision 2: the
#: sources of the new faces are exact, no longer the nearest centroids).
PERTURBATION_VERSIONS = {**dict.fromkeys(PERTURBATIONS, 1), 'subdivision': 2}
#: The perturbations that draw nothing at random: every seed makes the same
#: copy, so one draw of them is all there is to score.
DETERMINISTIC_PERTURBATIONS = frozenset({'subdivision'})
#: Share of the faces decimation keeps, drawn uniformly per mesh.
DECIMATION_KEPT = (0.5, 0.7)
#: Largest stretch of the anisotropic scaling (of one random axis).
MAX_STRETCH = 1.3
#: RMS vertex displacement of the jitter, a share of the bounding box diagonal.
JITTER = 0.01


def distinct_copy_seeds(kind: str, seed: int, copies: int) -> list[int]:
    """The seeds of ``copies`` distinct copies of a mesh perturbed by
    ``kind``, from ``seed`` on: only ``[seed]`` for one of
    :data:`DETERMINISTIC_PERTURBATIONS`, whose every seed makes the same
    copy."""
    if kind in DETERMINISTIC_PERTURBATIONS:
        return [seed]
    return list(range(seed, seed + copies))


def loop_subdivision(pos: np.ndarray, face: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One step of Loop subdivision (trimesh): every triangle split in four,
    vertices moved by Loop's smoothing weights. Returns ``(pos, face,
    source_face)``, ``source_face[f]`` the original face that face ``f``
    was split from (exact: trimesh writes the four faces of original face
    ``i`` as rows ``4i`` to ``4i + 3``, checked here)."""
    with needs_extra('mesh'):
        import trimesh
    new_pos, new_face = trimesh.remesh.subdivide_loop(pos, face, iterations=1)
    new_face = np.asarray(new_face, np.int64)
    source = np.repeat(np.arange(len(face)), 4)
    # Rows 4i, 4i + 1, 4i + 2 hold the corners of face i, in its order.
    if len(new_face) != 4 * len(face) or not np.array_equal(
            new_face.reshape(-1, 4, 3)[:, [0, 1, 2], [0, 1, 2]], face):
        raise RuntimeError("trimesh's subdivide_loop no longer writes the four "
                           "faces of face i as rows 4i to 4i + 3: the faces' "
                           "sources cannot be read off")
    return np.asarray(new_pos, dtype=np.float64), new_face, source


def decimate(pos: np.ndarray, face: np.ndarray,
             kept: float) -> tuple[np.ndarray, np.ndarray]:
    """Quadric decimation (fast-simplification) to about ``kept`` of the
    faces; vertices no face uses any more are dropped."""
    if not 0 < kept <= 1:
        raise ValueError(f"'kept' must be in (0, 1], got {kept}")
    with needs_extra('mesh'):
        import fast_simplification
    new_pos, new_face = fast_simplification.simplify(
        np.ascontiguousarray(pos, dtype=np.float64),
        np.ascontiguousarray(face, dtype=np.int64), target_reduction=1 - kept)
    used, new_face = np.unique(np.asarray(new_face, np.int64),
                               return_inverse=True)
    return np.asarray(new_pos)[used], new_face.reshape(-1, 3)


def nearest_faces(pos: np.ndarray, face: np.ndarray, new_pos: np.ndarray,
                  new_face: np.ndarray) -> np.ndarray:
    """For every face of the new mesh, the face of the original ``(pos,
    face)`` whose centroid is nearest to its centroid, ``[F_new]``."""
    centroids = pos[face].mean(axis=1)
    _, nearest = cKDTree(centroids).query(new_pos[new_face].mean(axis=1))
    return np.asarray(nearest, dtype=np.int64)


def perturb_mesh(pos: np.ndarray, face: np.ndarray, kind: str,
                 rng: np.random.Generator
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    r"""The mesh ``(pos, face)`` perturbed by ``kind``, one of
    :data:`PERTURBATIONS`, with random draws from ``rng``:

    * ``'subdivision'``: one step of :func:`loop_subdivision` (four times the
      faces, each in the face it was split from);
    * ``'decimation'``: :func:`decimate` to a share of the faces drawn
      uniformly from :data:`DECIMATION_KEPT`;
    * ``'anisotropic_scaling'``: one random coordinate axis stretched by a
      factor drawn uniformly from :math:`[1,` :data:`MAX_STRETCH`:math:`]`;
    * ``'jitter'``: every vertex moved by Gaussian noise of RMS length
      :data:`JITTER` times the bounding box diagonal (standard deviation
      :math:`0.01\,d/\sqrt3` per coordinate);
    * ``'rotation'``: a uniformly random rotation of :math:`SO(3)`;
    * ``'renumbering'``: :func:`~pyg_metric_attn.geometry.renumber_mesh`
      (vertices, faces and face corners in random order).

    Returns ``(pos, face, source_face)``: ``source_face[f]`` is the face of
    the original that face ``f`` of the new mesh stems from, for carrying
    labels and comparing predictions: exact where the connectivity is kept
    (the face itself; renumbering: its old number) or refined (subdivision:
    the face it was split from), else (decimation) the face with the nearest
    centroid (:func:`nearest_faces`).
    """
    pos = np.asarray(pos, dtype=np.float64)
    face = np.asarray(face, dtype=np.int64)
    same_faces = np.arange(len(face))
    if kind == 'subdivision':
        return loop_subdivision(pos, face)
    if kind == 'decimation':
        new_pos, new_face = decimate(pos, face, rng.uniform(*DECIMATION_KEPT))
        if len(new_face) == 0:
            raise MeshError(f"decimation left no faces of {len(face)}")
        return new_pos, new_face, nearest_faces(pos, face, new_pos, new_face)
    if kind == 'anisotropic_scaling':
        stretch = np.ones(3)
        stretch[rng.integers(3)] = rng.uniform(1, MAX_STRETCH)
        return pos * stretch, face, same_faces
    if kind == 'jitter':
        diagonal = np.linalg.norm(pos.max(axis=0) - pos.min(axis=0))
        noise = rng.normal(0, JITTER * diagonal / np.sqrt(3), pos.shape)
        return pos + noise, face, same_faces
    if kind == 'rotation':
        generator = torch.Generator().manual_seed(int(rng.integers(2 ** 62)))
        return pos @ random_rotation(generator).numpy().T, face, same_faces
    if kind == 'renumbering':
        new_pos, new_face, _, face_order = renumber_mesh(pos, face, rng)
        return new_pos, new_face, face_order
    raise ValueError(f"Unknown perturbation '{kind}'; expected one of "
                     f"{', '.join(PERTURBATIONS)}")
