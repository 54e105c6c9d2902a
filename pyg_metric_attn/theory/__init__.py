"""The paper's theory as tools: manifolds with known Laplace-Beltrami
operators and the heat-kernel limit of attention propagation."""
from pyg_metric_attn.theory.heat_limit import (
    log_log_slope,
    propagation_generator,
    relative_error,
)
from pyg_metric_attn.theory.manifolds import (
    MANIFOLDS,
    ManifoldSample,
    circle,
    sphere,
    torus,
)

__all__ = ['MANIFOLDS', 'ManifoldSample', 'circle', 'log_log_slope',
           'propagation_generator', 'relative_error', 'sphere', 'torus']
