r"""Taubin's :math:`\lambda|\mu` smoothing of mesh positions: a low-pass
filter of the surface that removes vertex noise without the shrinkage of
Laplacian smoothing (Taubin, "A signal processing approach to fair surface
design", SIGGRAPH 1995)."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from pyg_metric_attn.geometry.mesh import mesh_edges

#: The most a round of :func:`taubin_smoothing` may amplify a frequency of
#: its pass band, :math:`(1 - \lambda k_{PB}/2)(1 - \mu k_{PB}/2)` at its
#: peak (1.0006 for the defaults).
MAX_PASS_BAND_GAIN = 1.1


def smoothing_rounds(value: object, name: str = 'steps') -> int:
    """``value`` as a number of smoothing rounds (a Python or numpy integer,
    at least 0, not a bool); a :class:`ValueError` naming ``name``
    otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) \
            or value < 0:
        raise ValueError(f"'{name}' must be a non-negative integer, got {value!r}")
    return int(value)


def umbrella_operator(face: np.ndarray, num_vertices: int) -> sp.csr_matrix:
    r""":math:`W` ``[V, V]``, the mean over each vertex's one-ring
    neighbours (:math:`W_{ij} = 1 / \deg i` for every mesh edge
    :math:`ij`); a vertex on no edge is its own mean (:math:`W_{ii} = 1`),
    so that smoothing keeps its position."""
    edges, _ = mesh_edges(face)
    edges = edges[edges[:, 0] != edges[:, 1]]
    rows = np.concatenate([edges[:, 0], edges[:, 1]])
    cols = np.concatenate([edges[:, 1], edges[:, 0]])
    adjacency = sp.csr_matrix((np.ones(len(rows)), (rows, cols)),
                              shape=(num_vertices, num_vertices))
    degree = np.asarray(adjacency.sum(axis=1)).ravel()
    inverse = np.divide(1.0, degree, out=np.zeros_like(degree), where=degree > 0)
    return (sp.diags(inverse) @ adjacency
            + sp.diags((degree == 0).astype(np.float64))).tocsr()


def taubin_smoothing(pos: np.ndarray, face: np.ndarray, steps: int,
                     lam: float = 0.5, pass_band: float = 0.1) -> np.ndarray:
    r"""``steps`` rounds of a shrinking and an inflating umbrella step,

    .. math::
        p \leftarrow p + \lambda (W p - p), \qquad
        p \leftarrow p + \mu (W p - p), \qquad
        \frac{1}{\lambda} + \frac{1}{\mu} = k_{PB},

    with :math:`W` the :func:`umbrella_operator` and :math:`\mu < -\lambda`
    set by the pass-band frequency :math:`k_{PB}` = ``pass_band``: surface
    frequencies (eigenvalues :math:`k \in [0, 2]` of :math:`I - W`) below
    it pass nearly unchanged, vertex noise, at the upper end of the
    spectrum, is damped by :math:`|(1 - \lambda k)(1 - \mu k)|` per round.
    Settings that would amplify the highest frequency (a gain at
    :math:`k = 2` below :math:`-1`) or the pass band by more than
    :data:`MAX_PASS_BAND_GAIN` per round are rejected (Taubin's paper uses
    :math:`k_{PB}` of 0.01 to 0.1). Returns the new positions ``[V, 3]``
    (float64); ``steps=0`` returns a copy."""
    steps = smoothing_rounds(steps)
    if not 0 < lam < 1:
        raise ValueError(f"'lam' must lie in (0, 1), got {lam!r}")
    if not 0 < pass_band < 1 / lam:
        raise ValueError(f"'pass_band' must lie in (0, 1/lam = {1 / lam:g}), "
                         f"got {pass_band!r}")
    mu = 1.0 / (pass_band - 1.0 / lam)
    top_gain = (1 - 2 * lam) * (1 - 2 * mu)
    peak_gain = (1 - lam * pass_band / 2) * (1 - mu * pass_band / 2)
    if top_gain <= -1 or peak_gain > MAX_PASS_BAND_GAIN:
        raise ValueError(
            f"lam={lam!r}, pass_band={pass_band!r} (mu={mu:.3g}) would amplify "
            f"the surface instead of smoothing it: a round multiplies the "
            f"highest frequency by {top_gain:.3g} and the pass band by up to "
            f"{peak_gain:.3g} (allowed: above -1, at most "
            f"{MAX_PASS_BAND_GAIN})")
    pos = np.array(pos, dtype=np.float64)
    if steps == 0:
        return pos
    umbrella = umbrella_operator(np.asarray(face), len(pos))
    for _ in range(steps):
        pos = pos + lam * (umbrella @ pos - pos)
        pos = pos + mu * (umbrella @ pos - pos)
    return pos
