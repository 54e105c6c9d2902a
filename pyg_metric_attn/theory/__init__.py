"""The paper's theory as tools: manifolds with known Laplace-Beltrami
operators, the heat-kernel limit of attention propagation, and rank collapse
with depth."""
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
from pyg_metric_attn.theory.rank_collapse import (
    rank_one_residual,
    residuals_through_depth,
)

__all__ = ['MANIFOLDS', 'ManifoldSample', 'circle', 'log_log_slope',
           'propagation_generator', 'rank_one_residual', 'relative_error',
           'residuals_through_depth', 'sphere', 'torus']
