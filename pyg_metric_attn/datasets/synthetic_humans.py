r"""Procedural humanoid meshes labelled by body part (the offline stand-in for
the human segmentation benchmark).

Each figure is the smooth union of capsules (head, torso with shoulder and hip
girdles, upper and lower arms, hands, upper and lower legs, feet) with random
proportions and joint angles. Its signed distance is meshed by marching cubes
(scikit-image) and simplified by quadric decimation (fast-simplification) to
1500-2500 faces; each face takes the part of the nearest capsule at its
centroid. Parts blend into one watertight connected surface, so the part
boundaries are not visible in the connectivity.
"""
from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from tqdm.auto import tqdm

from pyg_metric_attn.datasets.mesh_dataset import SPAWN, MeshDataset
from pyg_metric_attn.geometry.mesh import edge_face_counts
from pyg_metric_attn.utils.optional import needs_extra

with needs_extra('mesh'):
    import fast_simplification
    from skimage.measure import marching_cubes

#: The 8 labels in the order of their ids, the order of the human
#: segmentation benchmark's parts 1..8 (see ``HumanSegmentation``).
BODY_PARTS = ('head', 'hand', 'lower_arm', 'upper_arm', 'torso', 'upper_leg',
              'lower_leg', 'foot')
HEAD, HAND, LOWER_ARM, UPPER_ARM, TORSO, UPPER_LEG, LOWER_LEG, FOOT = range(8)


def _rotation(axis: np.ndarray, angle: float) -> np.ndarray:
    """Rodrigues' rotation matrix about ``axis`` by ``angle`` radians."""
    axis = np.asarray(axis, dtype=np.float64) / np.linalg.norm(axis)
    k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]],
                  [-axis[1], axis[0], 0]])
    return np.eye(3) + np.sin(angle) * k + (1 - np.cos(angle)) * k @ k


def humanoid_capsules(rng: np.random.Generator) -> list[tuple]:
    """Random ``(start, end, radius, label)`` capsules of one figure (y up,
    facing +z, about 1.8 units tall)."""
    def vary(value: float, spread: float = 0.12) -> float:
        return value * rng.uniform(1 - spread, 1 + spread)

    def deg(low: float, high: float) -> float:
        return np.deg2rad(rng.uniform(low, high))

    down = np.array([0.0, -1.0, 0.0])
    x_axis, z_axis = np.array([1.0, 0, 0]), np.array([0, 0, 1.0])
    hip_y = vary(0.95, 0.05)
    torso_top = hip_y + vary(0.5)
    torso_radius = vary(0.13)
    capsules = [((0, hip_y, 0), (0, torso_top, 0), torso_radius, TORSO)]
    shoulder_x, hip_x = vary(0.19), vary(0.1)
    capsules.append(((-shoulder_x, torso_top - 0.03, 0),
                     (shoulder_x, torso_top - 0.03, 0), vary(0.07), TORSO))
    capsules.append(((-hip_x, hip_y, 0), (hip_x, hip_y, 0), vary(0.1), TORSO))
    head_radius = vary(0.1)
    neck = np.array([0, torso_top + torso_radius * 0.7, 0])
    head_dir = _rotation(rng.normal(size=3), deg(0, 25)) @ -down
    head_start = neck + head_dir * head_radius
    capsules.append((head_start, head_start + head_dir * vary(0.08), head_radius,
                     HEAD))
    for side in (-1.0, 1.0):
        # Arm: abduction about z, flexion about x, elbow and wrist bends.
        turn = (_rotation(x_axis, -deg(-40, 70))
                @ _rotation(z_axis, side * deg(10, 100)))
        shoulder = np.array([side * shoulder_x, torso_top - 0.03, 0])
        elbow = shoulder + turn @ down * vary(0.29)
        forearm = turn @ _rotation(x_axis, -deg(0, 110))
        wrist = elbow + forearm @ down * vary(0.26)
        hand = forearm @ _rotation(rng.normal(size=3), deg(0, 30))
        capsules += [(shoulder, elbow, vary(0.05), UPPER_ARM),
                     (elbow, wrist, vary(0.04), LOWER_ARM),
                     (wrist, wrist + hand @ down * vary(0.1), vary(0.04), HAND)]
        # Leg: hip flexion and abduction, knee bend, foot pointing forward.
        turn = (_rotation(x_axis, -deg(-25, 70))
                @ _rotation(z_axis, side * deg(0, 25)))
        hip = np.array([side * hip_x, hip_y, 0])
        knee = hip + turn @ down * vary(0.43)
        shin = turn @ _rotation(x_axis, deg(0, 100))
        ankle = knee + shin @ down * vary(0.42)
        foot = shin @ _rotation(x_axis, deg(-20, 20)) @ z_axis
        capsules += [(hip, knee, vary(0.08), UPPER_LEG),
                     (knee, ankle, vary(0.055), LOWER_LEG),
                     (ankle, ankle + foot * vary(0.17), vary(0.045), FOOT)]
    return [(np.asarray(a, float), np.asarray(b, float), r, label)
            for a, b, r, label in capsules]


