"""Training loop shared by every task."""
from pyg_metric_attn.training.trainer import Trainer, load_best_model, seed_everything

__all__ = ['Trainer', 'load_best_model', 'seed_everything']
