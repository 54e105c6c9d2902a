r"""Laplacian eigenpairs and heat kernel signatures (as in DiffusionNet)."""
from __future__ import annotations

import numpy as np
import scipy.linalg
import scipy.sparse as sp
import scipy.sparse.linalg as sla

from pyg_metric_attn.geometry.mesh import MeshError


def eigendecomposition(L: sp.spmatrix, mass: np.ndarray, k: int = 128,
                       name: str = 'mesh', eps: float = 1e-8,
                       max_retries: int = 4) -> tuple[np.ndarray, np.ndarray]:
    r"""The ``k`` smallest generalised eigenpairs :math:`L \phi = \lambda M
    \phi` with :math:`M = \mathrm{diag}(\text{mass})`, eigenvectors
    :math:`M`-orthonormal, ``([k], [V, k])``.

    Uses shift-invert ``eigsh`` around :math:`\sigma = \varepsilon` on
    :math:`L + \varepsilon I`; where the factorisation fails, the diagonal
    shift grows tenfold and it retries (DiffusionNet's recipe). Meshes with at
    most ``k + 1`` vertices are solved densely and return all ``V`` pairs.
    Eigenvalues are clipped at zero; ARPACK starts from a fixed vector, so
    the result is reproducible.
    """
    num_vertices = L.shape[0]
    if not (np.isfinite(mass).all() and (mass > 0).all()):
        raise MeshError(f"{name}: the mass matrix has zero or non-finite vertex "
                        f"areas; the generalised eigenproblem is undefined")
    identity = sp.identity(num_vertices, format='csr')
    M = sp.diags(mass).tocsc()
    if k >= num_vertices - 1:
        evals, evecs = scipy.linalg.eigh((L + eps * identity).toarray(),
                                         M.toarray())
        return np.clip(evals, 0.0, None), evecs
    shifted = (L + eps * identity).tocsc()
    start = np.ones(num_vertices)  # a fixed start vector: reproducible results
    for attempt in range(max_retries + 1):
        try:
            evals, evecs = sla.eigsh(shifted, k=k, M=M, sigma=eps, v0=start)
            break
        except (RuntimeError, sla.ArpackError) as error:
            if attempt == max_retries:
                raise MeshError(f"{name}: the eigendecomposition failed after "
                                f"{max_retries} regularised retries ({error})"
                                ) from error
            shifted = shifted + identity * (eps * 10 ** (attempt + 1))
    order = np.argsort(evals)
    return np.clip(evals[order], 0.0, None), evecs[:, order]


#: The shortest HKS time by default (DiffusionNet's).
HKS_MIN_TIME = 1e-2


def hks_times(count: int = 16, min_time: float = HKS_MIN_TIME) -> np.ndarray:
    """``count`` diffusion times log-spaced in :math:`[t_{min}, 1]`
    (``min_time`` :math:`= 10^{-2}`: DiffusionNet's automatic scales, for
    shapes of unit radius; longer shortest times weigh the upper end of a
    coarse mesh's spectrum less)."""
    if not 0 < min_time < 1:
        raise ValueError(f"'min_time' must lie in (0, 1), got {min_time!r}")
    return np.logspace(np.log10(min_time), 0.0, num=count)


def heat_kernel_signature(evals: np.ndarray, evecs: np.ndarray,
                          times: np.ndarray | int = 16) -> np.ndarray:
    r"""Heat kernel signatures :math:`h(v, t) = \sum_k e^{-\lambda_k t}
    \phi_k(v)^2`, ``[V, len(times)]`` (``times`` an int: :func:`hks_times`)."""
    if isinstance(times, (int, np.integer)):
        times = hks_times(int(times))
    decay = np.exp(-np.outer(times, evals))  # [S, K]
    return np.square(evecs) @ decay.T
