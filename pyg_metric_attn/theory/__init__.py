"""The paper's theory as tools: manifolds with known Laplace-Beltrami
operators, the heat-kernel limit of attention propagation (with the target of
the metric induced by a learned map), and rank collapse with depth."""
from pyg_metric_attn.theory.heat_limit import (
    log_log_slope,
    propagation_generator,
    relative_error,
    relative_rms,
)
from pyg_metric_attn.theory.induced_metric import (
    induced_drift_diffusion,
    pullback_metric,
)
from pyg_metric_attn.theory.manifolds import (
    MANIFOLDS,
    Chart,
    ManifoldSample,
    circle,
    sphere,
    torus,
)
from pyg_metric_attn.theory.rank_collapse import (
    rank_one_residual,
    residuals_through_depth,
)

__all__ = ['MANIFOLDS', 'Chart', 'ManifoldSample', 'circle',
           'induced_drift_diffusion', 'log_log_slope', 'propagation_generator',
           'pullback_metric', 'rank_one_residual', 'relative_error',
           'relative_rms', 'residuals_through_depth', 'sphere', 'torus']
