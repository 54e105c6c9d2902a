"""HeatDiffusion against the dense matrix exponential of the mesh Laplacian."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import torch
import trimesh

from pyg_metric_attn.geometry import laplacian
from pyg_metric_attn.nn import HeatDiffusion


def full_eigenbasis(subdivisions: int, scale: float = 1.0):
    """``(L, mass, evals, evecs)`` of an icosphere in float64, all pairs."""
    mesh = trimesh.creation.icosphere(subdivisions)
    L, mass, _ = laplacian(np.asarray(mesh.vertices) * scale,
                           np.asarray(mesh.faces), 'cotan')
    L = L.toarray()
    evals, evecs = scipy.linalg.eigh(L, np.diag(mass))  # M-orthonormal
    return L, mass, evals, evecs


def test_full_basis_equals_matrix_exponential():
    L, mass, evals, evecs = full_eigenbasis(1)  # 42 vertices
    diffusion = HeatDiffusion(3, min_time=0.05, max_time=0.5).double()
    h = torch.randn(len(mass), 3, dtype=torch.float64)
    out = diffusion(h, torch.from_numpy(evecs), torch.from_numpy(evals)[None],
                    torch.from_numpy(mass))
    times = diffusion.log_time.exp().detach().numpy()
    assert np.allclose(times, [0.05, np.sqrt(0.05 * 0.5), 0.5])
    for c, t in enumerate(times):
        # dh/dt = -M^{-1} L h
        expected = scipy.linalg.expm(-t * L / mass[:, None]) @ h[:, c].numpy()
        assert np.allclose(out[:, c].detach().numpy(), expected, atol=1e-10)


def test_batched_meshes_diffuse_independently():
    small, large = full_eigenbasis(1), full_eigenbasis(2, scale=2.0)
    m = 30  # truncated basis
    diffusion = HeatDiffusion(4).double()
    inputs = [(torch.randn(len(mass), 4, dtype=torch.float64),
               torch.from_numpy(evecs[:, :m]), torch.from_numpy(evals[None, :m]),
               torch.from_numpy(mass)) for _, mass, evals, evecs in (small, large)]
    separate = [diffusion(*args) for args in inputs]
    batch = torch.cat([torch.full((len(args[3]), ), i) for i, args in
                       enumerate(inputs)])
    joint = diffusion(*(torch.cat(parts) for parts in zip(*inputs, strict=True)),
                      batch=batch)
    assert torch.allclose(joint, torch.cat(separate), atol=1e-12)
    # Truncation is a low-pass filter: diffusion conserves the total heat
    # (the constant eigenvector carries it) and never increases the energy.
    h, evecs, evals, mass = inputs[1]
    out = separate[1]
    assert torch.allclose(mass @ out, mass @ h, rtol=1e-8)
    assert ((mass[:, None] * out ** 2).sum(0) <= (mass[:, None] * h ** 2).sum(0)).all()


def test_times_are_learned_and_bad_shapes_are_named():
    _, mass, evals, evecs = full_eigenbasis(1)
    diffusion = HeatDiffusion(2)
    args = (torch.from_numpy(evecs).float(), torch.from_numpy(evals)[None].float(),
            torch.from_numpy(mass).float())
    diffusion(torch.randn(len(mass), 2), *args).square().sum().backward()
    assert diffusion.log_time.grad is not None
    assert diffusion.log_time.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="'evals' must have shape"):
        diffusion(torch.randn(len(mass), 2), args[0], args[1][0], args[2])
    with pytest.raises(ValueError, match="'h' must have shape"):
        diffusion(torch.randn(len(mass), 3), *args)
    with pytest.raises(ValueError, match="'mass' must have shape"):
        diffusion(torch.randn(len(mass), 2), *args[:2], args[2][:-1])
    with pytest.raises(ValueError, match="min_time"):
        HeatDiffusion(2, min_time=1.0, max_time=0.1)
    assert 'min_time=0.001' in repr(diffusion)
