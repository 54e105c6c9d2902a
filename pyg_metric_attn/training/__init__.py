"""Training loop shared by every task."""
from pyg_metric_attn.training.schedules import WarmupCosine, warmup_cosine
from pyg_metric_attn.training.trainer import Trainer, load_best_model, seed_everything

__all__ = ['Trainer', 'WarmupCosine', 'load_best_model', 'seed_everything',
           'warmup_cosine']