def capsule_distances(points: np.ndarray, capsules: list[tuple]) -> np.ndarray:
    r"""Signed distances ``[N, C]`` of points to each capsule,
    :math:`\|p - \mathrm{proj}_{[a, b]}(p)\| - r`."""
    out = np.empty((len(points), len(capsules)), dtype=points.dtype)
    for i, (a, b, radius, _) in enumerate(capsules):
        a, ab = a.astype(points.dtype), (b - a).astype(points.dtype)
        offset = points - a
        t = np.clip(offset @ ab / max(float(ab @ ab), 1e-12), 0.0, 1.0)
        offset -= t[:, None] * ab
        out[:, i] = np.sqrt(np.einsum('ij,ij->i', offset, offset)) - radius
    return out


def _largest_component(pos: np.ndarray, face: np.ndarray
                       ) -> tuple[np.ndarray, np.ndarray]:
    """The largest vertex-connected component, unreferenced vertices dropped."""
    n = len(pos)
    graph = coo_matrix((np.ones(3 * len(face)),
                        (face.reshape(-1), np.roll(face, 1, axis=1).reshape(-1))),
                       shape=(n, n))
    _, component = connected_components(graph, directed=False)
    keep_face = component[face[:, 0]] == np.bincount(component[face[:, 0]]).argmax()
    face = face[keep_face]
    used = np.unique(face)
    remap = np.full(n, -1)
    remap[used] = np.arange(len(used))
    return pos[used], remap[face]


def synthetic_human(rng: np.random.Generator, resolution: float = 0.02,
                    smoothness: float = 0.015, target_faces: int | None = None,
                    max_tries: int = 5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One watertight, connected humanoid: ``(pos [V, 3], face [F, 3],
    face_labels [F])``."""
    for _ in range(max_tries):
        capsules = humanoid_capsules(rng)
        ends = np.concatenate([np.stack([a, b]) for a, b, _, _ in capsules])
        margin = max(c[2] for c in capsules) + 3 * resolution
        low, high = ends.min(0) - margin, ends.max(0) + margin
        axes = [np.arange(lo, hi, resolution) for lo, hi in zip(low, high,
                                                                  strict=True)]
        grid = np.stack(np.meshgrid(*axes, indexing='ij'),
                        axis=-1).reshape(-1, 3).astype(np.float32)
        distances = capsule_distances(grid, capsules)
        smooth_union = -smoothness * np.log(np.exp(
            -(distances - distances.min(1, keepdims=True)) / smoothness).sum(1)
        ) + distances.min(1)
        volume = smooth_union.reshape([len(a) for a in axes])
        pos, face, _, _ = marching_cubes(volume, 0.0, spacing=(resolution,) * 3)
        pos, face = _largest_component(pos + low, face)
        target = target_faces or int(rng.integers(1500, 2501))
        pos, face = fast_simplification.simplify(pos, face,
                                                 target_count=target)
        pos, face = _largest_component(pos, face.astype(np.int64))
        if (edge_face_counts(face) == 2).all():
            centroids = pos[face].mean(axis=1)
            nearest = capsule_distances(centroids, capsules).argmin(axis=1)
            labels = np.array([c[3] for c in capsules])[nearest]
            return pos, face, labels
    raise RuntimeError(f"No watertight humanoid after {max_tries} tries")


def _generate(seed: int, split_id: int, index: int) -> dict[str, Any]:
    rng = np.random.default_rng([seed, split_id, index])
    pos, face, labels = synthetic_human(rng)
    return dict(pos=pos, face=face, face_labels=labels,
                name=f'synthetic_{seed}_{split_id}_{index:04d}')


class SyntheticHumans(MeshDataset):
    r"""``num_meshes`` procedural humanoids (see the module docstring), 8 part
    labels :data:`BODY_PARTS` per face; needs no download.

    Mesh ``i`` of a split is drawn from ``numpy.random.default_rng([seed,
    split_id, i])`` (``split_id`` 0 for ``'train'``, 1 for ``'test'``), so the
    splits never share a figure and a mesh does not depend on ``num_meshes``.

    Args:
        root (str): Folder for the processed files.
        split (str): ``'train'`` or ``'test'``.
        num_meshes (int): Number of figures. (default: :obj:`100`)
        seed (int): Seed of the whole set. (default: :obj:`0`)
        **kwargs: see :class:`~pyg_metric_attn.datasets.mesh_dataset.MeshDataset`.
    """
    def __init__(self, root: str, split: str = 'train', num_meshes: int = 100,
                 seed: int = 0, **kwargs: Any):
        if split not in ('train', 'test'):
            raise ValueError(f"'split' must be 'train' or 'test', got '{split}'")
        if num_meshes < 1:
            raise ValueError(f"'num_meshes' must be positive, got {num_meshes}")
        self.split = split
        self.num_meshes = num_meshes
        self.seed = seed
        super().__init__(root, **kwargs)

    @property
    def processed_file_names(self) -> list[str]:
        return [f'{self.split}_{self.num_meshes}_seed{self.seed}.pt']

    def raw_meshes(self) -> Iterator[dict[str, Any]]:
        split_id = ('train', 'test').index(self.split)
        args = ([self.seed] * self.num_meshes, [split_id] * self.num_meshes,
                range(self.num_meshes))
        if self.num_workers > 1:
            with ProcessPoolExecutor(self.num_workers,
                                     mp_context=SPAWN) as pool:
                yield from tqdm(pool.map(_generate, *args), total=self.num_meshes,
                                desc='generating humanoids', disable=not self.log)
        else:
            yield from map(_generate, *args)
